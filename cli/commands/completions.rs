//! `archon completions SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell.

use clap::CommandFactory;

use super::Status;
use crate::args::{Cli, CompletionsArgs};
use crate::output;

pub fn completions(args: &CompletionsArgs) -> anyhow::Result<Status> {
    // clap_complete offers hidden subcommands too: the internal helpers (`__jq`, `__render`) are left out
    // of the command the script is made from.
    let cli = Cli::command();
    let mut command = clap::Command::new("archon")
        .version(env!("CARGO_PKG_VERSION"))
        .args(cli.get_arguments().cloned())
        .subcommands(cli.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    output::stdout_with(|out| {
        clap_complete::generate(args.shell, &mut command, "archon", out);
        Ok(())
    });
    Ok(Status::Success)
}
