//! `archon completions SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell.

use clap::CommandFactory;

use super::Status;
use crate::args::{Cli, CompletionsArgs};
use crate::output;

pub fn completions(args: &CompletionsArgs) -> anyhow::Result<Status> {
    let mut command = Cli::command();
    output::stdout_with(|out| {
        clap_complete::generate(args.shell, &mut command, "archon", out);
        Ok(())
    });
    Ok(Status::Success)
}
