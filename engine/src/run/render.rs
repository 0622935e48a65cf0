//! Rendering templates and evaluating expressions at run time, once each, over a context of plain data.
//!
//! A string that is exactly one `{{ expression }}` keeps the expression's JSON type (a list stays a list);
//! any other template renders to a string. Values that come out of a render are data: nothing rendered is
//! ever rendered again.

use std::sync::{Arc, OnceLock};

use indexmap::IndexMap;
use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Environment, UndefinedBehavior, Value};
use serde_json::{Map, Value as Json};

use crate::report::StepResult;
use crate::spec::{Node, NodeKind, Spanned};
use crate::validate::templates::is_template;

/// Most work one template may do (minijinja fuel), so a hostile template cannot spin forever.
pub const FUEL: u64 = 1_000_000;
/// Most bytes one template may render, or one expression's value may hold: as much as the largest output
/// a tool gives (`read_file`), so that passing data on always fits, while a template that writes without
/// end fails instead of exhausting memory.
pub const MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

/// A template or expression that failed at run time (undefined value, type error, out of fuel...).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct RenderError {
    pub message: String,
}

impl RenderError {
    fn new(what: &str, text: &str, err: &minijinja::Error) -> Self {
        let detail = err
            .detail()
            .map_or_else(|| err.kind().to_string(), str::to_owned);
        let shown: String = text.chars().take(80).collect();
        RenderError {
            message: format!("cannot render {what} `{shown}`: {detail}"),
        }
    }
}

/// Renders templates with strict undefined values and a fuel limit.
#[derive(Debug)]
pub struct Renderer {
    env: Environment<'static>,
}

impl Default for Renderer {
    fn default() -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_fuel(Some(FUEL));
        Renderer { env }
    }
}

impl Renderer {
    /// Renders every string inside a spec value; other values pass through unchanged.
    pub fn value(&self, node: &Node, ctx: &Value) -> Result<Json, RenderError> {
        Ok(match &node.kind {
            NodeKind::Str(s) => self.string(s, ctx)?,
            NodeKind::Seq(items) => Json::Array(
                items
                    .iter()
                    .map(|n| self.value(n, ctx))
                    .collect::<Result<_, _>>()?,
            ),
            NodeKind::Map(entries) => Json::Object(
                entries
                    .iter()
                    .map(|(k, v)| Ok((k.name.clone(), self.value(v, ctx)?)))
                    .collect::<Result<_, RenderError>>()?,
            ),
            _ => node.to_json(),
        })
    }

    /// Renders named templates (the `outputs` of a run, of a step, of a plan) in one context: the values
    /// that rendered, by name, and the first one that did not, with its name.
    pub fn outputs(
        &self,
        templates: &IndexMap<Spanned<String>, Node>,
        ctx: &Value,
    ) -> (Map<String, Json>, Option<(String, RenderError)>) {
        let mut values = Map::new();
        let mut failed = None;
        for (name, template) in templates {
            match self.value(template, ctx) {
                Ok(value) => {
                    values.insert(name.value.clone(), value);
                }
                Err(e) => {
                    failed.get_or_insert_with(|| (name.value.clone(), e));
                }
            }
        }
        (values, failed)
    }

    /// Renders one template string. `{{ expr }}` alone keeps the expression's type.
    pub fn string(&self, text: &str, ctx: &Value) -> Result<Json, RenderError> {
        if !is_template(text) {
            return Ok(Json::String(text.to_owned()));
        }
        if let Some(expr) = sole_expression(text) {
            return self.expression(expr, ctx);
        }
        let template = self
            .env
            .template_from_str(text)
            .map_err(|e| RenderError::new("template", text, &e))?;
        // Rendered into a bounded buffer, so that the output stops growing at the limit.
        let mut out = Bounded::default();
        match template.render_captured_to(ctx, &mut out) {
            Ok(_) => Ok(Json::String(
                String::from_utf8_lossy(&out.bytes).into_owned(),
            )),
            Err(_) if out.full => Err(too_large("template", text)),
            Err(e) => Err(RenderError::new("template", text, &e)),
        }
    }

    /// Renders a template to text (for prompts, command arguments, file contents).
    pub fn text(&self, text: &str, ctx: &Value) -> Result<String, RenderError> {
        Ok(match self.string(text, ctx)? {
            Json::String(s) => s,
            other => to_text(&other),
        })
    }

    /// Evaluates a bare expression to a JSON value.
    pub fn expression(&self, text: &str, ctx: &Value) -> Result<Json, RenderError> {
        let value = self.evaluate("expression", text, ctx)?;
        let json = serde_json::to_value(&value).map_err(|e| RenderError {
            message: format!("cannot use the value of `{text}`: {e}"),
        })?;
        if size_over(&json, MAX_OUTPUT_BYTES) {
            return Err(too_large("expression", text));
        }
        Ok(json)
    }

    /// Evaluates a condition: Jinja truthiness of the expression's value.
    pub fn condition(&self, text: &str, ctx: &Value) -> Result<bool, RenderError> {
        Ok(self.evaluate("condition", text, ctx)?.is_true())
    }

