//! Validation: turns a spec file into a [`Workflow`] or tells the user everything that is wrong with it.
//!
//! Pipeline: read (size limit) -> parse into a [`Node`] tree -> structural check against the generated
//! JSON Schema (unknown keys, types, enums) -> deserialize the pruned tree into [`Spec`] -> semantic
//! checks (references, templates, kinds, graph, schemas, rules). Every stage adds to one list of
//! diagnostics; later stages run on whatever the earlier ones left intact.

mod config;
mod consensus;
mod graph;
mod mcp;
mod patterns;
mod planned;
mod refs;
mod shape;
mod skills;
mod steps;
mod structure;
pub mod suggest;
pub mod templates;
mod tools;
mod triggers;

pub use planned::{PlanPolicy, problems};
pub use steps::is_label;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::diagnostic::{Diagnostic, codes};
use crate::network::NetworkPolicy;
use crate::source::{SourceFile, Sources, Span};
use crate::spec::{self, Limits, Node, NodeKind, Spec};
use crate::tools::Registry;
use crate::workflow::{StepGraph, Workflow};
use templates::Analyzer;

/// The outcome of validating one spec file.
#[derive(Debug)]
pub struct Validation {
    /// The validated workflow, when there are no errors.
    pub workflow: Option<Workflow>,
    /// Every problem found, errors and warnings, in the order found.
    pub diagnostics: Vec<Diagnostic>,
    /// Every file read (for rendering diagnostics).
    pub sources: Sources,
}

impl Validation {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Validates the spec at `path` (YAML unless it ends in `.toml`) with the default limits.
pub fn validate_file(path: &Path) -> Validation {
    Validator::new(Limits::default()).validate_path(path)
}

/// Validates spec text as if read from `path` (sub-workflows are still resolved relative to it).
pub fn validate_source(path: impl Into<PathBuf>, text: impl Into<String>) -> Validation {
    Validator::new(Limits::default()).validate_text(path.into(), text.into())
}

/// Validates spec files, sharing parsed sub-workflows between them.
#[derive(Debug)]
pub struct Validator {
    limits: Limits,
    analyzer: Arc<Analyzer>,
    sources: Sources,
    /// Sub-workflows already checked, by canonical path.
    loaded: HashMap<PathBuf, SubWorkflow>,
    /// Canonical paths of the workflows being checked, outermost first (to catch recursion).
    stack: Vec<PathBuf>,
    /// Sub-workflows already validated with the workflow a plan belongs to, by the path as written: a
    /// plan is checked against them, never against the files as they are now.
    preloaded: HashMap<String, SubWorkflow>,
    /// The state directory whose MCP tool lists (`<dir>/mcp/<key>.json`) calls to MCP tools are checked
    /// against; `None`: MCP calls are not checked and no server is reported as not listed.
    mcp_cache: Option<PathBuf>,
}

/// What a caller needs to know about a sub-workflow.
#[derive(Clone, Debug)]
pub(crate) struct SubWorkflow {
    /// Input names, and whether each is required (has no default).
    pub inputs: Vec<(String, bool)>,
    /// The validated workflow, when it is valid.
    pub workflow: Option<Arc<Workflow>>,
}

/// What checking one file produced.
struct Checked {
    spec: Spec,
    graph: graph::Graph,
    composites: BTreeMap<String, StepGraph>,
    subworkflows: BTreeMap<String, Arc<Workflow>>,
    tools: Registry,
    mcp: BTreeMap<String, Arc<crate::tools::mcp::ServerDef>>,
    skills: crate::skills::Skills,
}

impl Checked {
    fn into_workflow(self, path: &Path, sources: Sources) -> Workflow {
        let network = Arc::new(NetworkPolicy::new(
            &self
                .spec
                .network
                .iter()
                .flat_map(|n| n.allow.iter().map(|a| a.value.clone()))
                .collect::<Vec<_>>(),
        ));
        let hosts = Arc::new(crate::workflow::named_hosts(&self.spec));
        let steps = &self.spec.steps;
        let mut dependents = vec![Vec::new(); steps.len()];
        for (i, needs) in self.graph.dependencies.iter().enumerate() {
            for &d in needs {
                dependents[d].push(i);
            }
        }
        let index = (steps.iter().enumerate())
            .map(|(i, s)| (s.id.value.clone(), i))
            .collect();
        let name = workflow_name(&self.spec, path);
        let mut cached_below: Vec<String> = Vec::new();
        for name in self.subworkflows.values().flat_map(|w| &w.cached) {
            if !cached_below.contains(name) {
                cached_below.push(name.clone());
            }
        }
        let mut cached = Vec::new();
        if steps
            .iter()
            .any(|s| s.cache.as_ref().is_some_and(|c| c.value.enabled()))
        {
            cached.push(name.clone());
        }
        for name in &cached_below {
            if !cached.contains(name) {
                cached.push(name.clone());
            }
        }
        Workflow {
            name,
            path: path.to_path_buf(),
            spec: Arc::new(self.spec),
            dependencies: self.graph.dependencies,
            dependents,
            index,
            cached,
            cached_below,
            order: self.graph.order,
            composites: self.composites,
            subworkflows: self.subworkflows,
            sources,
            tools: Arc::new(self.tools),
            network,
            hosts,
            mcp: self.mcp,
            skills: Arc::new(self.skills),
        }
    }
}

impl Validator {
    pub fn new(limits: Limits) -> Self {
        Validator {
            limits,
            analyzer: Arc::new(Analyzer::default()),
            sources: Sources::default(),
            loaded: HashMap::new(),
            stack: Vec::new(),
            preloaded: HashMap::new(),
            mcp_cache: None,
        }
    }

