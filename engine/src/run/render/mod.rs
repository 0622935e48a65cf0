//! Rendering templates and evaluating expressions at run time, once each, over a context of plain data.
//!
//! A string that is exactly one `{{ expression }}` keeps the expression's JSON type (a list stays a list);
//! any other template renders to a string. Values that come out of a render are data: nothing rendered is
//! ever rendered again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use indexmap::IndexMap;
use minijinja::value::{Enumerator, Object, ObjectRepr, ValueKind};
use minijinja::{Environment, UndefinedBehavior, Value};
use serde_json::{Map, Value as Json};

use crate::process;
use crate::report::StepResult;
use crate::spec::{Node, NodeKind, Spanned};
use crate::validate::templates::{is_template, simple_path};

pub mod helper;
pub mod limits;
pub mod plain;

use helper::Mode;
use limits::{Bounded, Oversized, measure};
pub use limits::{MAX_DEPTH, MAX_OUTPUT_BYTES};

/// Most work one template may do (minijinja fuel), so a hostile template cannot spin forever.
pub const FUEL: u64 = 1_000_000;

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
        Self::because(what, text, &detail)
    }

    fn because(what: &str, text: &str, why: &str) -> Self {
        let shown: String = text.chars().take(80).collect();
        RenderError {
            message: format!("cannot render {what} `{shown}`: {why}"),
        }
    }
}

/// Renders templates with strict undefined values and a fuel limit: plain templates
/// ([`plain::is_plain`]) here, every other one in the helper process ([`helper`]), so that no template
/// can make archon use more memory than [`helper::LIMITS`] allows a render, or overflow its stack.
#[derive(Debug)]
pub struct Renderer {
    env: Arc<Environment<'static>>,
    /// The `archon` executable, run as `archon __render` for templates that are not plain; without
    /// it, such a template fails.
    helper: Option<PathBuf>,
}

impl Default for Renderer {
    fn default() -> Self {
        Renderer::new(None)
    }
}

