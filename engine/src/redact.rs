//! Keeping secret values out of everything a run writes down and everything a model reads: the run store,
//! events, the report, cassettes and LLM requests. This module masks text and JSON; `run::redact` applies
//! it to a run's results, events and LLM requests.
//!
//! Values of the secrets a run reads are replaced by `***` wherever they appear in text, in any of the forms
//! a tool is likely to print them: as written, JSON-escaped, URL-encoded (percent-encoding in either case,
//! `+` or `%20` for spaces, any mix) and base64-encoded (standard and URL-safe alphabets, with or without
//! padding, alone or inside a longer encoded text such as `user:secret` in a Basic authorization).
//! Templates still see the real values while the run goes on; only what leaves the run is redacted (so a
//! resumed run reuses the redacted form). Values shorter than four characters are not searched for, since
//! they would match ordinary text.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use regex::{NoExpand, Regex};
use serde_json::{Map, Value as Json};

/// What secret values are replaced with.
pub const MASK: &str = "***";
const MIN_LEN: usize = 4;
/// Shortest encoded form searched for: shorter runs of base64 would match unrelated encoded data.
const MIN_ENCODED_LEN: usize = 6;
/// Shortest part of a secret's encoding searched for inside a longer base64 text.
const MIN_EMBEDDED_LEN: usize = 8;

/// The secret values to keep out of what a run writes.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    values: Vec<String>,
    /// Every form of every value, longest first, so that a secret containing another is masked whole.
    pattern: Option<Regex>,
    /// Most bytes one form of a value can span (a character is at most six bytes in any form: `\u0070`
    /// in JSON, three per byte percent-encoded, four per three bytes in base64).
    longest_form: usize,
}

impl Redactor {
    pub fn new(values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = values.into_iter().filter(|v| v.len() >= MIN_LEN).collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        let pattern = compile(&values);
        let longest_form = values.first().map_or(0, |v| v.len() * 6);
        Redactor {
            values,
            pattern,
            longest_form,
        }
    }

    /// This redactor's values and `other`'s.
    pub fn with(&self, other: &Redactor) -> Redactor {
        Redactor::new(self.values.iter().chain(&other.values).cloned())
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Whether `value` is one of the values this redactor masks.
    pub fn masks(&self, value: &str) -> bool {
        self.values.iter().any(|v| v == value)
    }

    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match &self.pattern {
            Some(pattern) => pattern.replace_all(text, NoExpand(MASK)),
            None if self.values.is_empty() => Cow::Borrowed(text),
            // Values too many or too long for one pattern: their whole forms, one by one, rather than
            // nothing at all.
            None => {
                let mut out = Cow::Borrowed(text);
                for form in self.values.iter().flat_map(|v| literal_forms(v)) {
                    if out.contains(form.as_str()) {
                        out = Cow::Owned(out.replace(form.as_str(), MASK));
                    }
                }
                out
            }
        }
    }

    /// Whether `text` holds a value this redactor masks, in any form it masks: what [`Redactor::text`]
    /// would change, found without building the masked copy.
    pub fn finds(&self, text: &str) -> bool {
        match &self.pattern {
            Some(pattern) => pattern.is_match(text),
            None => self
                .values
                .iter()
                .flat_map(|v| literal_forms(v))
                .any(|form| text.contains(form.as_str())),
        }
    }

    /// Whether [`Redactor::json`] would change `value`.
    pub fn finds_in_json(&self, value: &Json) -> bool {
        if self.is_empty() {
            return false;
        }
        match value {
            Json::String(text) => self.finds(text),
            Json::Array(items) => items.iter().any(|i| self.finds_in_json(i)),
            Json::Object(map) => map
                .iter()
                .any(|(k, v)| self.finds(k) || self.finds_in_json(v)),
            Json::Number(number) => self.finds(&number.to_string()),
            Json::Bool(_) | Json::Null => false,
        }
    }

