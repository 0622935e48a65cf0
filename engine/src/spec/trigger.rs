//! `triggers:` — what starts a workflow when `archon serve` holds it: a `cron` schedule in a time zone, or
//! a signed `webhook` delivery. Cron expressions and time zone names are read once, when the spec is read
//! (like durations): validation reports the ones that do not read, and the scheduler uses the values.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::OnceLock;

use indexmap::IndexMap;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::values::as_text;
use super::{Duration, Node, Spanned};

/// What starts the workflow under `archon serve`: exactly one of `cron` and `webhook`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerDef {
    /// A stable name for the trigger's firing records (a slug). Default: the cron expression and its
    /// time zone (`0 9 * * MON-FRI Europe/Paris`), or `webhook`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Spanned<String>>,
    /// A schedule: five fields, `minute hour day-of-month month day-of-week` (`0 9 * * MON-FRI`), or
    /// `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<Spanned<CronText>>,
    /// For `cron`: the IANA time zone the schedule reads in (`Europe/Paris`); default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<Spanned<TimeZoneText>>,
    /// For `cron`: what a firing does while the run it started last is still going: `skip` (default),
    /// `queue` (start after it) or `cancel_previous`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Spanned<Overlap>>,
    /// For `cron`: how far back (`2h`, at most `7d`) the slots missed while no server ran are fired
    /// when one starts, each once. Default: none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<Duration>,
    /// A delivery to `POST /hooks/<workflow>`, signed with a secret or carrying a bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<Spanned<WebhookDef>>,
    /// Values of the workflow's inputs for the runs the trigger starts (plain values, not templates),
    /// checked against the inputs' schemas.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    #[schemars(schema_with = "input_values_schema")]
    pub inputs: IndexMap<Spanned<String>, Node>,
}

/// How a webhook delivery is authenticated, and which input its body becomes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookDef {
    /// A secret of `secrets`: the delivery carries `X-Archon-Signature: sha256=<hex>` (or GitHub's
    /// `X-Hub-Signature-256`), the HMAC-SHA256 of its raw body under the secret's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Spanned<String>>,
    /// A secret of `secrets`: the delivery carries `Authorization: Bearer <value>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Spanned<String>>,
    /// The input the delivery's JSON body becomes, checked against the input's schema. Without it the
    /// body is not read into the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Spanned<String>>,
}

/// What a cron firing does while the run the trigger started last is still going.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// The firing is recorded as skipped; no run starts.
    #[default]
    Skip,
    /// The run starts when the runs before it have ended.
    Queue,
    /// The running run is cancelled and the new one starts.
    CancelPrevious,
}

impl Overlap {
    /// The name the spec writes.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Queue => "queue",
            Overlap::CancelPrevious => "cancel_previous",
        }
    }
}

/// The longest `catch_up` window.
pub const MAX_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

impl TriggerDef {
    /// The trigger's name: `name`, else the cron expression with its time zone, else `webhook`.
    pub fn name(&self) -> String {
        if let Some(name) = &self.name {
            return name.value.clone();
        }
        match &self.cron {
            Some(cron) => format!(
                "{} {}",
                cron.value.text.trim(),
                self.timezone
                    .as_ref()
                    .map_or("UTC", |tz| tz.value.text.as_str())
            ),
            None => "webhook".to_owned(),
        }
    }

    /// The time zone the schedule reads in (UTC unless `timezone` names one that exists).
    pub fn time_zone(&self) -> jiff::tz::TimeZone {
        self.timezone
            .as_ref()
            .and_then(|tz| tz.value.get().cloned())
            .unwrap_or(jiff::tz::TimeZone::UTC)
    }

    /// What a firing does while the previous run is still going.
    pub fn overlap(&self) -> Overlap {
        self.overlap.as_ref().map(|o| o.value).unwrap_or_default()
    }
}

/// The time zone database every schedule reads: the one built into archon, so that a schedule means the
/// same on every machine.
pub fn time_zones() -> &'static jiff::tz::TimeZoneDatabase {
    static DB: OnceLock<jiff::tz::TimeZoneDatabase> = OnceLock::new();
    DB.get_or_init(jiff::tz::TimeZoneDatabase::bundled)
}

/// An IANA time zone name as written, and the zone.
#[derive(Clone, Debug, Default)]
pub struct TimeZoneText {
    pub text: String,
    value: Option<jiff::tz::TimeZone>,
}