impl Renderer {
    /// A renderer that renders templates that are not plain in `helper` (the `archon` executable).
    pub fn new(helper: Option<PathBuf>) -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_fuel(Some(FUEL));
        env.add_filter("tojson", limits::tojson);
        env.add_filter("shell_quote", limits::shell_quote);
        Renderer {
            env: Arc::new(env),
            helper,
        }
    }

    /// Renders every string inside a spec value; other values pass through unchanged.
    pub async fn value(&self, node: &Node, ctx: &Value) -> Result<Json, RenderError> {
        Ok(match &node.kind {
            NodeKind::Str(s) => self.string(s, ctx).await?,
            NodeKind::Seq(items) => {
                let mut values = Vec::with_capacity(items.len());
                for item in items {
                    values.push(Box::pin(self.value(item, ctx)).await?);
                }
                Json::Array(values)
            }
            NodeKind::Map(entries) => {
                let mut values = Map::new();
                for (key, item) in entries {
                    values.insert(key.name.clone(), Box::pin(self.value(item, ctx)).await?);
                }
                Json::Object(values)
            }
            _ => node.to_json(),
        })
    }

    /// Renders named templates (the `outputs` of a run, of a step, of a plan) in one context: the values
    /// that rendered, by name, and the first one that did not, with its name.
    pub async fn outputs(
        &self,
        templates: &IndexMap<Spanned<String>, Node>,
        ctx: &Value,
    ) -> (Map<String, Json>, Option<(String, RenderError)>) {
        let mut values = Map::new();
        let mut failed = None;
        for (name, template) in templates {
            match self.value(template, ctx).await {
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
    pub async fn string(&self, text: &str, ctx: &Value) -> Result<Json, RenderError> {
        if !is_template(text) {
            return Ok(Json::String(text.to_owned()));
        }
        if let Some(expr) = sole_expression(text) {
            return self.expression(expr, ctx).await;
        }
        if plain::is_plain(text, false) {
            return self.here(text, ctx, Self::template_here).await;
        }
        self.in_helper(Mode::Template, text, ctx).await
    }

    /// Renders a template to text (for prompts, command arguments, file contents).
    pub async fn text(&self, text: &str, ctx: &Value) -> Result<String, RenderError> {
        Ok(match self.string(text, ctx).await? {
            Json::String(s) => s,
            other => to_text(&other),
        })
    }

    /// Evaluates a bare expression to a JSON value.
    pub async fn expression(&self, text: &str, ctx: &Value) -> Result<Json, RenderError> {
        if plain::is_plain(text, true) {
            return self.here(text, ctx, Self::expression_here).await;
        }
        self.in_helper(Mode::Expression, text, ctx).await
    }

    /// Evaluates a condition: Jinja truthiness of the expression's value.
    pub async fn condition(&self, text: &str, ctx: &Value) -> Result<bool, RenderError> {
        if plain::is_plain(text, true) {
            return self.here(text, ctx, Self::condition_here).await;
        }
        match self.in_helper(Mode::Condition, text, ctx).await? {
            Json::Bool(truth) => Ok(truth),
            other => Ok(json_value(&other).is_true()),
        }
    }

    /// Runs `render` in this process: on the run's own thread, or on a blocking thread when the data the
    /// context holds is large ([`heavy`]), since reading it (converting a step's 15 MB output, writing it
    /// as JSON) takes long enough to hold every other step, timeout and Ctrl-C of the run. The renderer's
    /// environment and the context are shared, not copied.
    async fn here<T: Send + 'static>(
        &self,
        text: &str,
        ctx: &Value,
        render: fn(&Renderer, &str, &Value) -> Result<T, RenderError>,
    ) -> Result<T, RenderError> {
        if !heavy(ctx) {
            return render(self, text, ctx);
        }
        let renderer = Renderer {
            env: self.env.clone(),
            helper: None,
        };
        let (text, ctx) = (text.to_owned(), ctx.clone());
        let failed = RenderError::because("template", &text, "its render stopped");
        tokio::task::spawn_blocking(move || render(&renderer, &text, &ctx))
            .await
            .unwrap_or(Err(failed))
    }

    /// Renders a template in this process (plain, or in the helper).
    fn template_here(&self, text: &str, ctx: &Value) -> Result<Json, RenderError> {
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

    /// Evaluates an expression in this process; its value is measured before it is converted.
    fn expression_here(&self, text: &str, ctx: &Value) -> Result<Json, RenderError> {
        let value = self.evaluate("expression", text, ctx)?;
        measure(&value, MAX_OUTPUT_BYTES)
            .map_err(|why| RenderError::because("expression", text, &why.describe()))?;
        serde_json::to_value(&value).map_err(|e| RenderError {
            message: format!("cannot use the value of `{text}`: {e}"),
        })
    }

    fn condition_here(&self, text: &str, ctx: &Value) -> Result<bool, RenderError> {
        Ok(self.evaluate("condition", text, ctx)?.is_true())
    }

    /// Compiles and evaluates an expression; an undefined result is an error, as in templates.
    fn evaluate(&self, what: &str, text: &str, ctx: &Value) -> Result<Value, RenderError> {
        if let Some(value) = simple_path(text).and_then(|path| look_up(ctx, path)) {
            return Ok(value);
        }
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

    /// Renders in the helper process.
    async fn in_helper(&self, mode: Mode, text: &str, ctx: &Value) -> Result<Json, RenderError> {
        let what = mode.what();
        let Some(program) = &self.helper else {
            return Err(RenderError::because(
                what,
                text,
                "it needs the helper process, and no helper executable is configured\n  hint: set `RunOptions::helper` to the `archon` executable",
            ));
        };
        // Writing a large context as JSON is done off the run's thread, as rendering over it is.
        let write = move |text: &str, ctx: &Value| {
            let request = helper::Request {
                mode,
                text,
                context: ctx,
            };
            serde_json::to_vec(&request).map_err(|e| {
                RenderError::because(what, text, &format!("cannot send its data: {e}"))
            })
        };
        let request = if heavy(ctx) {
            let (owned, ctx) = (text.to_owned(), ctx.clone());
            let failed = RenderError::because(what, text, "its data could not be written");
            tokio::task::spawn_blocking(move || write(&owned, &ctx))
                .await
                .unwrap_or(Err(failed))?
        } else {
            write(text, ctx)?
        };
        let output = process::run_helper(
            program,
            &[helper::HELPER_COMMAND],
            request,
            helper::MAX_ANSWER_BYTES,
        )
        .await
        .map_err(|e| RenderError::because(what, text, &e.to_string()))?;
        if !output.status.success() {
            let why = helper::LIMITS.failure(&output);
            return Err(RenderError::because(what, text, &format!("it {why}")));
        }
        if output.stdout_truncated {
            return Err(too_large(what, text));
        }
        let answer = String::from_utf8_lossy(&output.stdout);
        let (kind, rest) = answer.split_once('\n').unwrap_or((&answer, ""));
        match kind {
            "ok" => serde_json::from_str(rest).map_err(|e| {
                let why = if e.to_string().contains("recursion limit") {
                    Oversized::Deep.describe()
                } else {
                    format!("the helper answered something else than a value: {e}")
                };
                RenderError::because(what, text, &why)
            }),
            "error" => Err(RenderError {
                message: rest.trim_end_matches('\n').to_owned(),
            }),
            _ => Err(RenderError::because(
                what,
                text,
                &format!(
                    "the helper `{}` answered something else than a value",
                    program.display()
                ),
            )),
        }
    }
}

fn too_large(what: &str, text: &str) -> RenderError {
    RenderError::because(what, text, &Oversized::Large.describe())
}

/// Strict undefined for expressions: an expression whose value is undefined is an error, as in templates.
fn undefined(text: &str) -> RenderError {
    let shown: String = text.chars().take(80).collect();
    RenderError {
        message: format!("`{}` is undefined", shown.trim()),
    }
}

/// Data in a context past this many bytes (roughly) is rendered over off the run's thread.
const HEAVY_BYTES: usize = 64 * 1024;

/// Whether a context holds more than [`HEAVY_BYTES`] of data: a [`Root`] knows (it was weighed as it was
/// built, from weights its parts keep); any other value is weighed here.
fn heavy(ctx: &Value) -> bool {
    match ctx.downcast_object_ref::<Root>() {
        Some(root) => root.weight > HEAVY_BYTES,
        None => weight(ctx) > HEAVY_BYTES,
    }
}

/// About how many bytes of data a value holds, counted up to a little past [`HEAVY_BYTES`] and no
/// further, without converting anything and without recursion: a step's view counts what it keeps
/// ([`StepView::weight`], worked out once), a string its length, anything else 8 bytes and its items.
pub fn weight(value: &Value) -> usize {
    let mut total = 0usize;
    let mut pending = vec![value.clone()];
    while let Some(value) = pending.pop() {
        let here = if let Some(view) = value.downcast_object_ref::<StepView>() {
            view.weight()
        } else if let Some(root) = value.downcast_object_ref::<Root>() {
            root.weight
        } else {
            match value.kind() {
                ValueKind::String | ValueKind::Bytes => value.as_str().map_or(8, str::len),
                ValueKind::Seq | ValueKind::Map => {
                    let map = value.kind() == ValueKind::Map;
                    for item in value.try_iter().into_iter().flatten() {
                        pending.push(if map {
                            value.get_item(&item).unwrap_or_default()
                        } else {
                            item
                        });
                    }
                    8
                }
                _ => 8,
            }
        };
        total = total.saturating_add(here);
        if total > HEAVY_BYTES || pending.len() > HEAVY_BYTES / 8 {
            return HEAVY_BYTES + 1;
        }
    }
    total
}

/// About how many bytes of data a JSON value holds, counted as [`weight`] counts.
fn json_weight(json: &Json) -> usize {
    let mut total = 0usize;
    let mut pending = vec![json];
    while let Some(json) = pending.pop() {
        total = total.saturating_add(match json {
            Json::String(s) => s.len(),
            Json::Array(items) => {
                pending.extend(items);
                8
            }
            Json::Object(entries) => {
                pending.extend(entries.values());
                8 * (1 + entries.len())
            }
            _ => 8,
        });
        if total > HEAVY_BYTES || pending.len() > HEAVY_BYTES / 8 {
            return HEAVY_BYTES + 1;
        }
    }
    total
}

/// The root of a template context: its names, and about how much data they hold ([`weight`]), worked
/// out as the context is made from weights its parts keep, so that choosing where to render costs
/// nothing per render. Templates see a mapping of the names.
#[derive(Debug)]
pub struct Root {
    names: BTreeMap<Value, Value>,
    weight: usize,
}

impl Root {
    /// A context of `names`, which hold about `weight` bytes of data.
    pub fn value<'a>(names: impl IntoIterator<Item = (&'a str, Value)>, weight: usize) -> Value {
        Value::from_object(Root {
            names: (names.into_iter())
                .map(|(name, value)| (Value::from(name), value))
                .collect(),
            weight,
        })
    }
}

impl Object for Root {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.names.get(key).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.names.keys().cloned().collect())
    }
}

