//! `archon run --dry-run`: what a run of a validated workflow would do, without doing any of it. Each wave
//! of steps, and each step's arguments (or an LLM step's goal and tools) rendered as the run would render
//! them, secrets masked; what reads another step's result, or a `foreach` item, is known only at run time
//! and is shown as such. Nothing is executed and nothing is recorded.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value as Json};

use super::redact::{MASK, Redactor};
use super::render::{Renderer, context_value};
use crate::plan::{Plan, StepKind};
use crate::spec::{Body, Node, NodeKind, Step};
use crate::workflow::Workflow;

/// The run id templates see in a dry run (`run.id`).
pub const DRY_RUN_ID: &str = "dry-run";

/// What a run would do, wave by wave.
#[derive(Clone, Debug, Serialize)]
pub struct DryRun {
    pub workflow: String,
    /// The inputs, defaults applied.
    pub inputs: Map<String, Json>,
    /// The steps of each wave: a wave's steps can run together once the waves before it ended.
    pub waves: Vec<Vec<DryStep>>,
}

/// One step as it would run.
#[derive(Clone, Debug, Serialize)]
pub struct DryStep {
    pub id: String,
    #[serde(flatten)]
    pub kind: StepKind,
    /// The steps it waits for.
    pub depends_on: Vec<String>,
    /// Its `if:`, and whether it can be decided before the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<Decision>,
    /// Its `foreach:` list, and whether it can be known before the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub foreach: Option<Decision>,
    /// Its `matrix:` lists, each as a `foreach:` list is shown.
    #[serde(skip_serializing_if = "indexmap::IndexMap::is_empty")]
    pub matrix: indexmap::IndexMap<String, Decision>,
    /// The tool's arguments or the sub-workflow's inputs, rendered, secrets masked; a string that reads
    /// what is known only at run time is `<known at run time: TEMPLATE>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Json>,
    /// An agent's goal or a planner's, rendered the same way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<String>,
    /// The tools an agent or planner may call (names or globs), its own or its named agent's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// A step that asks a person before it runs (`approval: required`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub approval: bool,
}

/// An `if:` or `foreach:` before the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "decided", rename_all = "snake_case")]
pub enum Decision {
    /// Decided now: the condition's truth, or the list of items.
    Now { expression: String, value: Json },
    /// It reads `reads` (other steps' results, the item), known only at run time.
    AtRunTime {
        expression: String,
        reads: Vec<String>,
    },
    /// It fails now, and would fail the step.
    Fails { expression: String, error: String },
}

/// Names whose values exist only once the run is under way: the results of steps, a `foreach` item and a
/// `matrix` combination.
const RUN_TIME: [&str; 4] = ["steps", "item", "index", "matrix"];

/// Renders what each step of `workflow` would run with `inputs`, `env` (the process environment), `workdir`
/// (the workspace, as `run.workdir`) and the workflow's secrets (read as a run reads them, and masked in what is returned). Errors, as a run would
/// fail before any step starts: a secret that is not set, an `env` entry that does not render.
pub async fn dry_run(
    workflow: &Workflow,
    inputs: Map<String, Json>,
    env: &BTreeMap<String, String>,
    workdir: &std::path::Path,
    helper: Option<std::path::PathBuf>,
) -> Result<DryRun, String> {
    let spec = &workflow.spec;
    let dir = workflow.path.parent().unwrap_or(std::path::Path::new(""));
    let secrets = super::secrets::values(spec.secrets.iter().map(|s| s.value.as_str()), env, dir)?;
    let providers: Vec<&crate::spec::ProviderDef> = spec
        .llm
        .as_ref()
        .map(|l| l.providers.values().collect())
        .unwrap_or_default();
    let redactor = Redactor::new(
        secrets
            .values()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .chain(crate::llm::config::key_values(&providers, env)),
    );
    let renderer = Renderer::new(helper);
    let run = serde_json::json!({
        "id": DRY_RUN_ID,
        "workflow": workflow.name,
        "workdir": workdir.display().to_string(),
        "started_at": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    });
    let base = |env: Map<String, Json>, secrets: Map<String, Json>| {
        let mut ctx = Map::new();
        ctx.insert("inputs".into(), Json::Object(inputs.clone()));
        ctx.insert("env".into(), Json::Object(env));
        ctx.insert("run".into(), run.clone());
        ctx.insert("secrets".into(), Json::Object(secrets));
        ctx
    };
    // Conditions are decided with the values the run would have: they show only true or false.
    let real_env = env
        .iter()
        .map(|(k, v)| (k.clone(), Json::String(v.clone())))
        .collect();
    let (_, conditions) =
        contexts(&renderer, &redactor, spec, base(real_env, secrets.clone())).await?;
    // Everything else a dry run shows is rendered without a secret's value, only the mask: what a template
    // makes of a secret (`upper`, `reverse`, a slice) cannot be recognised in its output. The values were
    // read above so that one that is not set fails the dry run as it would fail the run; environment
    // variables that hold one (or an LLM provider's key) are masked the same way.
    let masked_env = env
        .iter()
        .map(|(k, v)| (k.clone(), Json::String(redactor.text(v).into_owned())))
        .collect();
    let masked_secrets = secrets
        .keys()
        .map(|name| (name.clone(), Json::String(MASK.to_owned())))
        .collect();
    let (with_secrets, without_secrets) =
        contexts(&renderer, &redactor, spec, base(masked_env, masked_secrets)).await?;
    let dry = Dry {
        renderer,
        redactor,
        with_secrets,
        without_secrets,
        conditions,
    };
    let plan = Plan::new(workflow);
    let mut waves = Vec::with_capacity(plan.waves.len());
    for wave in &plan.waves {
        let mut steps = Vec::with_capacity(wave.len());
        for &index in wave {
            let planned = &plan.steps[index];
            steps.push(
                dry.step(
                    workflow,
                    &spec.steps[index],
                    planned.kind.clone(),
                    &planned.depends_on,
                )
                .await,
            );
        }
        waves.push(steps);
    }
    Ok(DryRun {
        workflow: workflow.name.clone(),
        inputs,
        waves,
    })
}

