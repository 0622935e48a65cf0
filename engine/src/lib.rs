//! The Archon engine: turns workflow spec files into validated workflows (and, later, runs them).
//!
//! The modules follow the pipeline: [`source`] (files and spans) -> [`spec`] (the spec as written, with
//! spans) -> [`validate`] (every problem, as [`diagnostic`]s) -> [`workflow`] (the validated model).
//! The library never prints; rendering belongs to the CLI.

pub mod diagnostic;
pub mod freeze;
pub mod goal;
pub mod idempotence;
pub mod inputs;
pub mod llm;
pub mod network;
pub mod plan;
pub mod process;
pub mod record;
pub mod redact;
pub mod report;
pub mod resume;
pub mod run;
pub mod session;
pub mod skills;
pub mod source;
pub mod spec;
pub mod store;
#[cfg(test)]
mod testing;
pub mod text;
pub mod tools;
pub mod trigger;
pub mod validate;
pub mod workflow;

pub use diagnostic::{Diagnostic, Label, Severity};
pub use source::{FileId, SourceFile, Sources, Span};
pub use validate::{Validation, validate_file, validate_source};
pub use workflow::Workflow;