impl TimeZoneText {
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        let value = time_zones()
            .get(text.trim())
            .ok()
            // `Etc/Unknown` is the database's name for "no idea": not a zone a schedule can read in.
            .filter(|tz| !tz.is_unknown());
        TimeZoneText { text, value }
    }

    /// The zone; `None` for a name the database does not have (validation refuses it).
    pub fn get(&self) -> Option<&jiff::tz::TimeZone> {
        self.value.as_ref()
    }
}

/// A cron expression as written, and what it reads as (or why it does not read).
#[derive(Clone, Debug)]
pub struct CronText {
    pub text: String,
    value: Result<Cron, CronError>,
}

impl Default for CronText {
    fn default() -> Self {
        CronText::new("")
    }
}

impl CronText {
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        let value = Cron::parse(&text);
        CronText { text, value }
    }

    /// The schedule's fields; `None` for an expression validation refused.
    pub fn get(&self) -> Option<&Cron> {
        self.value.as_ref().ok()
    }

    /// Why the expression does not read.
    pub fn error(&self) -> Option<&CronError> {
        self.value.as_ref().err()
    }
}

/// Why a cron expression does not read: a message, a hint, and the bytes of the expression at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronError {
    pub message: String,
    pub hint: Option<String>,
    /// Where in the expression the problem is.
    pub range: Range<usize>,
}

/// The five fields of a cron expression, as the sets of values each matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cron {
    /// Bit `m` for minute `m` (0–59).
    minutes: u64,
    /// Bit `h` for hour `h` (0–23).
    hours: u32,
    /// Bit `d` for day of the month `d` (1–31).
    days: u32,
    /// Bit `m` for month `m` (1–12).
    months: u16,
    /// Bit `d` for day of the week `d` (0 Sunday – 6 Saturday).
    weekdays: u8,
    /// The day-of-month field is restricted (does not start with `*`).
    days_restricted: bool,
    /// The day-of-week field is restricted.
    weekdays_restricted: bool,
}

/// One field's name, range and value names.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
    /// The first name's value (names are consecutive from it).
    names_from: u32,
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
        names_from: 0,
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
        names_from: 0,
    },
    Field {
        name: "day of month",
        min: 1,
        max: 31,
        names: &[],
        names_from: 0,
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
        names: &[
            "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
        ],
        names_from: 1,
    },
    Field {
        name: "day of week",
        min: 0,
        max: 7,
        names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
        names_from: 0,
    },
];

