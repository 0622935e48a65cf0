//! The sizes a render may reach: the bounded output a template writes into, the measure of a value before
//! it is converted or serialized, and `tojson` and `shell_quote` checked against the limit before they build
//! their text.

use minijinja::value::{Kwargs, ValueIter, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Most bytes one template may render, or one expression's value may hold: as much as the largest output
/// a tool gives (`read_file`), so that passing data on always fits, while a template that writes without
/// end fails instead of exhausting memory.
pub const MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

/// Most levels of lists and maps in a value a render returns or serializes.
pub const MAX_DEPTH: usize = 256;

/// The output of a template, refused past [`MAX_OUTPUT_BYTES`].
#[derive(Default)]
pub(super) struct Bounded {
    pub(super) bytes: Vec<u8>,
    pub(super) full: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_OUTPUT_BYTES {
            self.full = true;
            return Err(std::io::Error::other("the output limit is reached"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Why a value may not be used as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversized {
    /// Its JSON text would be longer than the limit.
    Large,
    /// It holds more than [`MAX_DEPTH`] levels of lists and maps.
    Deep,
}

impl Oversized {
    pub fn describe(self) -> String {
        match self {
            Oversized::Large => format!("its output is larger than {MAX_OUTPUT_BYTES} bytes"),
            Oversized::Deep => {
                format!("its value is nested more than {MAX_DEPTH} levels deep")
            }
        }
    }
}

/// What [`measure`] found: about how many bytes the value's JSON text takes, in how many values (each
/// list item, each map entry) and how deep.
#[derive(Debug, Default, Clone, Copy)]
pub struct Measure {
    pub bytes: usize,
    pub values: usize,
    pub depth: usize,
}

/// Measures `value` without recursion and without copying it, stopping as soon as it is over `limit`
/// bytes or [`MAX_DEPTH`] levels: the check before a value is converted, serialized or printed, each of
/// which would recurse through it and build its whole text.
pub fn measure(value: &Value, limit: usize) -> Result<Measure, Oversized> {
    let mut found = Measure::default();
    let add = |found: &mut Measure, n: usize| {
        found.bytes = found.bytes.saturating_add(n);
        found.values += 1;
        if found.bytes > limit {
            Err(Oversized::Large)
        } else {
            Ok(())
        }
    };
    // Containers being walked: the container (to look map values up) and where its iteration is.
    let mut open: Vec<(Value, ValueIter, bool)> = Vec::new();
    let mut next = Some(value.clone());
    loop {
        if let Some(value) = next.take() {
            match value.kind() {
                ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
                    let is_map = value.kind() == ValueKind::Map;
                    add(&mut found, 2)?;
                    let iter = value.try_iter().map_err(|_| Oversized::Large)?;
                    open.push((value, iter, is_map));
                    found.depth = found.depth.max(open.len());
                    if open.len() > MAX_DEPTH {
                        return Err(Oversized::Deep);
                    }
                }
                ValueKind::String => add(&mut found, value.as_str().map_or(0, str::len) + 2)?,
                ValueKind::Bytes => add(&mut found, value.as_bytes().map_or(0, <[u8]>::len))?,
                _ => add(&mut found, 8)?,
            }
        }
        let Some((container, iter, is_map)) = open.last_mut() else {
            return Ok(found);
        };
        match iter.next() {
            Some(item) if *is_map => {
                add(&mut found, item.as_str().map_or(8, str::len) + 4)?;
                next = Some(container.get_item(&item).unwrap_or_default());
            }
            Some(item) => {
                add(&mut found, 1)?;
                next = Some(item);
            }
            None => {
                open.pop();
            }
        }
    }
}

/// `tojson`, measured first: minijinja's filter builds the whole text, recursing through the value.
pub(super) fn tojson(value: &Value, indent: Option<Value>, args: Kwargs) -> Result<Value, Error> {
    let found = measure(value, MAX_OUTPUT_BYTES).map_err(refuse)?;
    // Indented, each value starts a line indented by its depth.
    let width = match &indent {
        Some(indent) => usize::try_from(indent.clone()).unwrap_or(2),
        None => args
            .peek::<Option<usize>>("indent")
            .ok()
            .flatten()
            .unwrap_or(0),
    };
    let lines = found
        .values
        .saturating_mul(found.depth.saturating_mul(width).saturating_add(1));
    if width > 0 && found.bytes.saturating_add(lines) > MAX_OUTPUT_BYTES {
        return Err(refuse(Oversized::Large));
    }
    minijinja::filters::tojson(value, indent, args)
}

/// `shell_quote`: a string, number or boolean as one POSIX `sh` word in single quotes (`it's` becomes
/// `'it'\''s'`), a list as its items so quoted, joined by spaces. Its text is measured before it is
/// built: each `'` takes four bytes, so the result may be up to four times its input.
pub(super) fn shell_quote(value: &Value) -> Result<Value, Error> {
    let words: Vec<String> = match value.kind() {
        ValueKind::Seq | ValueKind::Iterable => value
            .try_iter()?
            .map(|item| shell_word(&item))
            .collect::<Result<_, _>>()?,
        _ => vec![shell_word(value)?],
    };
    let size = words
        .iter()
        .map(|w| w.len() + 3 * w.bytes().filter(|b| *b == b'\'').count() + 3)
        .sum::<usize>();
    if size > MAX_OUTPUT_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("cannot quote the value: its text is larger than {MAX_OUTPUT_BYTES} bytes"),
        ));
    }
    let mut quoted = String::with_capacity(size);
    for (i, word) in words.iter().enumerate() {
        if i > 0 {
            quoted.push(' ');
        }
        quoted.push('\'');
        quoted.push_str(&word.replace('\'', "'\\''"));
        quoted.push('\'');
    }
    Ok(Value::from(quoted))
}

/// The text `shell_quote` quotes for one value: strings as they are, numbers and booleans as written.
fn shell_word(value: &Value) -> Result<String, Error> {
    match value.kind() {
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => Ok(value.to_string()),
        ValueKind::Bool => Ok(if value.is_true() { "true" } else { "false" }.to_owned()),
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("`shell_quote` quotes strings, numbers and lists of them, not {kind}"),
        )),
    }
}

