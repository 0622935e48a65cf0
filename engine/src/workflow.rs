//! The validated workflow: a spec whose references, kinds and graph are known to be sound.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::network::NetworkPolicy;
use crate::source::Sources;
use crate::spec::Spec;
use crate::tools::Registry;

/// A spec that passed validation, with its dependency graphs resolved and its sub-workflows loaded.
#[derive(Debug, Clone)]
pub struct Workflow {
    pub name: String,
    /// The spec file it was read from (for a plan, the path the plan is read as, beside its workflow).
    pub path: std::path::PathBuf,
    pub spec: Arc<Spec>,
    /// For each step (by index in `spec.steps`), the indexes of the steps it depends on.
    pub dependencies: Vec<Vec<usize>>,
    /// For each step (by index), the indexes of the steps that depend on it, each once, in step order.
    pub dependents: Vec<Vec<usize>>,
    /// Each step's index in `spec.steps`, by id: a worker running one step of a large run finds it,
    /// and what it needs, without going through all of them.
    pub(crate) index: std::collections::HashMap<String, usize>,
    /// The names of the workflows of a run of this one (itself and its sub-workflows) that have steps
    /// with `cache`: whose entries the run reads.
    pub cached: Vec<String>,
    /// Those of them that its sub-workflows run (each sub-workflow's own `cached`, together): every
    /// entry of which one step of the run may reuse, as a worker reads them for each step.
    pub cached_below: Vec<String>,
    /// Step indexes in a topological order.
    pub order: Vec<usize>,
    /// The step graph of each composite tool (`tools.<name>.steps`), by tool name.
    pub composites: BTreeMap<String, StepGraph>,
    /// The validated sub-workflows this spec calls (as steps or tools), by the path written in the spec.
    pub subworkflows: BTreeMap<String, Arc<Workflow>>,
    /// Every file the workflow was read from (the spec and its sub-workflows).
    pub sources: Sources,
    /// The tools it can call (built-ins and its declared tools), resolved once.
    pub tools: Arc<Registry>,
    /// What its `http` calls may reach (`network.allow`).
    pub network: Arc<NetworkPolicy>,
    /// The hosts the spec names itself (in URLs it writes out, and in `network.allow`), lowercase: an
    /// LLM's request to any other host asks a person first, since its URL could carry data out.
    pub hosts: Arc<std::collections::BTreeSet<String>>,
    /// Its MCP servers (`tools: NAME: { mcp: ... }`), resolved by validation, by tool name.
    pub mcp: BTreeMap<String, Arc<crate::tools::mcp::ServerDef>>,
    /// The Agent Skills each agent may use, found and read by validation.
    pub skills: Arc<crate::skills::Skills>,
}