/// The shorthands, and the five fields each stands for.
const MACROS: &[(&str, &str)] = &[
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

const FIVE_FIELDS: &str = "minute hour day-of-month month day-of-week, such as `0 9 * * MON-FRI`";

fn fail(message: impl Into<String>, hint: Option<String>, range: Range<usize>) -> CronError {
    CronError {
        message: message.into(),
        hint,
        range,
    }
}

impl Cron {
    /// Reads a five-field cron expression or a shorthand (`@daily`).
    pub fn parse(text: &str) -> Result<Cron, CronError> {
        let trimmed = text.trim();
        let lead = text.len() - text.trim_start().len();
        if let Some(rest) = trimmed.strip_prefix('@') {
            let whole = lead..lead + trimmed.len();
            if let Some((_, fields)) = MACROS
                .iter()
                .find(|(m, _)| m[1..].eq_ignore_ascii_case(rest))
            {
                return Cron::parse(fields).map_err(|e| CronError { range: whole, ..e });
            }
            let names: Vec<&str> = MACROS.iter().map(|(m, _)| *m).collect();
            let hint = if rest.eq_ignore_ascii_case("reboot") {
                Some("a server has no boot to fire at: use `catch_up` to fire missed slots when it starts".to_owned())
            } else {
                did_you_mean(trimmed, &names)
                    .or_else(|| Some(format!("the shorthands are {}", listed(&names))))
            };
            return Err(fail(
                format!("unknown cron shorthand `{trimmed}`"),
                hint,
                whole,
            ));
        }
        // Each field and where it is.
        let mut fields: Vec<(usize, &str)> = Vec::new();
        let mut at = 0;
        for part in text.split(|c: char| c.is_ascii_whitespace()) {
            if !part.is_empty() {
                fields.push((at, part));
            }
            at += part.len() + 1;
        }
        if fields.is_empty() {
            return Err(fail(
                "the cron expression is empty",
                Some(format!("write five fields: {FIVE_FIELDS}")),
                0..text.len(),
            ));
        }
        if fields.len() != 5 {
            let (start, end) = match fields.len() {
                n if n > 5 => (fields[5].0, fields[n - 1].0 + fields[n - 1].1.len()),
                n => (fields[0].0, fields[n - 1].0 + fields[n - 1].1.len()),
            };
            let hint = match fields.len() {
                6 | 7 => "seconds and years are not supported: archon's schedules have minute precision; write five fields: ".to_owned() + FIVE_FIELDS,
                _ => format!("write five fields: {FIVE_FIELDS}"),
            };
            return Err(fail(
                format!(
                    "a cron expression has 5 fields, this one has {}",
                    fields.len()
                ),
                Some(hint),
                start..end,
            ));
        }
        let mut sets = [0_u64; 5];
        for (index, (start, text)) in fields.iter().enumerate() {
            sets[index] = parse_field(&FIELDS[index], text, *start)?;
        }
        let weekdays = sets[4];
        // 7 is Sunday too.
        let weekdays = (weekdays | (weekdays >> 7)) & 0x7f;
        let cron = Cron {
            minutes: sets[0],
            hours: sets[1] as u32,
            days: sets[2] as u32,
            months: sets[3] as u16,
            weekdays: weekdays as u8,
            days_restricted: !fields[2].1.starts_with('*'),
            weekdays_restricted: !fields[4].1.starts_with('*'),
        };
        if cron.days_restricted && !cron.weekdays_restricted {
            let longest = (1..=12)
                .filter(|m| cron.months & (1 << m) != 0)
                .map(|m| match m {
                    2 => 29,
                    4 | 6 | 9 | 11 => 30,
                    _ => 31,
                })
                .max()
                .unwrap_or(31);
            let first = cron.days.trailing_zeros();
            if first > longest {
                let (start, text) = fields[2];
                return Err(fail(
                    format!("the schedule never fires: no month it names has a day {first}"),
                    Some(format!(
                        "the month field is `{}`; check the day of month and the month",
                        fields[3].1
                    )),
                    start..start + text.len(),
                ));
            }
        }
        Ok(cron)
    }

    /// Whether the schedule fires in month `month` (1–12).
    pub fn month(&self, month: i8) -> bool {
        (1..=12).contains(&month) && self.months & (1 << month) != 0
    }

    /// Whether the schedule fires on `date`: its day of the month and day of the week as cron reads them
    /// (when both fields are restricted, either one matching is enough).
    pub fn day(&self, date: jiff::civil::Date) -> bool {
        let by_day = self.days & (1 << date.day()) != 0;
        let by_weekday = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => by_day || by_weekday,
            _ => by_day && by_weekday,
        }
    }

    /// Whether the schedule fires in hour `hour` (0–23).
    pub fn hour(&self, hour: i8) -> bool {
        (0..24).contains(&hour) && self.hours & (1 << hour) != 0
    }

    /// Whether the schedule fires at minute `minute` (0–59).
    pub fn minute(&self, minute: i8) -> bool {
        (0..60).contains(&minute) && self.minutes & (1 << minute) != 0
    }

    /// The first hour at or after `hour` the schedule fires in, within the day.
    pub fn next_hour(&self, hour: i8) -> Option<i8> {
        let from = u32::try_from(hour).ok().filter(|h| *h < 24)?;
        let later = u64::from(self.hours) >> from << from;
        (later != 0).then(|| later.trailing_zeros() as i8)
    }

    /// The first minute at or after `minute` the schedule fires at, within the hour.
    pub fn next_minute(&self, minute: i8) -> Option<i8> {
        let from = u32::try_from(minute).ok().filter(|m| *m < 60)?;
        let later = self.minutes >> from << from;
        (later != 0).then(|| later.trailing_zeros() as i8)
    }
}

/// One field: items separated by commas, each `*`, `N`, `N-M`, with an optional `/STEP`.
fn parse_field(field: &Field, text: &str, offset: usize) -> Result<u64, CronError> {
    let mut set = 0_u64;
    let mut at = offset;
    for item in text.split(',') {
        let range = at..at + item.len();
        at += item.len() + 1;
        set |= parse_item(field, item, range)?;
    }
    Ok(set)
}