    /// Compiles and evaluates an expression; an undefined result is an error, as in templates.
    fn evaluate(&self, what: &str, text: &str, ctx: &Value) -> Result<Value, RenderError> {
        let expr = self
            .env
            .compile_expression(text)
            .map_err(|e| RenderError::new(what, text, &e))?;
        let value = expr
            .eval(ctx)
            .map_err(|e| RenderError::new(what, text, &e))?;
        if value.is_undefined() {
            return Err(undefined(text));
        }
        Ok(value)
    }
}

/// The output of a template, refused past [`MAX_OUTPUT_BYTES`].
#[derive(Default)]
struct Bounded {
    bytes: Vec<u8>,
    full: bool,
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

fn too_large(what: &str, text: &str) -> RenderError {
    let shown: String = text.chars().take(80).collect();
    RenderError {
        message: format!(
            "cannot render {what} `{shown}`: its output is larger than {MAX_OUTPUT_BYTES} bytes"
        ),
    }
}

/// Whether a value's JSON text would take more than `limit` bytes (counted roughly, stopping early).
fn size_over(value: &Json, limit: usize) -> bool {
    /// Takes `n` bytes from the budget; false when there are not that many left.
    fn take(budget: &mut usize, n: usize) -> bool {
        match budget.checked_sub(n) {
            Some(left) => {
                *budget = left;
                true
            }
            None => false,
        }
    }
    fn fits(value: &Json, budget: &mut usize) -> bool {
        match value {
            Json::String(s) => take(budget, s.len() + 2),
            Json::Array(items) => {
                take(budget, 2) && items.iter().all(|i| take(budget, 1) && fits(i, budget))
            }
            Json::Object(map) => {
                take(budget, 2)
                    && map
                        .iter()
                        .all(|(k, v)| take(budget, k.len() + 4) && fits(v, budget))
            }
            _ => take(budget, 8),
        }
    }
    let mut budget = limit;
    !fits(value, &mut budget)
}

/// Strict undefined for expressions: an expression whose value is undefined is an error, as in templates.
fn undefined(text: &str) -> RenderError {
    let shown: String = text.chars().take(80).collect();
    RenderError {
        message: format!("`{}` is undefined", shown.trim()),
    }
}

/// The expression inside a template that is exactly `{{ expression }}` (surrounding spaces allowed).
fn sole_expression(text: &str) -> Option<&str> {
    let inner = text.trim().strip_prefix("{{")?.strip_suffix("}}")?;
    let inner = inner.strip_prefix('-').unwrap_or(inner);
    let inner = inner.strip_suffix('-').unwrap_or(inner);
    (!inner.contains("{{") && !inner.contains("}}") && !inner.contains("{%"))
        .then_some(inner.trim())
}

/// A template context from plain data.
pub fn context_value(map: Map<String, Json>) -> Value {
    serde::Deserialize::deserialize(Json::Object(map)).unwrap_or_default()
}

/// The text form of a value, as an LLM or a command would read it: strings as they are, other values as JSON.
pub fn to_text(value: &Json) -> String {
    match value {
        Json::String(s) => s.clone(),
        Json::Null => String::new(),
        other => other.to_string(),
    }
}

/// A finished step as templates see it (`steps.<id>`): `output`, `outputs`, `status`, `text`, `error`,
/// `attempts` and `exit_code`, read from the step's result when a template asks for them.
///
/// It owns the result, so the scheduler keeps one copy of each step's result rather than the result and
/// a converted map; the JSON values are converted to template values on first read, once.
#[derive(Debug)]
pub struct StepView {
    result: StepResult,
    output: OnceLock<Value>,
    outputs: OnceLock<Value>,
    text: OnceLock<Value>,
}

impl StepView {
    pub fn new(result: StepResult) -> Arc<Self> {
        Arc::new(StepView {
            result,
            output: OnceLock::new(),
            outputs: OnceLock::new(),
            text: OnceLock::new(),
        })
    }

    pub fn result(&self) -> &StepResult {
        &self.result
    }

    /// The template value (shares this view).
    pub fn value(self: &Arc<Self>) -> Value {
        Value::from_dyn_object(self.clone())
    }

    /// The result back, without a copy unless a template context still holds the view.
    pub fn into_result(self: Arc<Self>) -> StepResult {
        Arc::try_unwrap(self).map_or_else(|shared| shared.result.clone(), |view| view.result)
    }
}

impl Object for StepView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let result = &self.result;
        Some(match key.as_str()? {
            "attempts" => Value::from(result.attempts),
            "error" => Value::from(result.error.as_deref()),
            "exit_code" => Value::from(result.exit_code),
            "output" => self
                .output
                .get_or_init(|| json_value(&result.output))
                .clone(),
            "outputs" => self
                .outputs
                .get_or_init(|| {
                    let outputs = result.outputs.iter();
                    Value::from_pairs(
                        outputs.map(|(name, value)| (name.as_str(), json_value(value))),
                    )
                })
                .clone(),
            "status" => Value::from(result.status.as_str()),
            "text" => self
                .text
                .get_or_init(|| Value::from(result.text.as_str()))
                .clone(),
            _ => return None,
        })
    }

    /// In key order, as a map of the same values would list them.
    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&[
            "attempts",
            "error",
            "exit_code",
            "output",
            "outputs",
            "status",
            "text",
        ])
    }
}

/// Plain data as a template value.
pub fn json_value(json: &Json) -> Value {
    serde::Deserialize::deserialize(json).unwrap_or_default()
}
