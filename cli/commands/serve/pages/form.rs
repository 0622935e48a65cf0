//! A run form made from a workflow's inputs (their JSON Schema, `workflows::input_schema`): a field per
//! input by its type — text, number, integer, a yes/no choice, a list of choices for an `enum`, JSON in a
//! text area for arrays, objects and inputs of no single type — and the values sent back read into JSON
//! by the same types. Checking them against the schemas is the engine's (`inputs::resolve`, as for
//! `archon run --input`); its problems are set next to the inputs they name.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Map, Value as Json};

use super::{code_spans, escape};

/// The prefix of each input's field name (`input.who`), so that no input can be named `csrf`.
const PREFIX: &str = "input.";

/// What the person typed, by input name, as text (the form is shown again with it).
pub type Given = BTreeMap<String, String>;

/// The form's problems: by input name, and those that name no input.
#[derive(Debug, Default)]
pub struct Problems {
    pub by_input: BTreeMap<String, Vec<String>>,
    pub general: Vec<String>,
}

impl Problems {
    pub fn is_empty(&self) -> bool {
        self.by_input.is_empty() && self.general.is_empty()
    }

    fn add(&mut self, input: &str, message: String) {
        self.by_input
            .entry(input.to_owned())
            .or_default()
            .push(message);
    }

    /// Sets each message next to the input it names: the first value in backticks, when it is an input
    /// (`input `n` is invalid: ...`, `missing required input `n``); the others above the form.
    pub fn attribute(&mut self, schema: &Json, messages: impl IntoIterator<Item = String>) {
        let properties = schema.get("properties").and_then(Json::as_object);
        for message in messages {
            let named = message
                .split('`')
                .nth(1)
                .filter(|name| properties.is_some_and(|p| p.contains_key(*name)))
                .map(str::to_owned);
            match named {
                Some(name) => self.add(&name, message),
                None => self.general.push(message),
            }
        }
    }
}

/// The kind of field an input gets.
#[derive(Debug, PartialEq)]
enum Kind<'a> {
    Text,
    Integer,
    Number,
    Boolean,
    Choice(&'a [Json]),
    Json,
}

fn kind(schema: &Json) -> Kind<'_> {
    if let Some(values) = schema.get("enum").and_then(Json::as_array) {
        return Kind::Choice(values);
    }
    match schema.get("type").and_then(Json::as_str) {
        Some("string") => Kind::Text,
        Some("integer") => Kind::Integer,
        Some("number") => Kind::Number,
        Some("boolean") => Kind::Boolean,
        _ => Kind::Json,
    }
}