    /// Checks calls to MCP tools against the tool lists `archon mcp list` keeps in the state directory
    /// `dir`, and warns about each server with no list there.
    pub fn mcp_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.mcp_cache = Some(dir.into());
        self
    }

    pub fn validate_path(mut self, path: &Path) -> Validation {
        match self.read(path) {
            Ok(text) => self.validate_text(path.to_path_buf(), text),
            Err(diagnostic) => Validation {
                workflow: None,
                diagnostics: vec![diagnostic],
                sources: self.sources,
            },
        }
    }

    pub fn validate_text(mut self, path: PathBuf, text: String) -> Validation {
        let file = self.sources.add(path, text);
        let mut diagnostics = Vec::new();
        let spec = self.check_file(&file, &mut diagnostics, None);
        let workflow = match spec {
            Some(checked) if !diagnostics.iter().any(Diagnostic::is_error) => {
                Some(checked.into_workflow(&file.path, self.sources.clone()))
            }
            _ => None,
        };
        Validation {
            workflow,
            diagnostics,
            sources: self.sources,
        }
    }

    fn read(&mut self, path: &Path) -> Result<String, Diagnostic> {
        match crate::source::read_bounded(path, self.limits.max_file_bytes as u64) {
            Ok(bytes) => String::from_utf8(bytes).map_err(|_| {
                self.unreadable(path, format!("`{}` is not valid UTF-8", path.display()))
            }),
            Err(crate::source::ReadError::TooLarge(limit)) => {
                let size = std::fs::metadata(path).map_or(limit + 1, |m| m.len().max(limit + 1));
                let file = self.sources.add(path.to_path_buf(), String::new());
                Err(Diagnostic::error(
                    codes::FILE_TOO_LARGE,
                    Span::new(file.id, 0, 0),
                    format!("spec file is {size} bytes, more than the limit of {limit} bytes"),
                )
                .with_hint("split the workflow into sub-workflows (`workflow:` steps)"))
            }
            Err(e) => Err(self.unreadable(
                path,
                format!("cannot read `{}`: {}", path.display(), e.reason()),
            )),
        }
    }

    fn unreadable(&mut self, path: &Path, message: String) -> Diagnostic {
        let file = self.sources.add(path.to_path_buf(), String::new());
        Diagnostic::error(codes::UNREADABLE_FILE, Span::new(file.id, 0, 0), message)
    }

