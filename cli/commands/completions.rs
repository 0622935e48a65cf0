//! `archon completions SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell.

use clap::CommandFactory;

use super::Status;
use crate::args::{Cli, CompletionsArgs};
use crate::output;

pub fn completions(args: &CompletionsArgs) -> anyhow::Result<Status> {
    let mut command = Cli::command();
    // clap_complete panics when its writer fails (a closed pipe: `archon completions bash | head`), so the
    // script is made in memory and written as any output is.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "archon", &mut script);
    output::stdout_with(|out| out.write_all(&script));
    Ok(Status::Success)
}
