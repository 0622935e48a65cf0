//! The validated workflow: a spec whose references, kinds and graph are known to be sound.

use std::sync::Arc;

use crate::source::Sources;
use crate::spec::Spec;

/// A spec that passed validation, with its dependency graph resolved.
#[derive(Debug, Clone)]
pub struct Workflow {
    pub name: String,
    pub spec: Arc<Spec>,
    /// For each step (by index in `spec.steps`), the indexes of the steps it depends on.
    pub dependencies: Vec<Vec<usize>>,
    /// Step indexes in a topological order.
    pub order: Vec<usize>,
    /// Every file the workflow was read from (the spec and its sub-workflows).
    pub sources: Sources,
}