    /// Runs every stage on one file. Returns the spec (and its graph) if it could be built at all.
    ///
    /// For a plan written by the LLM planner, `plan` gives the workflow that planned it (whose
    /// declarations the plan's steps use) and what its steps may do.
    fn check_file(
        &mut self,
        file: &Arc<SourceFile>,
        diagnostics: &mut Vec<Diagnostic>,
        plan: Option<(&Workflow, &PlanPolicy)>,
    ) -> Option<Checked> {
        let (root, parse_diagnostics) = spec::parse(file, &self.limits);
        diagnostics.extend(parse_diagnostics);
        let root = root?;
        if !matches!(root.kind, NodeKind::Map(_)) {
            diagnostics.push(
                Diagnostic::error(
                    codes::WRONG_TYPE,
                    root.span,
                    format!(
                        "a {} must be a mapping of keys, found {}",
                        if plan.is_some() { "plan" } else { "workflow" },
                        root.type_name()
                    ),
                )
                .with_hint(if plan.is_some() {
                    "a plan is a mapping of `steps:` and, if it gives outputs, `outputs:`"
                } else {
                    "start with `name:` and `steps:`"
                }),
            );
            return None;
        }
        if plan.is_some() && !planned::only_plan_keys(&root, diagnostics) {
            return None;
        }
        let step_count = count_steps(&root);
        if step_count > self.limits.max_steps {
            let at = root.entry("steps").map_or(root.span, |(k, _)| k.span);
            let (what, hint) = if plan.is_some() {
                ("the plan", "plan fewer, larger steps")
            } else {
                (
                    "workflow",
                    "split the workflow into sub-workflows (`workflow:` steps)",
                )
            };
            diagnostics.push(
                Diagnostic::error(
                    codes::TOO_MANY_STEPS,
                    at,
                    format!(
                        "{what} has {step_count} steps, more than the limit of {}",
                        self.limits.max_steps
                    ),
                )
                .with_hint(hint),
            );
            return None;
        }
        let raw_step_ids = raw_step_ids(&root);
        let raw_repeating = raw_repeating(&root);
        let raw_step_count = root
            .get("steps")
            .and_then(Node::as_seq)
            .map_or(0, <[Node]>::len);
        let steps_key = root.entry("steps").map(|(k, _)| k.span);
        let toml = file.format == crate::source::Format::Toml;
        let mut spec: Spec =
            match spec::from_node(structure::check(&root, toml, diagnostics)?.as_ref()) {
                Ok(spec) => spec,
                Err(err) => {
                    diagnostics.push(Diagnostic::error(
                        codes::INVALID_VALUE,
                        root.span,
                        err.message,
                    ));
                    return None;
                }
            };
        // The tree (and its pruned copy, already gone) is as large as the spec: the semantic checks
        // below need neither, and a 10,000-step file would otherwise hold both through them.
        drop(root);
        if let Some((parent, _)) = plan {
            planned::adopt(&mut spec, &parent.spec);
        }
        let tools = Registry::new(&spec);
        let canonical = canonical(&file.path);
        self.stack.push(canonical);
        let analyzer = self.analyzer.clone();
        let mut checker = Checker {
            spec: &spec,
            tools: &tools,
            file,
            analyzer: &analyzer,
            diagnostics: Vec::new(),
            raw_repeating,
            raw_step_ids,
            raw_step_count,
            steps_key,
            argument_validators: HashMap::new(),
            valid_schemas: std::collections::HashSet::new(),
            composites: BTreeMap::new(),
            subworkflows: BTreeMap::new(),
            mcp: BTreeMap::new(),
            mcp_cache: self.mcp_cache.clone(),
            mcp_lists: BTreeMap::new(),
            mcp_unlisted: Vec::new(),
            planned: plan.is_some(),
            skills: crate::skills::Skills::default(),
        };
        let graph = checker.check_all(self);
        if let Some((_, policy)) = plan {
            checker.check_plan_policy(policy);
        }
        self.stack.pop();
        if !checker.diagnostics.iter().any(Diagnostic::is_error)
            && !diagnostics.iter().any(Diagnostic::is_error)
        {
            checker.diagnostics.append(&mut checker.mcp_unlisted);
        }
        diagnostics.append(&mut checker.diagnostics);
        let composites = std::mem::take(&mut checker.composites);
        let subworkflows = std::mem::take(&mut checker.subworkflows);
        let mcp = std::mem::take(&mut checker.mcp);
        let skills = std::mem::take(&mut checker.skills);
        Some(Checked {
            spec,
            graph,
            composites,
            subworkflows,
            tools,
            mcp,
            skills,
        })
    }

