//! `archon __jq`: the helper process in which a running `archon` evaluates a jq filter, so that a
//! runaway filter can be killed and cannot abort the run.

use std::io::Read;

use super::Status;
use crate::output;

/// Reads the request on standard input and writes the answer on standard output.
pub fn jq() -> anyhow::Result<Status> {
    let mut request = Vec::new();
    std::io::stdin().read_to_end(&mut request)?;
    output::stdout(&archon_engine::tools::builtin::jq::serve(&request));
    Ok(Status::Success)
}