    /// Where to cut `text` at `at` or before so that no secret, in any form, is split by the cut: the start
    /// of a secret the cut would go through, else `at`. What is kept then holds secrets only whole, and
    /// whole ones are masked wherever the kept text goes.
    pub fn cut_before(&self, text: &str, at: usize) -> usize {
        self.split_by(text, at).map_or(at, |(start, _)| start)
    }

    /// Where to cut `text`, of which more is still to come, at `at` or before, so that neither what is
    /// before the cut nor it joined with anything that follows holds a secret unmasked: the cut splits no
    /// secret found whole in `text`, and the tail that may be the start of a secret the next bytes
    /// complete (the last bytes, fewer than the longest form of a value spans) is held back. A secret
    /// that starts `text` and that `at` would split is passed on whole (the cut is then its end). `0`
    /// when nothing can be passed on before more arrives.
    pub fn cut_streaming(&self, text: &str, at: usize) -> usize {
        if self.is_empty() {
            return crate::text::floor_boundary(text, at);
        }
        let held = text
            .len()
            .saturating_sub(self.longest_form.saturating_sub(1));
        let at = crate::text::floor_boundary(text, at.min(held));
        match self.split_by(text, at) {
            None => at,
            // Whole in `text`: it starts before `at`, which is at least the longest form before its end.
            Some((0, end)) => end,
            Some((start, _)) => start,
        }
    }

    /// Whether a value holds a line break, so that text cut after a line may split it.
    pub fn spans_lines(&self) -> bool {
        self.values.iter().any(|v| v.contains('\n'))
    }

    /// The first form of a value in `text` that a cut at `at` would split, as its start and end.
    fn split_by(&self, text: &str, at: usize) -> Option<(usize, usize)> {
        let splits = |start: usize, end: usize| start < at && at < end;
        match &self.pattern {
            Some(pattern) => pattern
                .find_iter(text)
                .take_while(|m| m.start() < at)
                .find(|m| splits(m.start(), m.end()))
                .map(|m| (m.start(), m.end())),
            None => self
                .values
                .iter()
                .flat_map(|v| literal_forms(v))
                .filter_map(|form| {
                    text.match_indices(form.as_str())
                        .find(|(start, _)| splits(*start, start + form.len()))
                        .map(|(start, _)| (start, start + form.len()))
                })
                .min(),
        }
    }

    pub fn string(&self, text: &mut String) {
        if let Cow::Owned(redacted) = self.text(text) {
            *text = redacted;
        }
    }

    pub fn json(&self, value: &mut Json) {
        if self.is_empty() {
            return;
        }
        match value {
            Json::String(text) => self.string(text),
            Json::Array(items) => items.iter_mut().for_each(|i| self.json(i)),
            Json::Object(map) => self.map(map),
            // A secret that is a number (a PIN) reaches JSON output as a number.
            Json::Number(number) => {
                let text = number.to_string();
                if self.text(&text) != text {
                    *value = Json::String(MASK.to_owned());
                }
            }
            Json::Bool(_) | Json::Null => {}
        }
    }

    pub fn map(&self, map: &mut Map<String, Json>) {
        if self.is_empty() {
            return;
        }
        // Keys are data too (`echo` returns its arguments).
        let keys: Vec<String> = map
            .keys()
            .filter(|k| matches!(self.text(k), Cow::Owned(_)))
            .cloned()
            .collect();
        for key in keys {
            if let Some(value) = map.remove(&key) {
                map.insert(self.text(&key).into_owned(), value);
            }
        }
        map.values_mut().for_each(|v| self.json(v));
    }

    pub fn option(&self, text: &mut Option<String>) {
        if let Some(text) = text {
            self.string(text);
        }
    }
}