    /// Checks a sub-workflow referenced from `from` and returns what callers need, or a diagnostic for
    /// the reference itself (missing file, recursion).
    fn sub_workflow(
        &mut self,
        from: &SourceFile,
        reference: &spec::Spanned<String>,
        diagnostics: &mut Vec<Diagnostic>,
    ) -> Option<SubWorkflow> {
        if let Some(known) = self.preloaded.get(&reference.value) {
            return Some(known.clone());
        }
        let base = from.path.parent().unwrap_or(Path::new(""));
        let path = base.join(reference.as_str());
        if !path.is_file() {
            diagnostics.push(
                Diagnostic::error(
                    codes::FILE_NOT_FOUND,
                    reference.span,
                    format!("sub-workflow `{}` does not exist", reference.value),
                )
                .with_hint(format!(
                    "paths are relative to this spec's directory; looked for `{}`",
                    path.display()
                )),
            );
            return None;
        }
        let canonical = canonical(&path);
        if let Some(pos) = self.stack.iter().position(|p| *p == canonical) {
            let chain: Vec<String> = self.stack[pos..]
                .iter()
                .chain(std::iter::once(&canonical))
                .map(|p| {
                    format!(
                        "`{}`",
                        p.file_name().map_or_else(
                            || p.display().to_string(),
                            |n| n.to_string_lossy().into_owned()
                        )
                    )
                })
                .collect();
            diagnostics.push(
                Diagnostic::error(
                    codes::RECURSIVE_WORKFLOW,
                    reference.span,
                    format!(
                        "sub-workflow `{}` includes itself: {}",
                        reference.value,
                        chain.join(" → ")
                    ),
                )
                .with_hint("a workflow cannot run itself, directly or through other workflows"),
            );
            return None;
        }
        if let Some(known) = self.loaded.get(&canonical) {
            return Some(known.clone());
        }
        let text = match self.read(&path) {
            Ok(text) => text,
            Err(d) => {
                diagnostics.push(d);
                return None;
            }
        };
        let file = self.sources.add(path, text);
        let mut inner = Vec::new();
        let spec = self.check_file(&file, &mut inner, None);
        let valid = !inner.iter().any(Diagnostic::is_error);
        let inputs = spec
            .as_ref()
            .map(|checked| {
                checked
                    .spec
                    .inputs
                    .iter()
                    .map(|(name, schema)| (name.value.clone(), schema.get("default").is_none()))
                    .collect()
            })
            .unwrap_or_default();
        if !valid {
            diagnostics.push(
                Diagnostic::error(
                    codes::INVALID_SUBWORKFLOW,
                    reference.span,
                    format!("sub-workflow `{}` is not valid", reference.value),
                )
                .with_hint("its own errors are listed with its file name"),
            );
        }
        diagnostics.extend(inner);
        let workflow = spec
            .filter(|_| valid)
            .map(|checked| Arc::new(checked.into_workflow(&file.path, self.sources.clone())));
        let info = SubWorkflow { inputs, workflow };
        self.loaded.insert(canonical, info.clone());
        Some(info)
    }
}

/// The semantic checks for one spec, writing diagnostics as it goes.
/// Most combinations a step's `matrix` may make: a product of lists grows fast, and each combination is
/// a run of the step.
pub const MAX_COMBINATIONS: usize = 10_000;

pub(crate) struct Checker<'a> {
    pub spec: &'a Spec,
    /// The tools the spec can call: built-ins and its declarations.
    pub tools: &'a Registry,
    pub file: &'a SourceFile,
    pub analyzer: &'a Analyzer,
    pub diagnostics: Vec<Diagnostic>,
    /// Every step id written in the file, even in steps the structural check dropped, so that a broken
    /// step does not also produce "unknown step" errors for everything that refers to it.
    pub raw_step_ids: Vec<String>,
    /// How many steps were written, even if the structural check dropped some.
    pub raw_step_count: usize,
    /// Where the ids of steps written with `foreach` or `matrix` are, even if the structural check
    /// dropped the value: their `item` is not reported as outside a loop.
    pub raw_repeating: Vec<Span>,
    /// Where the `steps` key is written, if it is.
    pub steps_key: Option<Span>,
    /// Embedded JSON Schemas already found valid (as JSON text), so repeated schemas are checked once.
    pub valid_schemas: std::collections::HashSet<String>,
    /// Compiled argument schemas, by tool and argument name, so each is compiled once per file.
    pub argument_validators: HashMap<(String, String), Option<jsonschema::Validator>>,
    /// The step graph of each composite tool checked so far.
    pub composites: BTreeMap<String, StepGraph>,
    /// The valid sub-workflows referenced so far, by the path as written.
    pub subworkflows: BTreeMap<String, Arc<Workflow>>,
    /// The MCP servers it declares, resolved (`tools: NAME: { mcp: ... }`).
    pub mcp: BTreeMap<String, Arc<crate::tools::mcp::ServerDef>>,
    /// Where MCP tool lists are kept, if calls to MCP tools are checked against them.
    pub mcp_cache: Option<PathBuf>,
    /// The tool list kept for each MCP server, by server name (`None`: not listed yet); empty when
    /// `mcp_cache` is `None`.
    pub mcp_lists: BTreeMap<String, Option<Arc<crate::tools::mcp::cache::CachedTools>>>,
    /// A warning for each MCP server with no tool list, reported only for a spec without errors (where
    /// listing the server is the next thing to do).
    pub mcp_unlisted: Vec<Diagnostic>,
    /// The spec is a plan written by the LLM planner: its templates may not read `env` or `secrets`.
    pub planned: bool,
    /// The skills each agent may use (`check_skills`).
    pub skills: crate::skills::Skills,
}