/// The value a variable path (`validate::templates::simple_path`) reads, looked up name by name as
/// minijinja's own lookup does; `None` for anything it would not find (an undefined name, a global function,
/// a value that is not an object), which the full evaluation then reports or resolves.
fn look_up(ctx: &Value, path: &str) -> Option<Value> {
    let mut value = ctx.clone();
    for name in path.split('.') {
        value = value.get_attr(name).ok()?;
        if value.is_undefined() || value.kind() == ValueKind::Invalid {
            return None;
        }
    }
    Some(value)
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
    result: Arc<StepResult>,
    output: OnceLock<Value>,
    outputs: OnceLock<Value>,
    text: OnceLock<Value>,
    weight: OnceLock<usize>,
}

impl StepView {
    pub fn new(result: StepResult) -> Arc<Self> {
        Self::shared(Arc::new(result))
    }

    /// A view of a result the run shares with its record.
    pub fn shared(result: Arc<StepResult>) -> Arc<Self> {
        Arc::new(StepView {
            result,
            output: OnceLock::new(),
            outputs: OnceLock::new(),
            text: OnceLock::new(),
            weight: OnceLock::new(),
        })
    }

    /// About how many bytes of data the result holds for templates (its text, its output, its named
    /// outputs), counted up to a little past [`HEAVY_BYTES`], once.
    pub fn weight(&self) -> usize {
        *self.weight.get_or_init(|| {
            let result = &self.result;
            let outputs = result.outputs.values().map(json_weight);
            let data = outputs.fold(json_weight(&result.output), usize::saturating_add);
            data.max(result.text.len()).min(HEAVY_BYTES + 1)
        })
    }

