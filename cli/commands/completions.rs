//! `archon completions SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell.

use clap::CommandFactory;

use super::Status;
use crate::args::{Cli, CompletionsArgs};
use crate::output;

pub fn completions(args: &CompletionsArgs) -> anyhow::Result<Status> {
    // clap_complete offers hidden subcommands too: the script is made from the commands a person types,
    // without archon's internal helpers (`__jq`, `__render`).
    let full = Cli::command();
    let mut command = clap::Command::new("archon")
        .version(env!("CARGO_PKG_VERSION"))
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    // clap_complete panics when its writer fails (a closed pipe: `archon completions bash | head`), so the
    // script is made in memory and written as any output is.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "archon", &mut script);
    output::stdout_with(|out| out.write_all(&script));
    Ok(Status::Success)
}
