//! Run inputs: `name=value` pairs and input files, coerced by each input's declared type, completed with
//! defaults, and checked against the input schemas before anything runs.

use std::path::Path;

use serde_json::{Map, Value as Json};

use crate::source::Sources;
use crate::spec::{self, Limits, Node, Spec};
use crate::validate::suggest;

/// One problem with the inputs given to a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputProblem {
    pub message: String,
    pub hint: Option<String>,
}

impl InputProblem {
    fn new(message: String, hint: Option<String>) -> Self {
        InputProblem { message, hint }
    }
}

/// Reads an inputs file (JSON, or YAML unless it ends in `.json`) holding an object of input values.
pub fn read_inputs_file(path: &Path) -> Result<Map<String, Json>, InputProblem> {
    let unreadable = |reason: String| {
        InputProblem::new(
            format!("cannot read inputs file `{}`: {reason}", path.display()),
            None,
        )
    };
    let limit = Limits::default().max_file_bytes as u64;
    let bytes = crate::source::read_bounded(path, limit).map_err(|e| unreadable(e.reason()))?;
    let text =
        String::from_utf8(bytes).map_err(|_| unreadable("it is not UTF-8 text".to_owned()))?;
    let value = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str::<Json>(&text).map_err(|e| {
            InputProblem::new(
                format!("inputs file `{}` is not valid JSON: {e}", path.display()),
                None,
            )
        })?
    } else {
        let mut sources = Sources::default();
        let file = sources.add(path.with_extension("yaml"), text);
        match spec::parse(&file, &Limits::default()) {
            (Some(node), diagnostics) if diagnostics.is_empty() => node.to_json(),
            (_, diagnostics) => {
                let reason = diagnostics
                    .first()
                    .map_or_else(|| "unreadable".to_owned(), |d| d.message.clone());
                return Err(InputProblem::new(
                    format!(
                        "inputs file `{}` is not valid YAML: {reason}",
                        path.display()
                    ),
                    None,
                ));
            }
        }
    };
    match value {
        Json::Object(map) => Ok(map),
        other => Err(InputProblem::new(
            format!(
                "inputs file `{}` must hold an object of input values, not {}",
                path.display(),
                json_kind(&other)
            ),
            Some("write `name: value` pairs, one per input".to_owned()),
        )),
    }
}

/// Resolves the run's inputs: values from `file` (already parsed), then `pairs` (`name=value`, which win),
/// then defaults. Every problem is reported, not only the first.
pub fn resolve(
    spec: &Spec,
    file: Map<String, Json>,
    pairs: &[String],
) -> Result<Map<String, Json>, Vec<InputProblem>> {
    let declared: Vec<&str> = spec.inputs.keys().map(|k| k.value.as_str()).collect();
    let mut problems = Vec::new();
    let mut given: Map<String, Json> = Map::new();
    let unknown = |name: &str| {
        InputProblem::new(
            format!("unknown input `{name}`"),
            suggest::did_you_mean(name, declared.iter().copied()).or_else(|| {
                Some(if declared.is_empty() {
                    "this workflow declares no inputs".to_owned()
                } else {
                    format!("its inputs are {}", suggest::list(&declared))
                })
            }),
        )
    };
    for (name, value) in file {
        if spec.inputs.contains_key(name.as_str()) {
            given.insert(name, value);
        } else {
            problems.push(unknown(&name));
        }
    }
    for pair in pairs {
        let Some((name, raw)) = pair.split_once('=') else {
            problems.push(InputProblem::new(
                format!("`--input` takes `name=value`, got `{pair}`"),
                None,
            ));
            continue;
        };
        let Some(schema) = spec.inputs.get(name) else {
            problems.push(unknown(name));
            continue;
        };
        match coerce(name, raw, schema) {
            Ok(value) => {
                given.insert(name.to_owned(), value);
            }
            Err(problem) => problems.push(problem),
        }
    }
    let mut resolved = Map::new();
    for (name, schema) in &spec.inputs {
        let value = match given.remove(name.value.as_str()) {
            Some(value) => value,
            None => match schema.get("default") {
                Some(default) => default.to_json(),
                None => {
                    problems.push(InputProblem::new(
                        format!("missing required input `{}`", name.value),
                        Some(format!("pass it with `--input {}=...`", name.value)),
                    ));
                    continue;
                }
            },
        };
        if let Ok(validator) = jsonschema::validator_for(&schema.to_json())
            && let Some(error) = validator.iter_errors(&value).next()
        {
            let path = error.instance_path().to_string();
            let at = if path.is_empty() {
                String::new()
            } else {
                format!(" at `{path}`")
            };
            problems.push(InputProblem::new(
                format!("input `{}` is invalid{at}: {error}", name.value),
                schema
                    .get("description")
                    .and_then(Node::as_str)
                    .map(|d| format!("`{}`: {d}", name.value)),
            ));
            continue;
        }
        resolved.insert(name.value.clone(), value);
    }
    if problems.is_empty() {
        Ok(resolved)
    } else {
        Err(problems)
    }
}

/// Turns command-line text into a value of the input's declared type.
fn coerce(name: &str, raw: &str, schema: &Node) -> Result<Json, InputProblem> {
    let ty = schema.get("type").and_then(Node::as_str);
    let fail = |expected: &str, example: &str| {
        InputProblem::new(
            format!("input `{name}` must be {expected}, got `{raw}`"),
            Some(format!("for example `--input {name}={example}`")),
        )
    };
    match ty {
        Some("string") => Ok(Json::String(raw.to_owned())),
        Some("integer") => raw
            .trim()
            .parse::<i64>()
            .map(Json::from)
            .map_err(|_| fail("an integer", "3")),
        Some("number") => raw
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Json::Number)
            .ok_or_else(|| fail("a number", "0.5")),
        Some("boolean") => match raw.trim() {
            "true" => Ok(Json::Bool(true)),
            "false" => Ok(Json::Bool(false)),
            _ => Err(fail("`true` or `false`", "true")),
        },
        Some("array") => match serde_json::from_str::<Json>(raw) {
            Ok(value @ Json::Array(_)) => Ok(value),
            _ => Err(fail("a JSON array", "[\"a\", \"b\"]")),
        },
        Some("object") => match serde_json::from_str::<Json>(raw) {
            Ok(value @ Json::Object(_)) => Ok(value),
            _ => Err(fail("a JSON object", "{\"depth\": 2}")),
        },
        // No single declared type: JSON when it parses, text otherwise.
        _ => Ok(serde_json::from_str::<Json>(raw).unwrap_or_else(|_| Json::String(raw.to_owned()))),
    }
}

fn json_kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}