impl Checker<'_> {
    /// A hint's example in the file's own syntax: `yaml`, or `toml` for a TOML file.
    pub(crate) fn syntax<'t>(&self, yaml: &'t str, toml: &'t str) -> &'t str {
        if self.file.format == crate::source::Format::Toml {
            toml
        } else {
            yaml
        }
    }

    fn check_all(&mut self, validator: &mut Validator) -> graph::Graph {
        self.check_name();
        self.check_inputs();
        self.check_env_and_secrets();
        self.check_triggers();
        self.check_network();
        self.check_llm();
        // Before agents and rules, whose tool patterns may name MCP tools.
        self.check_mcp_servers();
        self.check_agents();
        self.check_skills(validator);
        self.check_memory();
        self.check_defaults();
        self.check_tools(validator);
        let graph = self.check_steps(validator);
        self.check_rules();
        self.check_workflow_outputs();
        graph
    }

    pub(crate) fn push(&mut self, diagnostic: Diagnostic) {
        self.diagnostics.push(diagnostic);
    }

    /// Checks a sub-workflow reference and keeps the workflow for the run.
    pub(crate) fn load_sub_workflow(
        &mut self,
        reference: &spec::Spanned<String>,
        validator: &mut Validator,
    ) -> Option<SubWorkflow> {
        let sub = validator.sub_workflow(self.file, reference, &mut self.diagnostics)?;
        if let Some(workflow) = &sub.workflow {
            self.subworkflows
                .insert(reference.value.clone(), workflow.clone());
        }
        Some(sub)
    }
}

/// The workflow's name: `name`, or the file stem.
fn workflow_name(spec: &Spec, path: &Path) -> String {
    spec.name
        .as_ref()
        .map(|n| n.value.clone())
        .unwrap_or_else(|| {
            path.file_stem().map_or_else(
                || "workflow".to_owned(),
                |s| s.to_string_lossy().into_owned(),
            )
        })
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Steps in the document, composite tool steps included, counted before any other check.
fn count_steps(root: &Node) -> usize {
    let top = root
        .get("steps")
        .and_then(Node::as_seq)
        .map_or(0, <[Node]>::len);
    let composite: usize = root
        .get("tools")
        .and_then(Node::as_map)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|(_, t)| t.get("steps").and_then(Node::as_seq))
                .map(<[Node]>::len)
                .sum()
        })
        .unwrap_or(0);
    top + composite
}

fn raw_repeating(root: &Node) -> Vec<Span> {
    let tools = root.get("tools").and_then(Node::as_map).unwrap_or_default();
    std::iter::once(root)
        .chain(tools.iter().map(|(_, tool)| tool))
        .filter_map(|holder| holder.get("steps")?.as_seq())
        .flatten()
        .filter(|step| step.get("foreach").is_some() || step.get("matrix").is_some())
        .filter_map(|step| Some(step.get("id")?.span))
        .collect()
}

fn raw_step_ids(root: &Node) -> Vec<String> {
    root.get("steps")
        .and_then(Node::as_seq)
        .map(|steps| {
            steps
                .iter()
                .filter_map(|s| s.get("id")?.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
