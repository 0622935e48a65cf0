//! A cron schedule in a time zone: the instants it fires at.
//!
//! The schedule is read in the zone's civil (wall-clock) time, minute by minute as cron does, and each
//! wall-clock time it matches becomes one instant:
//! - a time a spring-forward gap skips (02:30 in Paris on the last Sunday of March) fires once, at the
//!   first instant after the gap (03:00 local); several skipped times fire once between them;
//! - a time a fall-back fold repeats (02:30 on the last Sunday of October) fires once, at its first
//!   occurrence (02:30 summer time).

use jiff::civil::{DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ToSpan};

use crate::spec::{Cron, CronText, TimeZoneText};

/// How far ahead a schedule is searched for its next instant: enough for February 29, not forever for
/// an expression that never fires.
const HORIZON_YEARS: i16 = 10;

/// A cron expression read in a time zone.
#[derive(Clone, Debug)]
pub struct CronSchedule {
    cron: Cron,
    zone: TimeZone,
}

impl CronSchedule {
    pub fn new(cron: Cron, zone: TimeZone) -> Self {
        CronSchedule { cron, zone }
    }

    /// Reads `expression` in the IANA time zone `zone`; the error says what does not read.
    pub fn parse(expression: &str, zone: &str) -> Result<Self, String> {
        let text = CronText::new(expression);
        let cron = match (text.get(), text.error()) {
            (Some(cron), _) => *cron,
            (None, Some(e)) => return Err(e.message.clone()),
            (None, None) => return Err(format!("`{expression}` is not a cron expression")),
        };
        let zone = TimeZoneText::new(zone)
            .get()
            .cloned()
            .ok_or_else(|| format!("unknown time zone `{zone}`"))?;
        Ok(CronSchedule::new(cron, zone))
    }

    pub fn zone(&self) -> &TimeZone {
        &self.zone
    }

    /// The first instant strictly after `after` at which the schedule fires, if there is one within ten
    /// years.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let local = self.zone.to_datetime(after);
        let last_year = local.year().saturating_add(HORIZON_YEARS);
        let mut at = local
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        loop {
            if at.year() > last_year {
                return None;
            }
            if !self.cron.month(at.month()) {
                at = at
                    .date()
                    .first_of_month()
                    .checked_add(1.month())
                    .ok()?
                    .to_datetime(Time::midnight());
                continue;
            }
            if !self.cron.day(at.date()) {
                at = at.date().tomorrow().ok()?.to_datetime(Time::midnight());
                continue;
            }
            if !self.cron.hour(at.hour()) {
                at = at
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if self.cron.minute(at.minute()) {
                let instant = self.instant(at)?;
                if instant > after {
                    return Some(instant);
                }
            }
            at = at.checked_add(1.minute()).ok()?;
        }
    }