/// The template contexts of a run from `ctx` (inputs, the process environment, `run`, secrets): with the
/// spec's `env` rendered into `env`, with its secrets (tool arguments) and without (everything else).
async fn contexts(
    renderer: &Renderer,
    redactor: &Redactor,
    spec: &crate::spec::Spec,
    mut ctx: Map<String, Json>,
) -> Result<(minijinja::Value, minijinja::Value), String> {
    let first = context_value(ctx.clone());
    let mut env = match ctx.remove("env") {
        Some(Json::Object(env)) => env,
        _ => Map::new(),
    };
    for (name, template) in &spec.env {
        let value = renderer
            .text(&template.value, &first)
            .await
            .map_err(|e| format!("env `{}`: {}", name.value, redactor.text(&e.message)))?;
        env.insert(name.value.clone(), Json::String(value));
    }
    ctx.insert("env".into(), Json::Object(env));
    let with_secrets = context_value(ctx.clone());
    ctx.remove("secrets");
    Ok((with_secrets, context_value(ctx)))
}

/// What rendering a dry run takes.
struct Dry {
    renderer: Renderer,
    redactor: Redactor,
    /// Tool arguments see secrets; goals, conditions and lists do not, as in a run.
    with_secrets: minijinja::Value,
    without_secrets: minijinja::Value,
    /// What `if:` conditions read: the real values of the environment, no secrets.
    conditions: minijinja::Value,
}

impl Dry {
    async fn step(
        &self,
        workflow: &Workflow,
        step: &Step,
        kind: StepKind,
        depends_on: &[String],
    ) -> DryStep {
        let body: Body<'_> = step.body();
        let arguments = match body.args {
            Some(args) => Some(self.value(args).await),
            None => None,
        };
        let goal = match body.goal.or(body.plan) {
            Some(goal) => Some(self.text(&goal.value).await),
            None => None,
        };
        let tools = match (body.tools, body.agent) {
            (Some(tools), _) => tools.iter().map(|t| t.value.text.clone()).collect(),
            (None, Some(agent)) => workflow
                .spec
                .agents
                .iter()
                .find(|(name, _)| name.value == agent.value)
                .map(|(_, def)| def.tools.iter().map(|t| t.value.text.clone()).collect())
                .unwrap_or_default(),
            (None, None) => Vec::new(),
        };
        let condition = match &step.condition {
            Some(expr) => Some(self.decide(&expr.value, true).await),
            None => None,
        };
        let foreach = match &step.foreach {
            Some(list) => Some(self.list(list).await),
            None => None,
        };
        let mut matrix = indexmap::IndexMap::new();
        for (name, list) in step.matrix.iter().flat_map(|m| m.iter()) {
            matrix.insert(name.value.clone(), self.list(list).await);
        }
        DryStep {
            id: step.id.value.clone(),
            kind,
            depends_on: depends_on.to_vec(),
            condition,
            foreach,
            matrix,
            arguments,
            goal,
            tools,
            approval: step
                .approval
                .as_ref()
                .is_some_and(|a| a.value == crate::spec::Approval::Required),
        }
    }

