//! Tools: the built-in catalog (names, argument schemas, safety) and what every call may do: whether it
//! is sensitive (asks a person when an LLM chose it) and whether it is safe to repeat after a crash.

pub mod builtin;
mod safety;

pub use safety::{Safety, SafetyRule, body_is_idempotent, reads_only, sensitive, step_idempotent};