/// The inputs' fields, in the schema's order, with `given` (or each input's default) filled in and the
/// problems of each set after it.
pub fn fields(schema: &Json, given: Option<&Given>, problems: &Problems) -> String {
    let mut out = String::new();
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema.get("properties").and_then(Json::as_object) else {
        return out;
    };
    for (index, (name, input)) in properties.iter().enumerate() {
        let id = format!("input-{index}");
        let field = format!("{PREFIX}{name}");
        let is_required = required.contains(&name.as_str());
        let default = input.get("default");
        let value: String = match given {
            Some(given) => given.get(name).cloned().unwrap_or_default(),
            None => default.map(|d| as_text(d, input)).unwrap_or_default(),
        };
        let errors = problems.by_input.get(name);
        let mut described = Vec::new();
        let mut help = String::new();
        if let Some(description) = input.get("description").and_then(Json::as_str) {
            let _ = write!(
                help,
                r#"<p class="help" id="{id}-help">{}</p>"#,
                escape(description)
            );
            described.push(format!("{id}-help"));
        }
        let mut notes = Vec::new();
        if let Some(ty) = input.get("type").and_then(Json::as_str) {
            notes.push(ty.to_owned());
        }
        for (key, label) in [
            ("minimum", "at least"),
            ("maximum", "at most"),
            ("exclusiveMinimum", "more than"),
            ("exclusiveMaximum", "less than"),
            ("minLength", "characters, at least"),
            ("maxLength", "characters, at most"),
            ("minItems", "items, at least"),
            ("maxItems", "items, at most"),
            ("pattern", "matching"),
            ("format", "format"),
        ] {
            if let Some(limit) = input.get(key) {
                let shown = limit
                    .as_str()
                    .map_or_else(|| limit.to_string(), str::to_owned);
                notes.push(format!("{label} {shown}"));
            }
        }
        if let Some(default) = default {
            notes.push(format!("default {}", default));
        } else if is_required {
            notes.push("required".to_owned());
        }
        let _ = write!(
            help,
            r#"<p class="constraints" id="{id}-notes">{}</p>"#,
            escape(&notes.join(", "))
        );
        described.push(format!("{id}-notes"));
        let mut error_html = String::new();
        if let Some(errors) = errors {
            let _ = write!(error_html, r#"<ul class="field-errors" id="{id}-errors">"#);
            for error in errors {
                let _ = write!(error_html, "<li>{}</li>", code_spans(error));
            }
            error_html.push_str("</ul>");
            described.insert(0, format!("{id}-errors"));
        }
        let aria = format!(
            r#" aria-describedby="{}"{}{}"#,
            described.join(" "),
            if errors.is_some() {
                r#" aria-invalid="true""#
            } else {
                ""
            },
            if is_required {
                r#" aria-required="true""#
            } else {
                ""
            }
        );
        let label = format!(r#"<label for="{id}">{}</label>"#, escape(name));
        let control = match kind(input) {
            Kind::Text => format!(
                r#"<input type="text" id="{id}" name="{}" value="{}"{aria}>"#,
                escape(&field),
                escape(&value)
            ),
            Kind::Integer => format!(
                r#"<input type="number" step="1" inputmode="numeric" id="{id}" name="{}" value="{}"{aria}>"#,
                escape(&field),
                escape(&value)
            ),
            Kind::Number => format!(
                r#"<input type="number" step="any" inputmode="decimal" id="{id}" name="{}" value="{}"{aria}>"#,
                escape(&field),
                escape(&value)
            ),
            Kind::Boolean => {
                let mut options = String::new();
                let choices: &[(&str, &str)] = if default.is_some() || !is_required {
                    &[
                        ("", "(default)"),
                        ("true", "yes (true)"),
                        ("false", "no (false)"),
                    ]
                } else {
                    &[
                        ("", "(choose)"),
                        ("true", "yes (true)"),
                        ("false", "no (false)"),
                    ]
                };
                // With a default, the default is shown chosen until something else is.
                let chosen = if given.is_none() { "" } else { value.as_str() };
                for (text, label) in choices {
                    let selected = if *text == chosen { " selected" } else { "" };
                    let _ = write!(
                        options,
                        r#"<option value="{text}"{selected}>{label}</option>"#
                    );
                }
                format!(
                    r#"<select id="{id}" name="{}"{aria}>{options}</select>"#,
                    escape(&field)
                )
            }
            Kind::Choice(values) => {
                let mut options = String::from(r#"<option value="">(default)</option>"#);
                if default.is_none() {
                    options = String::from(r#"<option value="">(choose)</option>"#);
                }
                for choice in values {
                    let text = as_text(choice, input);
                    let selected = if text == value && (given.is_some() || default.is_some()) {
                        " selected"
                    } else {
                        ""
                    };
                    let _ = write!(
                        options,
                        r#"<option value="{}"{selected}>{}</option>"#,
                        escape(&text),
                        escape(&text)
                    );
                }
                format!(
                    r#"<select id="{id}" name="{}"{aria}>{options}</select>"#,
                    escape(&field)
                )
            }
            Kind::Json => format!(
                r#"<textarea id="{id}" name="{}" rows="4" spellcheck="false"{aria}>{}</textarea>"#,
                escape(&field),
                escape(&value)
            ),
        };
        let class = if errors.is_some() {
            "field invalid"
        } else {
            "field"
        };
        let _ = writeln!(
            out,
            r#"<div class="{class}">{label}{control}{error_html}{help}</div>"#
        );
    }
    out
}

/// A value as its field shows it: a string as it is, anything else as JSON (indented for a text area).
fn as_text(value: &Json, schema: &Json) -> String {
    match (value, kind(schema)) {
        (Json::String(s), _) => s.clone(),
        (_, Kind::Json) => super::pretty(value),
        _ => value.to_string(),
    }
}

/// The inputs of a posted form (`input.NAME` fields; the last of repeated ones counts), as typed.
pub fn given(body: &[u8]) -> Given {
    let mut given = Given::new();
    for (key, value) in form_urlencoded::parse(body) {
        if let Some(name) = key.strip_prefix(PREFIX) {
            given.insert(name.to_owned(), value.into_owned());
        }
    }
    given
}

/// The typed text read as each input's type: an empty field is an input not given (its default
/// applies). What does not read is a problem of its input.
pub fn read(schema: &Json, given: &Given, problems: &mut Problems) -> Map<String, Json> {
    let mut values = Map::new();
    let properties = schema.get("properties").and_then(Json::as_object);
    for (name, text) in given {
        let Some(input) = properties.and_then(|p| p.get(name)) else {
            problems.general.push(format!("unknown input `{name}`"));
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        let read = match kind(input) {
            Kind::Text => Ok(Json::String(text.clone())),
            Kind::Integer => text
                .trim()
                .parse::<i64>()
                .map(Json::from)
                .map_err(|_| format!("input `{name}` must be an integer, got `{text}`")),
            Kind::Number => text
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Json::Number)
                .ok_or_else(|| format!("input `{name}` must be a number, got `{text}`")),
            Kind::Boolean => match text.trim() {
                "true" => Ok(Json::Bool(true)),
                "false" => Ok(Json::Bool(false)),
                _ => Err(format!(
                    "input `{name}` must be `true` or `false`, got `{text}`"
                )),
            },
            Kind::Choice(values) => values
                .iter()
                .find(|v| as_text(v, input) == *text)
                .cloned()
                .ok_or_else(|| format!("input `{name}` must be one of its choices, got `{text}`")),
            Kind::Json => match input.get("type").and_then(Json::as_str) {
                Some(ty @ ("array" | "object")) => serde_json::from_str::<Json>(text)
                    .map_err(|e| format!("input `{name}` must be a JSON {ty}: {e}")),
                // No single type: JSON when it reads as JSON, text otherwise (as `--input` does).
                _ => Ok(serde_json::from_str::<Json>(text)
                    .unwrap_or_else(|_| Json::String(text.clone()))),
            },
        };
        match read {
            Ok(value) => {
                values.insert(name.clone(), value);
            }
            Err(message) => problems.add(name, message),
        }
    }
    values
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Json {
        json!({
            "type": "object",
            "properties": {
                "who": {"type": "string", "description": "Who to greet"},
                "count": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3},
                "ratio": {"type": "number"},
                "loud": {"type": "boolean", "default": false},
                "mood": {"enum": ["calm", "glad"], "default": "calm"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "any": {}
            },
            "required": ["who", "ratio", "tags", "any"],
            "additionalProperties": false
        })
    }

    #[test]
    fn typed_text_reads_as_each_inputs_type() {
        let given: Given = [
            ("who", "ana"),
            ("count", " 7 "),
            ("ratio", "0.5"),
            ("loud", "true"),
            ("mood", "glad"),
            ("tags", r#"["a", "b"]"#),
            ("any", "plain words"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let mut problems = Problems::default();
        let values = read(&schema(), &given, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            Json::Object(values),
            json!({"who": "ana", "count": 7, "ratio": 0.5, "loud": true, "mood": "glad", "tags": ["a", "b"], "any": "plain words"})
        );
    }

    #[test]
    fn what_does_not_read_is_a_problem_of_its_input() {
        let given: Given = [
            ("count", "seven"),
            ("tags", "[1,"),
            ("mood", "angry"),
            ("who", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let mut problems = Problems::default();
        let values = read(&schema(), &given, &mut problems);
        assert_eq!(Json::Object(values), json!({}));
        assert_eq!(
            problems.by_input,
            BTreeMap::from([
                (
                    "count".to_owned(),
                    vec!["input `count` must be an integer, got `seven`".to_owned()]
                ),
                (
                    "mood".to_owned(),
                    vec!["input `mood` must be one of its choices, got `angry`".to_owned()]
                ),
                (
                    "tags".to_owned(),
                    vec![
                        "input `tags` must be a JSON array: EOF while parsing a value at line 1 column 3"
                            .to_owned()
                    ]
                ),
            ])
        );
    }

    #[test]
    fn engine_problems_are_set_next_to_the_inputs_they_name() {
        let mut problems = Problems::default();
        problems.attribute(
            &schema(),
            [
                "input `count` is invalid: 50 is greater than the maximum of 10".to_owned(),
                "missing required input `who`".to_owned(),
                "unknown input `nope`".to_owned(),
            ],
        );
        assert_eq!(
            problems.by_input.keys().collect::<Vec<_>>(),
            ["count", "who"]
        );
        assert_eq!(problems.general, ["unknown input `nope`"]);
    }

    #[test]
    fn fields_show_the_values_given_and_their_problems_escaped() {
        let mut problems = Problems::default();
        problems.add("who", "input `who` is <bad>".to_owned());
        let given: Given = [("who".to_owned(), "\"><script>".to_owned())].into();
        let html = fields(&schema(), Some(&given), &problems);
        assert!(
            html.contains(r#"name="input.who" value="&quot;&gt;&lt;script&gt;" aria-describedby="input-0-errors input-0-help input-0-notes" aria-invalid="true" aria-required="true">"#),
            "{html}"
        );
        assert!(
            html.contains(r#"<li>input <code>who</code> is &lt;bad&gt;</li>"#),
            "{html}"
        );
        assert!(!html.contains("<script>"));
    }
}