    /// A spec value with every string rendered, or marked as known at run time.
    async fn value(&self, node: &Node) -> Json {
        match &node.kind {
            NodeKind::Str(text) => {
                if reads_at_run_time(text, false).is_some() {
                    return Json::String(format!(
                        "<known at run time: {}>",
                        self.redactor.text(text)
                    ));
                }
                match self.renderer.string(text, &self.with_secrets).await {
                    Ok(mut value) => {
                        self.redactor.json(&mut value);
                        value
                    }
                    Err(e) => Json::String(format!("<fails: {}>", self.redactor.text(&e.message))),
                }
            }
            NodeKind::Seq(items) => {
                let mut values = Vec::with_capacity(items.len());
                for item in items {
                    values.push(Box::pin(self.value(item)).await);
                }
                Json::Array(values)
            }
            NodeKind::Map(entries) => {
                let mut values = Map::new();
                for (key, item) in entries {
                    values.insert(key.name.clone(), Box::pin(self.value(item)).await);
                }
                Json::Object(values)
            }
            _ => node.to_json(),
        }
    }

    /// A goal (text seen by a model: no secrets), rendered or marked as known at run time.
    async fn text(&self, text: &str) -> String {
        if reads_at_run_time(text, false).is_some() {
            return format!("<known at run time: {}>", self.redactor.text(text));
        }
        match self.renderer.text(text, &self.without_secrets).await {
            Ok(text) => self.redactor.text(&text).into_owned(),
            Err(e) => format!("<fails: {}>", self.redactor.text(&e.message)),
        }
    }

    /// An `if:` (`condition`) or a `foreach:` list, decided now when it reads nothing of the run.
    /// A `foreach:` or `matrix:` list: an expression decided as [`Self::decide`] does, or a list written
    /// out, its strings rendered as arguments are.
    async fn list(&self, list: &Node) -> Decision {
        match list.as_str() {
            Some(expression) => self.decide(expression, false).await,
            None => Decision::Now {
                expression: self.redactor.text(&list.to_json().to_string()).into_owned(),
                value: self.value(list).await,
            },
        }
    }

    async fn decide(&self, expression: &str, condition: bool) -> Decision {
        if let Some(reads) = reads_at_run_time(expression, true) {
            return Decision::AtRunTime {
                expression: self.redactor.text(expression).into_owned(),
                reads,
            };
        }
        let value = if condition {
            self.renderer
                .condition(expression, &self.conditions)
                .await
                .map(Json::Bool)
        } else {
            self.renderer
                .expression(expression, &self.without_secrets)
                .await
        };
        match value {
            Ok(mut value) => {
                self.redactor.json(&mut value);
                Decision::Now {
                    expression: self.redactor.text(expression).into_owned(),
                    value,
                }
            }
            Err(e) => Decision::Fails {
                expression: self.redactor.text(expression).into_owned(),
                error: self.redactor.text(&e.message).into_owned(),
            },
        }
    }
}

/// The names a template (or an expression) reads that exist only at run time (`steps.X...`, `item`,
/// `index`, `matrix.X`), sorted; `None` when it reads none of them.
fn reads_at_run_time(text: &str, expression: bool) -> Option<Vec<String>> {
    if !expression && !crate::validate::templates::is_template(text) {
        return None;
    }
    let env = minijinja::Environment::new();
    let names = if expression {
        env.compile_expression(text)
            .ok()?
            .undeclared_variables(true)
    } else {
        env.template_from_str(text).ok()?.undeclared_variables(true)
    };
    let mut reads: Vec<String> = names
        .into_iter()
        .filter(|name| {
            let root = name.split('.').next().unwrap_or(name);
            RUN_TIME.contains(&root)
        })
        .collect();
    reads.sort();
    (!reads.is_empty()).then_some(reads)
}

#[cfg(test)]
mod tests {
    #[test]
    fn what_a_template_reads_at_run_time() {
        assert_eq!(
            super::reads_at_run_time("{{ steps.build.output }} and {{ inputs.x }}", false),
            Some(vec!["steps.build.output".to_owned()])
        );
        assert_eq!(super::reads_at_run_time("{{ inputs.x }}", false), None);
        assert_eq!(super::reads_at_run_time("plain steps.x", false), None);
        assert_eq!(
            super::reads_at_run_time("item.name", true),
            Some(vec!["item.name".to_owned()])
        );
    }
}