impl Workflow {
    /// The index in `spec.steps` of the step `id`.
    pub fn step_index(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// The host of a request `args` describe when the spec does not name it (`None` when it does, or when
    /// the URL has no host to speak of).
    pub fn unnamed_host(&self, args: &serde_json::Value) -> Option<String> {
        let url = url::Url::parse(args.get("url")?.as_str()?).ok()?;
        let listed = match url.host()? {
            url::Host::Ipv4(ip) => self.network.lists(ip.into()),
            url::Host::Ipv6(ip) => self.network.lists(ip.into()),
            url::Host::Domain(_) => false,
        };
        let host = url.host_str()?.trim_end_matches('.').to_ascii_lowercase();
        (!listed && !self.hosts.contains(&host)).then_some(host)
    }
}

/// The hosts `spec` names: of every URL written out (not built by a template) in step and tool
/// arguments, declared HTTP tools, `env` and input defaults, and the host names in `network.allow`.
pub fn named_hosts(spec: &Spec) -> std::collections::BTreeSet<String> {
    let mut hosts = std::collections::BTreeSet::new();
    let mut add = |text: &str| {
        let Some(rest) = text
            .strip_prefix("https://")
            .or_else(|| text.strip_prefix("http://"))
        else {
            return;
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        if authority.contains("{{") || authority.contains("{%") {
            return;
        }
        if let Ok(url) = url::Url::parse(&format!("http://{authority}/"))
            && let Some(host) = url.host_str()
        {
            hosts.insert(host.trim_end_matches('.').to_ascii_lowercase());
        }
    };
    let mut steps: Vec<&crate::spec::Step> = spec.steps.iter().collect();
    for def in spec.tools.values() {
        if let Some(http) = &def.http {
            add(&http.url.value);
        }
        if let Some(inner) = &def.steps {
            steps.extend(inner.value.iter());
        }
    }
    for step in steps {
        let bodies = std::iter::once(step.body()).chain(step.fallback.as_ref().map(|f| f.body()));
        for body in bodies {
            if let Some(args) = body.args {
                args.for_each_str(&mut |s, _| add(s));
            }
        }
    }
    for value in spec.env.values() {
        add(&value.value);
    }
    for schema in spec.inputs.values() {
        schema.for_each_str(&mut |s, _| add(s));
    }
    for allowed in spec.network.iter().flat_map(|n| n.allow.iter()) {
        if crate::network::parse_range(&allowed.value).is_none() {
            hosts.insert(allowed.value.trim_end_matches('.').to_ascii_lowercase());
        }
    }
    hosts
}

/// The dependency graph of one list of steps.
#[derive(Debug, Clone, Default)]
pub struct StepGraph {
    /// For each step (by index in its list), the indexes of the steps it depends on.
    pub dependencies: Vec<Vec<usize>>,
    /// Step indexes in a topological order.
    pub order: Vec<usize>,
}

/// The labels a worker (or a local run) needs to run a step: the step's own `runs_on`; those of the tool
/// it (or its fallback) calls, of a composite tool's steps and of a sub-workflow's steps, all the way down;
/// and for an LLM step, those of every declared tool it may call (of every declared tool when it plans or
/// may delegate, since what it calls then is not known in advance). A step runs whole on one worker, so it
/// needs every label of everything it may run.
pub type Labels = std::collections::BTreeSet<String>;

impl Workflow {
    /// The labels step `step` of this workflow needs (see [`Labels`]).
    pub fn labels_of(&self, step: &crate::spec::Step) -> Labels {
        let mut labels = Labels::new();
        self.add_step_labels(step, &mut labels, 0);
        labels
    }

    /// The top-level steps that need labels `have` lacks, each with the labels it lacks.
    pub fn missing_labels(&self, have: &Labels) -> Vec<(String, Labels)> {
        self.spec
            .steps
            .iter()
            .filter_map(|step| {
                let missing: Labels = self.labels_of(step).difference(have).cloned().collect();
                (!missing.is_empty()).then(|| (step.id.value.clone(), missing))
            })
            .collect()
    }

    fn add_step_labels(&self, step: &crate::spec::Step, labels: &mut Labels, depth: usize) {
        labels.extend(step.runs_on.iter().map(|l| l.value.clone()));
        self.add_body_labels(step.body(), labels, depth);
        if let Some(fallback) = &step.fallback {
            self.add_body_labels(fallback.body(), labels, depth);
        }
    }

    fn add_body_labels(&self, body: crate::spec::Body<'_>, labels: &mut Labels, depth: usize) {
        // Validation refuses recursive tools and workflows; the bound only keeps a bug from looping.
        if depth > 64 {
            return;
        }
        if let Some(tool) = body.tool {
            let name = tool.value.split('.').next().unwrap_or(&tool.value);
            self.add_tool_labels(name, labels, depth);
        }
        if let Some(path) = body.workflow {
            self.add_subworkflow_labels(&path.value, labels, depth);
        }
        if body.tool.is_some() || body.workflow.is_some() {
            return;
        }
        // An LLM step: a plan, an unspecified step (which may become one), several agents asked, or an
        // agent that may delegate can call any declared tool.
        let everything = body.goal.is_none()
            || body.ask.is_some()
            || self
                .spec
                .agent_of(body)
                .is_some_and(|a| !a.delegates.is_empty());
        let patterns = self.spec.tool_patterns(body);
        for name in self.spec.tools.keys() {
            if everything || patterns.iter().any(|p| p.matches(&name.value)) {
                self.add_tool_labels(&name.value, labels, depth);
            }
        }
    }

    fn add_tool_labels(&self, name: &str, labels: &mut Labels, depth: usize) {
        let Some(def) = self.spec.tools.get(name) else {
            return;
        };
        labels.extend(def.runs_on.iter().map(|l| l.value.clone()));
        for step in def.steps.iter().flat_map(|s| s.value.iter()) {
            self.add_step_labels(step, labels, depth + 1);
        }
        if let Some(path) = &def.workflow {
            self.add_subworkflow_labels(&path.value, labels, depth);
        }
    }

    fn add_subworkflow_labels(&self, path: &str, labels: &mut Labels, depth: usize) {
        if let Some(sub) = self.subworkflows.get(path) {
            for step in &sub.spec.steps {
                sub.add_step_labels(step, labels, depth + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Labels;

    /// The labels each step of `spec` needs, in the spec's order.
    fn labels(spec: &str) -> Vec<(String, Vec<String>)> {
        let validation = crate::validate::validate_source("/nowhere/labels.yaml", spec);
        assert!(!validation.has_errors(), "{:?}", validation.diagnostics);
        let workflow = validation.workflow.expect("valid");
        workflow
            .spec
            .steps
            .iter()
            .map(|s| {
                let labels: Labels = workflow.labels_of(s);
                (s.id.value.clone(), labels.into_iter().collect())
            })
            .collect()
    }

    fn owned(rows: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
        rows.iter()
            .map(|(s, l)| ((*s).to_owned(), l.iter().map(|l| (*l).to_owned()).collect()))
            .collect()
    }

    #[test]
    fn a_step_needs_its_own_labels_and_those_of_everything_it_calls() {
        let spec = r#"name: routed
tools:
  train: { runs_on: [gpu], command: [echo, trained] }
  pack: { runs_on: [big-disk], command: [echo, packed] }
  both:
    runs_on: [eu]
    steps:
      - { id: t, tool: train }
      - { id: u, tool: exec, runs_on: [fast], with: { argv: [echo, u] } }
steps:
  - { id: plain, tool: exec, with: { argv: [echo, plain] } }
  - { id: fit, tool: train, runs_on: [eu] }
  - { id: nested, tool: both }
  - id: saved
    tool: exec
    with: { argv: ["false"] }
    fallback: { tool: pack }
"#;
        assert_eq!(
            labels(spec),
            owned(&[
                ("plain", &[]),
                ("fit", &["eu", "gpu"]),
                ("nested", &["eu", "fast", "gpu"]),
                ("saved", &["big-disk"]),
            ])
        );
    }

    #[test]
    fn a_workflow_knows_each_steps_index_what_needs_it_and_whether_it_caches() {
        let spec = "name: diamond
steps:
  - { id: a, tool: echo, with: { n: 1 } }
  - { id: b, needs: [a, a], tool: echo, with: { n: 2 } }
  - { id: c, needs: [a], tool: echo, with: { n: 3 }, cache: false }
  - { id: d, needs: [c, b], tool: echo, with: { n: 4 } }
";
        let workflow = crate::validate::validate_source("/nowhere/diamond.yaml", spec)
            .workflow
            .expect("valid");
        let index: Vec<Option<usize>> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|id| workflow.step_index(id))
            .collect();
        assert_eq!(index, [Some(0), Some(1), Some(2), Some(3), None]);
        // Each dependent once, in step order, whatever the order and repeats of its `needs`.
        assert_eq!(workflow.dependents, [vec![1, 2], vec![3], vec![3], vec![]]);
        assert!(workflow.cached.is_empty());
        let cached = crate::validate::validate_source(
            "/nowhere/cached.yaml",
            spec.replace("cache: false", "cache: true"),
        )
        .workflow
        .expect("valid");
        assert_eq!(cached.cached, ["diamond"]);
    }

    #[test]
    fn missing_labels_names_each_step_and_what_it_lacks() {
        let spec = "name: m\nsteps:\n  - { id: a, tool: exec, runs_on: [gpu, eu], with: { argv: [echo] } }\n  - { id: b, tool: exec, with: { argv: [echo] } }\n";
        let workflow = crate::validate::validate_source("/nowhere/m.yaml", spec)
            .workflow
            .expect("valid");
        let have: Labels = ["eu".to_owned()].into_iter().collect();
        assert_eq!(
            workflow.missing_labels(&have),
            vec![("a".to_owned(), ["gpu".to_owned()].into_iter().collect())]
        );
        let all: Labels = ["eu".to_owned(), "gpu".to_owned()].into_iter().collect();
        assert!(workflow.missing_labels(&all).is_empty());
    }
}
