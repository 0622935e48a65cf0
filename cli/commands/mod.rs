//! One module per subcommand, and the exit statuses they share.

mod cache;
mod completions;
mod dry_run;
mod helper;
mod init;
mod llm;
mod load;
mod logs;
mod mcp;
mod mcp_serve;
mod memory;
mod plan;
mod prune;
mod run;
mod runs;
mod schema;
mod serve;
mod serving;
mod skills;
mod target;
mod tools;
mod validate;
mod version;
pub mod when;
mod worker;
mod workers;

use std::process::ExitCode;

use crate::args::{
    CacheCommand, Cli, Command, LlmCommand, McpCommand, MemoryCommand, SkillsCommand,
};

/// How a command ended, mapped to the documented exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// 0: everything worked.
    Success,
    /// 1: the command failed at run time.
    Failure,
    /// 2: invalid spec, input or usage.
    Invalid,
    /// 3: paused, waiting for a person's approval.
    WaitingApproval,
    /// 130: interrupted.
    Interrupted,
}

impl From<Status> for ExitCode {
    fn from(status: Status) -> ExitCode {
        ExitCode::from(match status {
            Status::Success => 0,
            Status::Failure => 1,
            Status::Invalid => 2,
            Status::WaitingApproval => 3,
            Status::Interrupted => 130,
        })
    }
}

pub fn run(cli: Cli) -> anyhow::Result<Status> {
    match cli.command {
        Command::Validate(args) => validate::run(&args, cli.color),
        Command::Run(args) => run::run(&args, cli.color),
        Command::Plan(args) => plan::run(&args, cli.color),
        Command::Runs(args) => runs::runs(&args, cli.color),
        Command::Show(args) => runs::show(&args, cli.color),
        Command::Logs(args) => logs::logs(&args, cli.color),
        Command::Resume(args) => runs::resume(&args, cli.color),
        Command::Retry(args) => runs::retry(&args, cli.color),
        Command::Cancel(args) => runs::cancel(&args),
        Command::Approve(args) => runs::approve(&args),
        Command::Resolve(args) => runs::resolve(&args),
        Command::Llm(LlmCommand::Ping(args)) => llm::ping(&args),
        Command::Cache(CacheCommand::Ls(args)) => cache::ls(&args),
        Command::Cache(CacheCommand::Clear(args)) => cache::clear(&args),
        Command::Mcp(McpCommand::List(args)) => mcp::list(&args, cli.color),
        Command::Mcp(McpCommand::Serve(args)) => mcp_serve::serve(&args),
        Command::Serve(args) => serve::serve(&args),
        Command::Worker(args) => worker::work(&args, cli.color),
        Command::Workers(args) => workers::workers(&args),
        Command::Memory(MemoryCommand::Ls(args)) => memory::ls(&args),
        Command::Memory(MemoryCommand::Search(args)) => memory::search(&args),
        Command::Memory(MemoryCommand::Show(args)) => memory::show(&args),
        Command::Memory(MemoryCommand::Forget(args)) => memory::forget(&args),
        Command::Memory(MemoryCommand::Export(args)) => memory::export(&args),
        Command::Memory(MemoryCommand::Import(args)) => memory::import(&args),
        Command::Skills(SkillsCommand::Ls(args)) => skills::ls(&args, cli.color),
        Command::Schema => schema::run(),
        Command::Init(args) => init::init(&args),
        Command::Tools(args) => tools::tools(&args, cli.color),
        Command::Prune(args) => prune::prune(&args),
        Command::Completions(args) => completions::completions(&args),
        Command::Version(args) => version::version(&args),
        Command::Jq => helper::serve(archon_engine::tools::builtin::jq::serve),
        Command::Render => helper::serve(archon_engine::run::render::helper::serve),
    }
}
