//! Running a validated workflow: every ready step starts at once (bounded by `max_parallel`), data flows
//! through templates rendered once, and every step ends with a [`StepResult`].
//!
//! Semantics, documented in docs/run.md: a step without `if` runs when all its dependencies succeeded and is
//! skipped otherwise; an explicit `if` replaces that rule. A failed step fails the run unless it has
//! `on_error: continue`; steps that do not depend on it keep running. `retry.attempts` counts every attempt.

pub mod dry_run;
pub mod mcp;
pub mod memory;
mod options;
pub mod redact;
pub mod render;
pub mod rules;
mod scheduler;
pub mod secrets;

pub use crate::report::{
    ApprovalDecision, ApprovalRequest, LlmUsage, REPORT_VERSION, RunEvent, RunReport, RunStatus,
    StepResult, StepStatus,
};
pub use dry_run::{Decision, DryRun, DryStep, dry_run};
pub use options::{
    Approvals, Approver, Cassette, MAX_DEPTH, MemoryFiles, Refresh, RunOptions, StepCache,
};
pub use scheduler::{RunError, delegation_tool, run, run_step};