fn refuse(why: Oversized) -> Error {
    let what = match why {
        Oversized::Large => format!("its JSON text is larger than {MAX_OUTPUT_BYTES} bytes"),
        Oversized::Deep => format!("it is nested more than {MAX_DEPTH} levels deep"),
    };
    Error::new(
        ErrorKind::InvalidOperation,
        format!("cannot write the value as JSON: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quote_makes_one_word_of_each_value() {
        let quote = |json: serde_json::Value| {
            shell_quote(&crate::run::render::json_value(&json)).map(|v| v.to_string())
        };
        assert_eq!(
            quote(serde_json::json!("it's")).expect("quoted"),
            r"'it'\''s'"
        );
        assert_eq!(quote(serde_json::json!("")).expect("quoted"), "''");
        assert_eq!(quote(serde_json::json!(3.5)).expect("quoted"), "'3.5'");
        assert_eq!(
            quote(serde_json::json!(["a b", 1, true])).expect("quoted"),
            "'a b' '1' 'true'"
        );
        assert_eq!(quote(serde_json::json!([])).expect("quoted"), "");
        assert_eq!(
            quote(serde_json::json!([["nested"]]))
                .expect_err("not quoted")
                .detail(),
            Some("`shell_quote` quotes strings, numbers and lists of them, not sequence")
        );
    }

    #[test]
    fn measure_stops_at_the_limit_and_the_depth() {
        let value =
            crate::run::render::json_value(&serde_json::json!({"a": [1, "xyz", {"b": null}]}));
        let found = measure(&value, 1000).expect("small");
        assert_eq!(found.depth, 3);
        assert_eq!(
            measure(&value, 10).expect_err("oversized"),
            Oversized::Large
        );
        let mut deep = Value::from(1);
        for _ in 0..=MAX_DEPTH {
            deep = Value::from(vec![deep]);
        }
        assert_eq!(
            measure(&deep, usize::MAX).expect_err("oversized"),
            Oversized::Deep
        );
    }
}
