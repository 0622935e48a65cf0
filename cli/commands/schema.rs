//! `archon schema`: print the workflow JSON Schema.

use archon_engine::spec::schema::workflow_schema_text;

use super::Status;
use crate::output;

pub fn run() -> anyhow::Result<Status> {
    output::stdout(&workflow_schema_text());
    Ok(Status::Success)
}
