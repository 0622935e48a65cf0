//! `archon __jq` and `archon __render`: the helper processes in which a running `archon` evaluates a jq
//! filter or renders a template that is not plain, so that a runaway one can be killed and cannot abort
//! the run or exhaust its memory.

use std::io::Read;

use super::Status;
use crate::output;

/// Reads the request on standard input, and writes the answer `serve` gives on standard output.
pub fn serve(serve: fn(&[u8]) -> String) -> anyhow::Result<Status> {
    let mut request = Vec::new();
    std::io::stdin().read_to_end(&mut request)?;
    output::stdout(&serve(&request));
    Ok(Status::Success)
}