    pub fn result(&self) -> &StepResult {
        &self.result
    }

    /// The template value (shares this view).
    pub fn value(self: &Arc<Self>) -> Value {
        Value::from_dyn_object(self.clone())
    }

    /// The result back, without a copy unless a template context or the run's record still holds it.
    pub fn into_result(self: Arc<Self>) -> StepResult {
        let result =
            Arc::try_unwrap(self).map_or_else(|shared| shared.result.clone(), |view| view.result);
        Arc::try_unwrap(result).unwrap_or_else(|shared| StepResult::clone(&shared))
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

#[cfg(test)]
mod path_tests {
    use super::*;
    use crate::report::StepStatus;

    #[test]
    fn a_path_looked_up_gives_what_minijinja_evaluates() {
        let mut result = StepResult::ended(StepStatus::Succeeded, None);
        result.output =
            serde_json::json!({ "v": 3, "list": [1, 2], "nested": { "if": "kw", "none": null } });
        result.text = result.output.to_string();
        let mut views = BTreeMap::new();
        views.insert("a", StepView::new(result).value());
        let mut root = BTreeMap::new();
        root.insert(
            "inputs",
            json_value(&serde_json::json!({ "who": "archon", "n": 2.5 })),
        );
        root.insert("steps", Value::from(views));
        let root = Value::from(root);
        let renderer = Renderer::default();
        let compiled = |text: &str| {
            renderer
                .env
                .compile_expression(text)
                .and_then(|e| e.eval(&root))
                .ok()
                .filter(|v| !v.is_undefined())
        };
        for path in [
            "inputs",
            "inputs.who",
            "inputs.n",
            "steps.a",
            "steps.a.output",
            "steps.a.output.v",
            "steps.a.output.list",
            "steps.a.output.nested.if",
            "steps.a.output.nested.none",
            "steps.a.status",
            "steps.a.text",
            "steps.a.attempts",
        ] {
            let looked = look_up(&root, path).expect(path);
            assert_eq!(Some(looked.clone()), compiled(path), "{path}");
            assert_eq!(
                serde_json::to_value(&looked).ok(),
                serde_json::to_value(compiled(path).expect(path)).ok(),
                "{path}"
            );
        }
        // Not found here: the full evaluation reports it (or finds a global).
        for path in [
            "nothing",
            "inputs.nothing",
            "steps.a.output.v.deeper",
            "steps.b",
            "range",
        ] {
            assert_eq!(look_up(&root, path), None, "{path}");
        }
        assert!(
            compiled("range").is_some(),
            "a global the lookup leaves to minijinja"
        );
    }

    /// The context of a step whose dependency gave a large output.
    fn with_output(output: Json) -> Value {
        let mut result = StepResult::ended(StepStatus::Succeeded, None);
        result.text = output.to_string();
        result.output = output;
        let mut views = BTreeMap::new();
        views.insert("a", StepView::new(result).value());
        let mut root = BTreeMap::new();
        root.insert("steps", Value::from(views));
        Value::from(root)
    }

    /// Rendering over a large output (converting it, writing it as JSON) is done off the run's thread:
    /// on it, no other task (another step, a timeout, Ctrl-C) could run until it ended. Over small data
    /// it is done in place, where it costs no thread.
    #[tokio::test]
    async fn a_template_over_a_large_output_renders_while_the_run_goes_on() {
        let renderer = Renderer::default();
        let large = with_output(serde_json::json!({ "items": vec!["x".repeat(100); 20_000] }));
        let (length, during) = crate::testing::others_ran_during(
            renderer.string("{{ steps.a.output | tojson | length }}", &large),
        )
        .await;
        assert_eq!(length.expect("rendered"), Json::from(2_080_011));
        assert!(during > 0, "no other task ran while the template rendered");

        let small = with_output(serde_json::json!({ "items": ["x"] }));
        let (length, during) = crate::testing::others_ran_during(
            renderer.string("{{ steps.a.output | tojson | length }}", &small),
        )
        .await;
        assert_eq!(
            length.expect("rendered"),
            Json::from(r#"{"items": ["x"]}"#.len())
        );
        assert_eq!(during, 0, "a small render left the run's thread");
        assert!(heavy(&large) && !heavy(&small));

        // A step whose text is short but whose named outputs are large weighs what they hold.
        let mut result = StepResult::ended(StepStatus::Succeeded, None);
        result.text = "ok".to_owned();
        result.outputs.insert(
            "data".to_owned(),
            serde_json::json!(vec!["x".repeat(100); 1_000]),
        );
        let view = StepView::new(result);
        assert!(view.weight() > HEAVY_BYTES);

        // A context made by the scheduler says what it weighs; templates read its names as a mapping's.
        let root = |weight: usize| {
            Root::value([("steps", small.get_attr("steps").expect("steps"))], weight)
        };
        let length = renderer
            .string(
                "{{ steps.a.output | tojson | length }}",
                &root(HEAVY_BYTES + 1),
            )
            .await;
        assert_eq!(
            length.expect("rendered"),
            Json::from(r#"{"items": ["x"]}"#.len())
        );
        assert!(heavy(&root(HEAVY_BYTES + 1)) && !heavy(&root(HEAVY_BYTES)));
        assert_eq!(weight(&root(100)), 100);
    }
}