fn parse_item(field: &Field, item: &str, range: Range<usize>) -> Result<u64, CronError> {
    let name = field.name;
    if item.is_empty() {
        return Err(fail(
            format!("the {name} field has an empty item"),
            Some("separate values with single commas: `1,15`".to_owned()),
            range,
        ));
    }
    if let Some(c) = item.chars().find(|c| matches!(c, '?' | 'L' | 'W' | '#')) {
        let hint = match c {
            '?' => "`?` is Quartz's spelling of `*`: write `*`".to_owned(),
            _ => format!(
                "`{c}` (Quartz's last, weekday and nth-weekday forms) is not supported: list the days instead"
            ),
        };
        // Names such as `JUL` or `WED` hold these letters legitimately.
        if c == '?'
            || !field
                .names
                .iter()
                .any(|n| item.to_ascii_uppercase().contains(n))
        {
            return Err(fail(
                format!("`{item}` is not supported in the {name} field"),
                Some(hint),
                range,
            ));
        }
    }
    let (span, step) = match item.split_once('/') {
        Some((span, step)) => {
            let step_at = range.start + span.len() + 1..range.end;
            match step.parse::<u32>() {
                Ok(n) if n >= 1 && n <= field.max => (span, Some(n)),
                _ => {
                    return Err(fail(
                        format!(
                            "`/{step}` is not a step of the {name} field: steps run from 1 to {}",
                            field.max
                        ),
                        None,
                        step_at,
                    ));
                }
            }
        }
        None => (item, None),
    };
    let span_range = range.start..range.start + span.len();
    let (low, high) = if span == "*" {
        (
            field.min,
            field.max.min(if field.max == 7 { 6 } else { field.max }),
        )
    } else if let Some((a, b)) = span.split_once('-') {
        let low = value(field, a, range.start..range.start + a.len())?;
        let high_at = range.start + a.len() + 1..span_range.end;
        let high = value(field, b, high_at)?;
        if low > high {
            return Err(fail(
                format!("`{span}` in the {name} field runs backwards"),
                Some(format!(
                    "a range goes from its low value to its high one; to wrap around, list both parts: `{a}-{},{}-{b}`",
                    display(field, field.max),
                    display(field, field.min)
                )),
                span_range,
            ));
        }
        (low, high)
    } else {
        let single = value(field, span, span_range)?;
        // `N/STEP` runs from N to the field's end.
        match step {
            Some(_) => (single, field.max),
            None => (single, single),
        }
    };
    let step = step.unwrap_or(1);
    let mut set = 0_u64;
    let mut v = low;
    while v <= high {
        set |= 1 << v;
        v += step;
    }
    Ok(set)
}

/// How a value is written in a hint: the month and weekday fields by name.
fn display(field: &Field, v: u32) -> String {
    match field
        .names
        .get((v.saturating_sub(field.names_from)) as usize)
    {
        Some(name) if !field.names.is_empty() && v >= field.names_from => (*name).to_owned(),
        _ => v.to_string(),
    }
}

/// One value of a field: a number in its range, or a name (months and days of the week).
fn value(field: &Field, text: &str, range: Range<usize>) -> Result<u32, CronError> {
    let name = field.name;
    if let Ok(n) = text.parse::<u32>() {
        if n < field.min || n > field.max {
            return Err(fail(
                format!(
                    "{n} is out of range for the {name} field: it takes {} to {}",
                    field.min, field.max
                ),
                (field.max == 7).then(|| "0 and 7 are both Sunday".to_owned()),
                range,
            ));
        }
        return Ok(n);
    }
    let upper = text.to_ascii_uppercase();
    if let Some(index) = field.names.iter().position(|n| *n == upper) {
        return Ok(field.names_from + index as u32);
    }
    let hint = if field.names.is_empty() {
        Some(format!(
            "the {name} field takes numbers from {} to {}",
            field.min, field.max
        ))
    } else {
        did_you_mean(&upper, field.names).or_else(|| {
            Some(format!(
                "the {name} field takes numbers from {} to {} or the names {}",
                field.min,
                field.max,
                listed(field.names)
            ))
        })
    };
    Err(fail(
        format!("`{text}` is not a value of the {name} field"),
        hint,
        range,
    ))
}

/// "did you mean `x`?" for a name one typo from a candidate (as `validate::suggest` says it; the spec
/// reads cron expressions below validation, so it words its own).
fn did_you_mean(name: &str, candidates: &[&str]) -> Option<String> {
    let lower = name.to_lowercase();
    candidates
        .iter()
        .map(|c| (c, strsim::jaro_winkler(&lower, &c.to_lowercase())))
        .filter(|(_, score)| *score >= 0.8)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| format!("did you mean `{c}`?"))
}