/// One regular expression matching every form of every value (longest forms first), or `None` for none.
fn compile(values: &[String]) -> Option<Regex> {
    // Past this many bytes of values the pattern would not fit its size limit anyway: building it only to
    // find that out costs seconds.
    const MOST_PATTERN_BYTES: usize = 128 * 1024;
    if values.is_empty() || values.iter().map(String::len).sum::<usize>() > MOST_PATTERN_BYTES {
        return None;
    }
    // (length of what the form matches, its regex), longest first across all values.
    let mut forms: Vec<(usize, String)> = values.iter().flat_map(|v| forms(v)).collect();
    forms.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut seen = std::collections::HashSet::new();
    forms.retain(|(_, source)| seen.insert(source.clone()));
    let source = forms
        .iter()
        .map(|(_, s)| s.as_str())
        .collect::<Vec<_>>()
        .join("|");
    // Too many or too long values for one pattern: `None`, and `Redactor::text` searches for the whole
    // forms of each value instead.
    regex::RegexBuilder::new(&source)
        .size_limit(64 << 20)
        .build()
        .ok()
}

/// The whole forms of a value, longest first: JSON-escaped, as written, base64 (both alphabets, with and
/// without padding), and percent-encoded in upper and lower case.
fn literal_forms(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_owned()];
    if let Ok(quoted) = serde_json::to_string(value) {
        forms.push(quoted[1..quoted.len() - 1].to_owned());
    }
    for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        let bare = engine.encode(value.as_bytes());
        let padding = "=".repeat((4 - bare.len() % 4) % 4);
        forms.push(format!("{bare}{padding}"));
        forms.push(bare);
    }
    let percent: String = value.bytes().map(|b| format!("%{b:02X}")).collect();
    forms.push(percent.to_lowercase());
    forms.push(percent);
    forms.retain(|f| f.len() >= MIN_LEN);
    forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
    forms.dedup();
    forms
}

/// The forms of one value to search for, each with the length it matches.
fn forms(value: &str) -> Vec<(usize, String)> {
    let mut forms = vec![(value.len(), url_encoded(value))];
    forms.push((value.len(), json_escaped(value)));
    let bytes = value.as_bytes();
    for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        let bare = engine.encode(bytes);
        let padding = "=".repeat((4 - bare.len() % 4) % 4);
        for whole in [format!("{bare}{padding}"), bare.clone()] {
            if whole.len() >= MIN_ENCODED_LEN {
                forms.push((whole.len(), regex::escape(&whole)));
            }
        }
        // Inside a longer encoded text the value starts 0, 1 or 2 bytes into a group of three: the
        // characters that encode only its bits are the same whatever surrounds it.
        for offset in 0..3usize {
            let mut shifted = vec![0u8; offset];
            shifted.extend_from_slice(bytes);
            let encoded = engine.encode(&shifted);
            let start = (8 * offset).div_ceil(6);
            let end = (8 * (offset + bytes.len())) / 6;
            if end > start && end - start >= MIN_EMBEDDED_LEN {
                let inner = &encoded[start..end];
                forms.push((inner.len(), regex::escape(inner)));
            }
        }
    }
    forms
}

