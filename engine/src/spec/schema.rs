//! The JSON Schema of the spec format, generated from the spec types (checked in as
//! `schemas/workflow.schema.json`; regenerate with `cargo run -- schema > schemas/workflow.schema.json`).

use std::sync::OnceLock;

use serde_json::Value as Json;

use crate::spec::Spec;

/// The workflow JSON Schema (draft 2020-12), generated once per process.
pub fn workflow_schema() -> &'static Json {
    static SCHEMA: OnceLock<Json> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
        generator.into_root_schema_for::<Spec>().to_value()
    })
}

/// The schema as pretty JSON with a trailing newline, exactly as checked in.
pub fn workflow_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(workflow_schema()).unwrap_or_default();
    text.push('\n');
    text
}