/// "`a`, `b` and `c`".
fn listed(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

as_text!(CronText);
as_text!(TimeZoneText);

fn input_values_schema(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({
        "description": "Input values, by input name",
        "type": "object",
        "additionalProperties": true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> (String, Option<String>, String) {
        let e = Cron::parse(text).expect_err("refused");
        (e.message, e.hint, text[e.range].to_owned())
    }

    #[test]
    fn fields_read_as_sets() {
        let cron = Cron::parse("*/15 9-17 * JAN,jul MON-FRI").expect("reads");
        assert_eq!(cron.minutes, 1 | 1 << 15 | 1 << 30 | 1 << 45);
        assert_eq!(cron.hours, 0b11_1111_1110_0000_0000);
        assert_eq!(cron.months, 1 << 1 | 1 << 7);
        assert_eq!(cron.weekdays, 0b011_1110);
        assert!(!cron.days_restricted && cron.weekdays_restricted);
        // 7 is Sunday; `N/STEP` runs to the field's end.
        let sunday = Cron::parse("0 0 * * 7").expect("reads");
        assert_eq!(sunday.weekdays, 1);
        let steps = Cron::parse("5/20 0 * * *").expect("reads");
        assert_eq!(steps.minutes, 1 << 5 | 1 << 25 | 1 << 45);
        assert_eq!(Cron::parse("@daily"), Cron::parse("0 0 * * *"));
        assert_eq!(Cron::parse("@WEEKLY"), Cron::parse("0 0 * * SUN"));
    }

    #[test]
    fn each_mistake_names_its_field_and_place() {
        assert_eq!(
            error("0 24 * * *"),
            (
                "24 is out of range for the hour field: it takes 0 to 23".to_owned(),
                None,
                "24".to_owned()
            )
        );
        assert_eq!(
            error("0 9 * * MON-FRY"),
            (
                "`FRY` is not a value of the day of week field".to_owned(),
                Some("did you mean `FRI`?".to_owned()),
                "FRY".to_owned()
            )
        );
        assert_eq!(error("0 0 9 * * *").2, "*");
        assert_eq!(
            error("0 0 9 * * *").0,
            "a cron expression has 5 fields, this one has 6"
        );
        assert_eq!(error("0 9 * *").2, "0 9 * *");
        assert_eq!(error("*/0 * * * *").2, "0");
        assert_eq!(error("0 0 ? * MON").2, "?");
        assert_eq!(error("0 0 L * *").2, "L");
        assert_eq!(error("0 17-9 * * *").2, "17-9");
        assert_eq!(error("0 0 30 FEB *").2, "30");
        assert_eq!(error("0 0 1,,2 * *").2, "");
        assert_eq!(error("@reboot").2, "@reboot");
        assert_eq!(error("@dayly").1, Some("did you mean `@daily`?".to_owned()));
        // Names holding `L` or `W` are names, not Quartz forms.
        assert!(Cron::parse("0 0 * JUL WED").is_ok());
        // February 29 fires in leap years.
        assert!(Cron::parse("0 0 29 2 *").is_ok());
    }

    #[test]
    fn day_of_month_and_day_of_week_match_either_when_both_are_restricted() {
        let date = jiff::civil::date(2025, 6, 13); // a Friday
        assert!(Cron::parse("0 0 13 * MON").expect("reads").day(date));
        assert!(Cron::parse("0 0 1 * FRI").expect("reads").day(date));
        assert!(!Cron::parse("0 0 1 * MON").expect("reads").day(date));
        // A field starting with `*` is not restricted: the other decides alone.
        assert!(!Cron::parse("0 0 */2 * MON").expect("reads").day(date));
        assert!(Cron::parse("0 0 13 * *").expect("reads").day(date));
    }

    #[test]
    fn time_zones_are_looked_up_in_the_built_in_database() {
        assert_eq!(
            TimeZoneText::new("europe/paris")
                .get()
                .and_then(|tz| tz.iana_name()),
            Some("Europe/Paris")
        );
        assert!(TimeZoneText::new("Europe/Pariss").get().is_none());
        assert!(TimeZoneText::new("Etc/Unknown").get().is_none());
        assert!(TimeZoneText::new("UTC").get().is_some());
    }
}