/// A pattern matching `value` inside a JSON string as any encoder may write it: each character as itself
/// (when JSON allows it bare), as its short escape (`\"`, `\\`, `\/` as PHP and Go write `/`, `\n`...),
/// or as a `\uXXXX` escape in either case (Python escapes everything outside ASCII by default, Go escapes
/// `<`, `>` and `&`), characters outside the basic plane as a surrogate pair.
fn json_escaped(value: &str) -> String {
    let hex = |unit: u16| -> String {
        format!("{unit:04x}")
            .chars()
            .map(|d| {
                if d.is_ascii_alphabetic() {
                    format!("[{d}{}]", d.to_ascii_uppercase())
                } else {
                    d.to_string()
                }
            })
            .collect()
    };
    let mut pattern = String::new();
    for c in value.chars() {
        let mut alternatives = Vec::new();
        if c != '"' && c != '\\' && !c.is_control() {
            alternatives.push(regex::escape(c.encode_utf8(&mut [0; 4])));
        }
        // The escapes as JSON text, then escaped for the pattern.
        let short = match c {
            '"' => Some(r#"\""#),
            '\\' => Some(r"\\"),
            '/' => Some(r"\/"),
            '\u{8}' => Some(r"\b"),
            '\u{c}' => Some(r"\f"),
            '\n' => Some(r"\n"),
            '\r' => Some(r"\r"),
            '\t' => Some(r"\t"),
            _ => None,
        };
        alternatives.extend(short.map(regex::escape));
        let units: String = c
            .encode_utf16(&mut [0; 2])
            .iter()
            .map(|&u| format!(r"\\u{}", hex(u)))
            .collect();
        alternatives.push(units);
        pattern.push_str(&format!("(?:{})", alternatives.join("|")));
    }
    pattern
}

/// A pattern matching `value` as written or URL-encoded: any character may appear percent-encoded (hex
/// digits in either case; some encoders encode every byte), a space also as `+`.
fn url_encoded(value: &str) -> String {
    let mut pattern = String::new();
    for c in value.chars() {
        let mut encoded = String::new();
        for byte in c.encode_utf8(&mut [0; 4]).bytes() {
            encoded.push('%');
            for digit in format!("{byte:02X}").chars() {
                if digit.is_ascii_alphabetic() {
                    encoded.push_str(&format!("[{digit}{}]", digit.to_ascii_lowercase()));
                } else {
                    encoded.push(digit);
                }
            }
        }
        let plain = regex::escape(c.encode_utf8(&mut [0; 4]));
        if c == ' ' {
            pattern.push_str(&format!("(?: |\\+|{encoded})"));
        } else {
            pattern.push_str(&format!("(?:{plain}|{encoded})"));
        }
    }
    pattern
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};

    use super::*;

    /// JSON written by other encoders: `\/` (PHP, Go), `\uXXXX` in either case for anything outside
    /// ASCII (Python's default) or for `<`, `>`, `&` (Go), surrogate pairs outside the basic plane.
    #[test]
    fn secrets_escaped_by_any_json_encoder_are_masked() {
        let secret = "pä/ss<w>\"rd🔑x";
        let redactor = Redactor::new([secret.to_owned()]);
        for written in [
            r#"p\u00e4\/ss<w>\"rd\ud83d\udd11x"#,
            r#"p\u00E4/ss\u003cw\u003e\"rd\uD83D\uDD11x"#,
            r#"\u0070\u00e4\u002f\u0073s<w>\u0022rd🔑x"#,
            "pä/ss<w>\\\"rd🔑x",
        ] {
            let text = format!("{{\"token\": \"{written}\"}}");
            assert_eq!(redactor.text(&text), "{\"token\": \"***\"}", "{written}");
        }
        // Python's `json.dumps` of the value, exactly as it prints it.
        let python = r#"{"token": "p\u00e4/ss<w>\"rd\ud83d\udd11x"}"#;
        assert_eq!(redactor.text(python), r#"{"token": "***"}"#);
    }

    /// A value too long for one pattern of every form is still masked in its whole forms, never let
    /// through.
    #[test]
    fn a_value_too_long_for_one_pattern_is_still_masked() {
        let secret: String = (0..400_000u32)
            .map(|i| char::from(b'a' + u8::try_from(i * 7 % 26).unwrap_or(0)))
            .collect();
        let redactor = Redactor::new([secret.clone()]);
        assert!(
            redactor.pattern.is_none(),
            "the value is past what one pattern holds"
        );
        let encoded = STANDARD_NO_PAD.encode(secret.as_bytes());
        let text = format!("raw {secret} encoded {encoded} end");
        let masked = redactor.text(&text);
        assert!(!masked.contains(&secret[..1000]));
        assert!(!masked.contains(&encoded[..1000]));
        assert!(
            masked.starts_with("raw *** encoded *** end"),
            "{}",
            &masked[..40]
        );
    }

    #[test]
    fn secrets_are_masked_in_text_and_json_keys_and_values() {
        let redactor = Redactor::new([
            "s3cr3t-token".to_owned(),
            "s3cr3t".to_owned(),
            "ab".to_owned(),
        ]);
        assert_eq!(
            redactor.text("a s3cr3t-token and s3cr3t, ab"),
            "a *** and ***, ab"
        );
        let mut value = serde_json::json!({ "s3cr3t": ["x s3cr3t-token"], "n": 1 });
        redactor.json(&mut value);
        assert_eq!(value, serde_json::json!({ "***": ["x ***"], "n": 1 }));
        assert!(matches!(redactor.text("nothing here"), Cow::Borrowed(_)));
    }

    /// `finds` and `finds_in_json` say exactly whether masking would change a text or a value, with one
    /// pattern and with values too long for one.
    #[test]
    fn finding_a_secret_agrees_with_masking_it() {
        let long: String = (0..400_000u32)
            .map(|i| char::from(b'a' + u8::try_from(i * 7 % 26).unwrap_or(0)))
            .collect();
        for secret in ["s3cr3t-token".to_owned(), "123456".to_owned(), long] {
            let redactor = Redactor::new([secret.clone()]);
            let encoded = STANDARD_NO_PAD.encode(secret.as_bytes());
            for text in [
                format!("x {secret} y"),
                format!("x {encoded} y"),
                "nothing here".to_owned(),
                secret[..secret.len() - 1].to_owned(),
            ] {
                let changed = matches!(redactor.text(&text), Cow::Owned(_));
                assert_eq!(
                    redactor.finds(&text),
                    changed,
                    "{}",
                    &text[..text.len().min(40)]
                );
            }
            let number = secret.parse::<u64>().map_or(Json::Null, Json::from);
            for value in [
                serde_json::json!({ "k": [1, { "v": format!("x {secret}") }] }),
                serde_json::json!({ (secret.clone()): 1 }),
                serde_json::json!([1, "nothing", { "k": null }]),
                serde_json::json!({ "n": number }),
            ] {
                let mut masked = value.clone();
                redactor.json(&mut masked);
                assert_eq!(redactor.finds_in_json(&value), masked != value);
            }
        }
    }

    #[test]
    fn encoded_forms_are_masked() {
        let secret = "p@ss w0rd/with+sym~bols\"é";
        let redactor = Redactor::new([secret.to_owned()]);
        let json = serde_json::to_string(secret).expect("json");
        let forms = [
            secret.to_owned(),
            json[1..json.len() - 1].to_owned(),
            "p%40ss+w0rd%2Fwith%2Bsym~bols%22%C3%A9".to_owned(),
            "p%40ss%20w0rd%2fwith%2bsym%7Ebols%22%c3%a9".to_owned(),
            "%70%40%73%73%20%77%30%72%64%2f%77%69%74%68%2b%73%79%6D%7E%62%6f%6c%73%22%c3%a9"
                .to_owned(),
            "p@ss%20w0rd/with%2Bsym~bols\"%C3%A9".to_owned(),
            STANDARD.encode(secret),
            STANDARD_NO_PAD.encode(secret),
            URL_SAFE.encode(secret),
            URL_SAFE_NO_PAD.encode(secret),
        ];
        for form in forms {
            assert_eq!(redactor.text(&format!("<{form}>")), "<***>", "{form}");
        }
    }

    /// A secret inside a longer base64 text (`user:secret` in a Basic authorization) is masked at each of
    /// the three offsets it can start at within a group of three bytes.
    #[test]
    fn a_secret_inside_a_longer_encoding_is_masked() {
        let secret = "hunter2-correct-horse";
        let redactor = Redactor::new([secret.to_owned()]);
        for prefix in ["", "u:", "us:", "user:"] {
            let encoded = STANDARD.encode(format!("{prefix}{secret}!"));
            let masked = redactor.text(&encoded).into_owned();
            assert!(masked.contains(MASK), "{prefix}: {masked}");
            // What is left around the mask is at most a few characters on each side.
            let left = masked.replace(MASK, "");
            assert!(left.len() <= 10, "{prefix}: {masked}");
        }
        assert!(matches!(
            redactor.text(&STANDARD.encode("an unrelated text of some length")),
            Cow::Borrowed(_)
        ));
    }
}
