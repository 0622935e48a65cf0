//! Tests: workflows.
