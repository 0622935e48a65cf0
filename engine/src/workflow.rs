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
}

/// The dependency graph of one list of steps.
#[derive(Debug, Clone, Default)]
pub struct StepGraph {
    /// For each step (by index in its list), the indexes of the steps it depends on.
    pub dependencies: Vec<Vec<usize>>,
    /// Step indexes in a topological order.
    pub order: Vec<usize>,
}