    /// The instants the schedule fires at in `(after, until]`, in order.
    pub fn slots(
        &self,
        after: Timestamp,
        until: Timestamp,
    ) -> impl Iterator<Item = Timestamp> + '_ {
        std::iter::successors(self.next_after(after), move |&slot| self.next_after(slot))
            .take_while(move |&slot| slot <= until)
    }

    /// The instant a matching wall-clock time fires at (see the module's documentation).
    fn instant(&self, at: DateTime) -> Option<Timestamp> {
        match self.zone.to_ambiguous_timestamp(at).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(at).ok(),
            // The offset before the transition gives the first occurrence.
            AmbiguousOffset::Fold { before, .. } => before.to_timestamp(at).ok(),
            // The transition lies after the time read with the later offset and at or before the time
            // read with the earlier one: the first transition after the former is the gap's end.
            AmbiguousOffset::Gap { after, .. } => {
                let earliest = after.to_timestamp(at).ok()?;
                self.zone.following(earliest).next().map(|t| t.timestamp())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    /// Every instant in `(from, until]`, in UTC.
    fn slots(expression: &str, zone: &str, from: &str, until: &str) -> Vec<String> {
        let schedule = CronSchedule::parse(expression, zone).expect("valid");
        schedule
            .slots(at(from), at(until))
            .map(|t| t.to_string())
            .collect()
    }

    #[test]
    fn paris_spring_forward_fires_a_skipped_time_once_at_the_end_of_the_gap() {
        // 2025-03-30: at 02:00 CET (01:00Z) clocks go to 03:00 CEST; 02:xx does not exist.
        assert_eq!(
            slots(
                "30 2 * * *",
                "Europe/Paris",
                "2025-03-28T12:00:00Z",
                "2025-04-01T12:00:00Z"
            ),
            [
                "2025-03-29T01:30:00Z", // 02:30 CET
                "2025-03-30T01:00:00Z", // 02:30 does not exist: 03:00 CEST, the first instant after the gap
                "2025-03-31T00:30:00Z", // 02:30 CEST
                "2025-04-01T00:30:00Z",
            ]
        );
        // Four skipped times and 03:00 itself fire once, at 03:00 CEST.
        assert_eq!(
            slots(
                "*/15 2-3 * * *",
                "Europe/Paris",
                "2025-03-30T00:30:00Z",
                "2025-03-30T01:31:00Z"
            ),
            [
                "2025-03-30T01:00:00Z",
                "2025-03-30T01:15:00Z",
                "2025-03-30T01:30:00Z",
            ]
        );
    }

    #[test]
    fn paris_fall_back_fires_a_repeated_time_once_at_its_first_occurrence() {
        // 2025-10-26: at 03:00 CEST (01:00Z) clocks go back to 02:00 CET; 02:xx happens twice.
        assert_eq!(
            slots(
                "30 2 * * *",
                "Europe/Paris",
                "2025-10-25T12:00:00Z",
                "2025-10-27T12:00:00Z"
            ),
            [
                "2025-10-26T00:30:00Z", // 02:30 CEST, the first; not 01:30Z (02:30 CET)
                "2025-10-27T01:30:00Z", // 02:30 CET
            ]
        );
        // Hourly: the repeated hour fires once, so the 25-hour day has 24 firings.
        let hourly = slots(
            "0 * * * *",
            "Europe/Paris",
            "2025-10-25T21:59:00Z",
            "2025-10-26T22:59:00Z",
        );
        assert_eq!(hourly.len(), 24);
        assert_eq!(
            &hourly[1..4],
            [
                "2025-10-25T23:00:00Z", // 01:00 CEST
                "2025-10-26T00:00:00Z", // 02:00 CEST
                "2025-10-26T02:00:00Z", // 03:00 CET: 02:00 CET (01:00Z) is the repeat
            ]
        );
    }

    #[test]
    fn new_york_across_both_changes() {
        // 2025-03-09 02:00 EST -> 03:00 EDT; 2025-11-02 02:00 EDT -> 01:00 EST.
        assert_eq!(
            slots(
                "30 2 * * SUN",
                "America/New_York",
                "2025-03-01T00:00:00Z",
                "2025-03-17T00:00:00Z"
            ),
            [
                "2025-03-02T07:30:00Z", // 02:30 EST
                "2025-03-09T07:00:00Z", // skipped: 03:00 EDT
                "2025-03-16T06:30:00Z", // 02:30 EDT
            ]
        );
        assert_eq!(
            slots(
                "30 1 * * *",
                "America/New_York",
                "2025-11-01T00:00:00Z",
                "2025-11-03T12:00:00Z"
            ),
            [
                "2025-11-01T05:30:00Z", // 01:30 EDT
                "2025-11-02T05:30:00Z", // 01:30 EDT, the first of two
                "2025-11-03T06:30:00Z", // 01:30 EST
            ]
        );
    }

    #[test]
    fn weekdays_months_and_leap_days() {
        assert_eq!(
            slots(
                "0 9 * * MON-FRI",
                "UTC",
                "2025-06-13T09:00:00Z",
                "2025-06-17T09:00:00Z"
            ),
            ["2025-06-16T09:00:00Z", "2025-06-17T09:00:00Z"]
        );
        let leap = CronSchedule::parse("0 0 29 2 *", "UTC").expect("valid");
        assert_eq!(
            leap.next_after(at("2025-01-01T00:00:00Z"))
                .map(|t| t.to_string()),
            Some("2028-02-29T00:00:00Z".to_owned())
        );
        // Strictly after: an instant on the schedule is not its own next one.
        assert_eq!(
            slots(
                "0 0 1 * *",
                "UTC",
                "2025-01-01T00:00:00Z",
                "2025-03-01T00:00:00Z"
            ),
            ["2025-02-01T00:00:00Z", "2025-03-01T00:00:00Z"]
        );
    }
}
