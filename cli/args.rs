//! Command-line arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Declarative agentic workflows: validate and run YAML or TOML workflow specs.
#[derive(Debug, Parser)]
#[command(name = "archon", version, about, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// When to use color in output (`NO_COLOR` is respected in `auto`).
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, global = true)]
    pub color: ColorChoice,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check workflow specs and report every problem, with file, line and column.
    Validate(ValidateArgs),
    /// Run a workflow: steps start as soon as their dependencies finish, in parallel.
    Run(RunArgs),
    /// Show how a workflow would run: each step's kind and the waves of steps that run together.
    Plan(PlanArgs),
    /// List the runs in the state directory, newest first.
    Runs(RunsArgs),
    /// Show one run: its steps, attempts, outputs and (with `--events`) its event log.
    Show(ShowArgs),
    /// Print what a run's commands wrote: stdout to standard output, stderr to standard error.
    Logs(LogsArgs),
    /// Resume an interrupted run: finished steps are reused, the rest run.
    Resume(ResumeArgs),
    /// Run a step of a finished run again, and everything downstream of it, as new attempts.
    Retry(RetryArgs),
    /// Stop a run for good: its owner is told to stop; a run nobody owns is marked cancelled.
    Cancel(CancelArgs),
    /// Approve (or deny) the calls a paused run waits for; `archon resume` then continues it.
    Approve(ApproveArgs),
    /// Record what became of a step in doubt (it was running when the run stopped, and left no result),
    /// so that `archon resume` goes on from there instead of refusing.
    Resolve(ResolveArgs),
    /// Work with LLM providers.
    #[command(subcommand)]
    Llm(LlmCommand),
    /// List or clear the cached results of steps with `cache`.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// MCP: list a workflow's MCP servers and their tools, or serve workflows as MCP tools.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Serve the dashboard and the HTTP API over the workflows under DIR and the runs of the state
    /// directory.
    Serve(ServeArgs),
    /// Run the steps of runs submitted with `archon run --submit` to a PostgreSQL store, until stopped
    /// (SIGTERM or Ctrl-C: no more steps are claimed, the running ones finish).
    Worker(WorkerArgs),
    /// List the live workers of a PostgreSQL store: each one's host, process, labels, concurrency, the
    /// steps it holds now, and when it was last seen.
    Workers(WorkersArgs),
    /// Long-term memory of agents: list, search, show, forget, export and import memories.
    #[command(subcommand)]
    Memory(MemoryCommand),
    /// Agent Skills: what each agent of a workflow would see.
    #[command(subcommand)]
    Skills(SkillsCommand),

    /// Print the JSON Schema of the workflow format.
    Schema,

    /// Write a commented starter workflow that validates and runs as it is.
    Init(InitArgs),
    /// List the tools a workflow can call: the built-ins, and a spec's own, with their arguments.
    Tools(ToolsArgs),
    /// Delete finished runs older than a given age, with everything they recorded.
    Prune(PruneArgs),
    /// Print a shell completion script for `archon`.
    Completions(CompletionsArgs),
    /// Print the version, and what a bug report needs: store schema, target and build profile.
    Version(VersionArgs),

    /// Evaluates one jq filter for a running `archon`, in a process of its own (internal).
    #[command(name = "__jq", hide = true)]
    Jq,

    /// Renders one template for a running `archon`, in a process of its own (internal).
    #[command(name = "__render", hide = true)]
    Render,
}

/// A workflow file and its inputs, as `plan` and `run` take them.
#[derive(Debug, clap::Args)]
pub struct WorkflowArgs {
    /// The workflow spec (YAML, or TOML when it ends in `.toml`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// An input value, `name=value`, coerced by the input's declared type (repeatable).
    #[arg(long = "input", value_name = "NAME=VALUE")]
    pub inputs: Vec<String>,

    /// A JSON or YAML file of input values (`--input` wins over it).
    #[arg(long = "inputs", value_name = "FILE")]
    pub inputs_file: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub workflow: WorkflowArgs,

    /// Output format.
    #[arg(long, value_enum, default_value_t = PlanFormat::Text)]
    pub format: PlanFormat,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The workflow spec (YAML, or TOML when it ends in `.toml`).
    #[arg(value_name = "FILE", required_unless_present = "goal")]
    pub file: Option<PathBuf>,

    /// Run a goal with no spec: the LLM planner writes the steps (with the read-only built-in tools), and
    /// the provider comes from the environment (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY` or
    /// `OPENAI_BASE_URL`). The generated spec is kept in the state directory.
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["file", "inputs", "inputs_file"])]
    pub goal: Option<String>,

    /// An input value, `name=value`, coerced by the input's declared type (repeatable).
    #[arg(long = "input", value_name = "NAME=VALUE")]
    pub inputs: Vec<String>,

    /// A JSON or YAML file of input values (`--input` wins over it).
    #[arg(long = "inputs", value_name = "FILE")]
    pub inputs_file: Option<PathBuf>,

    /// Run nothing: validate, then show each wave and each step's rendered arguments (secrets masked),
    /// what is known only at run time marked as such; no run is recorded.
    #[arg(
        long,
        conflicts_with_all = ["goal", "save_plan", "record", "replay", "events", "yes", "no_input", "max_parallel"]
    )]
    pub dry_run: bool,

    /// After the run, write the workflow with every plan its planner steps made frozen into ordinary
    /// steps (YAML; TOML for `.toml`; JSON for `.json`): it validates and re-runs without the planner.
    #[arg(long, value_name = "FILE")]
    pub save_plan: Option<PathBuf>,

    /// Most steps, and most commands and LLM calls, running at once [default: the spec's
    /// `defaults.max_parallel`, else 16]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_parallel: Option<u32>,

    /// The workspace commands run in (default: the spec's directory).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    #[command(flatten)]
    pub output: RunOutputArgs,

    #[command(flatten)]
    pub state: StateArgs,

    /// Write every LLM request and response of the run to this cassette.
    #[arg(long, value_name = "FILE", conflicts_with = "replay")]
    pub record: Option<PathBuf>,

    /// Answer every LLM request from this cassette, with no network; a request it does not hold fails.
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,

    /// Record the run for workers (`archon worker`) on the PostgreSQL store and print its id, running
    /// nothing here.
    #[arg(
        long,
        conflicts_with_all = ["goal", "dry_run", "save_plan", "record", "replay", "json", "events", "yes", "no_input", "no_cache", "labels"]
    )]
    pub submit: bool,

    /// With `--submit`: follow the run's events until it ends, then show it and exit as `archon run`
    /// would (0 succeeded, 1 failed, 130 cancelled or interrupted).
    #[arg(long, requires = "submit")]
    pub wait: bool,
}

/// `archon worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Most steps this worker runs at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,

    /// How long this worker's hold on a step lasts unless renewed (every third of it, while the step
    /// runs): a worker that stops or loses the database loses its steps to others after it.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = lease)]
    pub lease: std::time::Duration,

    /// How long the steps under way may go on once the worker is asked to stop (SIGTERM, Ctrl-C);
    /// then they are stopped and handed back to the other workers. A second signal stops them at once.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = drain)]
    pub drain: std::time::Duration,

    /// Labels this worker has, comma separated (`gpu,eu`): it takes only steps whose `runs_on` labels
    /// (with their tools') are all among them. Default: none (steps without `runs_on` only).
    #[arg(long, value_name = "LABELS", value_delimiter = ',', value_parser = label)]
    pub labels: Vec<String>,

    /// Most steps running at once on all workers together: this worker takes a step only while fewer
    /// than this many run (on any worker). Default: no limit.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub global_limit: Option<u32>,

    #[command(flatten)]
    pub state: StateArgs,
}

/// `archon workers`.
#[derive(Debug, clap::Args)]
pub struct WorkersArgs {
    /// Print the workers as a JSON array.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

fn drain(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("`{text}`: {e}"))
}

fn lease(text: &str) -> Result<std::time::Duration, String> {
    let lease = humantime::parse_duration(text).map_err(|e| format!("`{text}`: {e}"))?;
    if lease < std::time::Duration::from_millis(300) {
        return Err(format!(
            "`{text}` is shorter than the shortest lease, `300ms`"
        ));
    }
    Ok(lease)
}

/// How a run shows its progress and result.
#[derive(Debug, clap::Args)]
pub struct RunOutputArgs {
    /// Print the final run report as JSON on standard output.
    #[arg(long)]
    pub json: bool,

    /// Append every run event as a JSON line to this file.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,

    /// Approve every call that asks for approval, without asking; each approval is recorded as given by
    /// `--yes`.
    #[arg(long)]
    pub yes: bool,

    /// Never prompt: a call that asks for approval pauses the run (exit 3) for `archon approve`.
    #[arg(long, conflicts_with = "yes")]
    pub no_input: bool,

    /// Run every step even when its result is cached; the results of steps with `cache` that succeed
    /// replace their cached ones.
    #[arg(long)]
    pub no_cache: bool,

    /// Labels this process has, comma separated (`gpu,eu`): a step whose `runs_on` (or whose tool's)
    /// needs one it lacks fails the run before any step starts. Default: none.
    #[arg(long, value_name = "LABELS", value_delimiter = ',', value_parser = label)]
    pub labels: Vec<String>,
}

fn label(text: &str) -> Result<String, String> {
    if archon_engine::validate::is_label(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "`{text}` is not a valid label: use lowercase letters, digits, `_` and `-`"
        ))
    }
}

#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// Show the skills each agent would be offered: the catalog in its prompt and its token cost.
    Ls(SkillsLsArgs),
}

#[derive(Debug, clap::Args)]
pub struct SkillsLsArgs {
    /// The workflow spec; without it, the project skills in `.agents/skills/` here.
    #[arg(value_name = "SPEC")]
    pub file: Option<PathBuf>,

    /// Print the agents, their catalogs and skills as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum McpCommand {
    /// Start a workflow's MCP servers, list their tools, and keep the lists for `archon validate`.
    List(McpListArgs),
    /// Serve the workflows under PATH as MCP tools, over stdio or streamable HTTP.
    Serve(McpServeArgs),
}

#[derive(Debug, clap::Args)]
pub struct McpListArgs {
    /// The workflow spec whose MCP servers are listed.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Print the servers and their tools as JSON.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct McpServeArgs {
    /// Spec files or directories of spec files to serve (default: the current directory).
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,

    /// Serve streamable HTTP on this address (such as `127.0.0.1:8808`) instead of stdio. An address
    /// other than loopback needs a bearer token (`ARCHON_MCP_TOKEN` or `--token-file`).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,

    /// A file holding the bearer token HTTP clients must send (instead of `ARCHON_MCP_TOKEN`).
    #[arg(long, value_name = "FILE", requires = "http")]
    pub token_file: Option<PathBuf>,

    /// Most runs going on at once; further calls wait for one to end.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_runs: u32,

    /// Labels this server has, comma separated (`gpu,eu`), for the run of every call: a run whose steps'
    /// `runs_on` (or their tools') need one it lacks fails before any step starts. Default: none.
    #[arg(long, value_name = "LABELS", value_delimiter = ',', value_parser = label)]
    pub labels: Vec<String>,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The directory (or spec file) of the workflows to serve (default: the current directory).
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// The address to listen on. An address other than loopback needs a token (`ARCHON_SERVE_TOKEN` or
    /// `--token-file`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub bind: std::net::IpAddr,

    /// The port to listen on (0: any free port; the address is printed on standard error).
    #[arg(long, value_name = "N", default_value_t = 8700)]
    pub port: u16,

    /// A file of tokens, one per line: `operator TOKEN` or `viewer TOKEN` (instead of
    /// `ARCHON_SERVE_TOKEN`, which holds one operator token).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// Most runs going on at once; further runs wait in a queue, shown as `queued`.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_runs: u32,

    /// Most runs waiting in the queue; beyond it, new runs and webhook deliveries are refused (`503`),
    /// deliveries without being recorded.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub max_queue: u32,

    /// Most connections open at once; a further one waits, unanswered, until one closes. Each holds a
    /// file descriptor: keep it well under the open-file limit (`ulimit -n`).
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_connections: u32,

    /// Milliseconds a connection has to send a request's headers (from when it opens, or from the
    /// end of its previous request) before it is closed. For tests.
    #[arg(long, value_name = "MS", default_value_t = 30_000, hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,

    /// Labels this server has, comma separated (`gpu,eu`), for every run it starts (API, dashboard,
    /// triggers): a run whose steps' `runs_on` (or their tools') need one it lacks fails before any step
    /// starts. Default: none.
    #[arg(long, value_name = "LABELS", value_delimiter = ',', value_parser = label)]
    pub labels: Vec<String>,

    /// Print the OpenAPI document of the HTTP API and exit (`schemas/openapi.json` is this).
    #[arg(long)]
    pub openapi: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List the cached step results, newest first.
    Ls(CacheLsArgs),
    /// Remove cached step results: all of them, or those the options select.
    Clear(CacheClearArgs),
}

#[derive(Debug, clap::Args)]
pub struct CacheLsArgs {
    /// Print the entries as a JSON array.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct CacheClearArgs {
    /// Only the results of this workflow.
    #[arg(long, value_name = "WORKFLOW")]
    pub workflow: Option<String>,

    /// Only the results of steps with this id.
    #[arg(long, value_name = "STEP")]
    pub step: Option<String>,

    /// Only the results whose `ttl` has passed.
    #[arg(long)]
    pub expired: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

/// Where runs are kept.
#[derive(Debug, clap::Args)]
pub struct StateArgs {
    /// The state directory (default: `.archon` in the current directory).
    #[arg(long, value_name = "DIR", env = "ARCHON_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Keep runs in this PostgreSQL database (`postgres://USER@HOST/DB`) instead of the state
    /// directory, which still holds local files.
    #[arg(long, value_name = "URL", env = "ARCHON_STORE", hide_env_values = true)]
    pub store: Option<String>,
}

impl StateArgs {
    pub fn dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(".archon"))
    }

    /// Where runs are kept: the state directory's store, or the database `--store` names.
    pub fn at(&self) -> archon_engine::session::StoreAt {
        archon_engine::session::StoreAt {
            state_dir: self.dir(),
            url: self.store.clone().filter(|url| !url.is_empty()),
        }
    }

    /// How messages name where runs are kept.
    pub fn shown(&self) -> String {
        self.at().shown()
    }
}

/// Which run a command is about: an id, a prefix of one, or `--last`.
#[derive(Clone, Debug, clap::Args)]
pub struct RunTarget {
    /// The run id, as `archon runs` lists it, or enough of its start to name one run.
    #[arg(value_name = "RUN", required_unless_present = "last")]
    pub run: Option<String>,

    /// The newest run (of `--workflow`, when given), instead of a RUN.
    #[arg(long)]
    pub last: bool,

    /// With `--last`: the newest run of this workflow.
    #[arg(long, value_name = "NAME")]
    pub workflow: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct RunsArgs {
    /// Print the runs as a JSON array.
    #[arg(long)]
    pub json: bool,

    /// Only runs in this state (repeatable).
    #[arg(long, value_enum, value_name = "STATE", conflicts_with = "check")]
    pub status: Vec<RunStatusArg>,

    /// Only runs of the workflow with this name.
    #[arg(long, value_name = "NAME", conflicts_with = "check")]
    pub workflow: Option<String>,

    /// Only runs started since then: a duration back from now (`2h`, `3d`, `1w`), a date (`2026-11-01`,
    /// midnight UTC) or a time (`2026-11-01T09:30:00Z`).
    #[arg(long, value_name = "WHEN", value_parser = crate::commands::when::parse_since, conflicts_with = "check")]
    pub since: Option<u64>,

    /// At most this many runs, the newest.
    #[arg(long, value_name = "N", conflicts_with = "check", value_parser = runs_limit)]
    pub limit: Option<usize>,

    /// Read the whole store instead: check every page and decode every row of every run, list what is
    /// damaged, and fail when anything is.
    #[arg(long, conflicts_with = "json")]
    pub check: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub run: RunTarget,

    /// Print everything stored about the run as JSON.
    #[arg(long)]
    pub json: bool,

    /// Print the run's event log as a readable trail, each event with its time (as JSON inside `--json`).
    #[arg(long)]
    pub events: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    #[command(flatten)]
    pub run: RunTarget,

    /// Only this step's commands (a `foreach` step's items too, or one item as `step[2]`).
    #[arg(value_name = "STEP")]
    pub step: Option<String>,

    /// Only this attempt (default: each step's last).
    #[arg(long, value_name = "N")]
    pub attempt: Option<u32>,

    /// Keep printing what the commands write until the run ends.
    #[arg(long, short = 'f')]
    pub follow: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

/// What resuming or retrying a run may accept.
#[derive(Debug, clap::Args)]
pub struct ContinueArgs {
    /// Run again steps whose last attempt was in flight when the run stopped, even if repeating them is
    /// not known to be safe.
    #[arg(long)]
    pub rerun_in_doubt: bool,

    /// Continue even though the spec changed since the run started; changed steps run again.
    #[arg(long)]
    pub allow_changed_spec: bool,

    /// Most steps running at once (default: what the run was started with).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_parallel: Option<u32>,

    #[command(flatten)]
    pub output: RunOutputArgs,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    #[command(flatten)]
    pub run: RunTarget,

    #[command(flatten)]
    pub options: ContinueArgs,
}

#[derive(Debug, clap::Args)]
pub struct RetryArgs {
    #[command(flatten)]
    pub run: RunTarget,

    /// The step to run again; every step downstream of it runs again too.
    #[arg(
        long,
        value_name = "STEP",
        required_unless_present = "failed",
        conflicts_with = "failed"
    )]
    pub from: Option<String>,

    /// Run again only the steps that failed, and the steps skipped because of them.
    #[arg(long)]
    pub failed: bool,

    #[command(flatten)]
    pub options: ContinueArgs,
}

#[derive(Debug, clap::Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub run: RunTarget,

    /// Decide only the calls of this step (default: every call the run waits for).
    #[arg(long, value_name = "STEP")]
    pub step: Option<String>,

    /// Deny instead of approving: a denied spec call fails its step; a denied LLM call is told so.
    #[arg(long)]
    pub deny: bool,

    /// Why, recorded with the decision.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,

    /// Who decides, as recorded (default: the user running the command).
    #[arg(long = "as", value_name = "NAME")]
    pub by: Option<String>,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("outcome").required(true).args(["succeeded", "failed"])))]
pub struct ResolveArgs {
    #[command(flatten)]
    pub run: RunTarget,

    /// The step in doubt, as `archon resume` names it (`step`, or `step[i]` for an item of a `foreach`).
    #[arg(value_name = "STEP")]
    pub step: Option<String>,

    /// The step had its effect: it succeeded.
    #[arg(long)]
    pub succeeded: bool,

    /// Its output, as JSON (with `--succeeded`; default: null).
    #[arg(long, value_name = "JSON", requires = "succeeded")]
    pub output: Option<String>,

    /// The step did not have its effect: it failed, and `archon retry RUN --failed` runs it again.
    #[arg(long)]
    pub failed: bool,

    /// Why, recorded with the result.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,

    /// Who resolves, as recorded (default: the user running the command).
    #[arg(long = "as", value_name = "NAME")]
    pub by: Option<String>,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub run: RunTarget,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PlanFormat {
    Text,
    Dot,
    Mermaid,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Spec files, or directories searched recursively for `.yaml`, `.yml` and `.toml` files.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// Where `archon mcp list` keeps the MCP tool lists that calls to MCP tools are checked against.
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum LlmCommand {
    /// Send one tiny request to a provider and print the model, latency and usage.
    Ping(LlmPingArgs),
}

#[derive(Debug, clap::Args)]
pub struct LlmPingArgs {
    /// A provider of the spec (default: its `llm.default`), or without `--spec` a kind configured from the
    /// environment: `openai` (default), `anthropic` or `gemini`.
    #[arg(value_name = "PROVIDER")]
    pub provider: Option<String>,

    /// Take the provider from this workflow spec's `llm.providers`.
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,

    /// The model to ask (overrides the spec and `ARCHON_<KIND>_MODEL`).
    #[arg(long)]
    pub model: Option<String>,
}

/// A run state, as `archon runs --status` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum RunStatusArg {
    Running,
    WaitingApproval,
    Interrupted,
    Succeeded,
    Failed,
    Cancelled,
}

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// The workflow's name; the file is `NAME.yaml` (`NAME.toml` with `--toml`).
    #[arg(value_name = "NAME", default_value = "workflow")]
    pub name: String,

    /// Write TOML instead of YAML.
    #[arg(long)]
    pub toml: bool,

    /// Overwrite the file if it exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, clap::Args)]
pub struct ToolsArgs {
    /// A workflow spec whose declared tools are listed too.
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,

    /// Print the tools as JSON, with their full argument schemas.
    #[arg(long)]
    pub json: bool,

    /// Start FILE's MCP servers, list their tools and keep the lists (as `archon mcp list` does).
    #[arg(long, requires = "file")]
    pub refresh: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Delete the finished runs (succeeded, failed, cancelled) that ended longer ago than this: `30d`,
    /// `12h`, `2w`.
    #[arg(long, value_name = "AGE", value_parser = crate::commands::when::parse_age)]
    pub older_than: crate::commands::when::Age,

    /// Only say what would be deleted.
    #[arg(long)]
    pub dry_run: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, clap::Args)]
pub struct VersionArgs {
    /// Print it as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `runs --limit N`: one run or more (`0` would list nothing and say that no run matches).
fn runs_limit(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("`0` would list no run: give 1 or more".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{text}` is not a number of runs")),
    }
}

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// List the namespaces, or the memories of one (`--namespace`).
    Ls(MemoryLsArgs),
    /// Search a namespace's memories as an agent's `recall` does (BM25).
    Search(MemorySearchArgs),
    /// Show one memory: its text, where it came from, what it replaced and what replaced it.
    Show(MemoryShowArgs),
    /// Forget a memory: it is kept, and never recalled again.
    Forget(MemoryForgetArgs),
    /// Write memories (of one namespace, or all) as JSON Lines on standard output.
    Export(MemoryExportArgs),
    /// Read memories `export` wrote; what is already remembered is not written twice.
    Import(MemoryImportArgs),
}

/// Which memory file: `memory.path` of the spec, in the state directory (or, with `--store`, the
/// PostgreSQL run store's database).
#[derive(Debug, clap::Args)]
pub struct MemoryFileArgs {
    /// The memory file, relative to the state directory (a spec's `memory.path`); with `--store`, which
    /// memory in its database.
    #[arg(long = "file", value_name = "PATH", default_value = "memory.db")]
    pub file: PathBuf,

    /// Print JSON.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, clap::Args)]
pub struct MemoryLsArgs {
    /// The namespace whose memories to list.
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Also memories that were replaced or forgotten, and notes and episodes.
    #[arg(long)]
    pub all: bool,

    #[command(flatten)]
    pub memory: MemoryFileArgs,
}

#[derive(Debug, clap::Args)]
pub struct MemorySearchArgs {
    /// What to look for.
    #[arg(value_name = "QUERY")]
    pub query: String,

    /// The namespace to search.
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: String,

    /// Most memories to show.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub limit: usize,

    /// Search the episodes of earlier steps instead of facts.
    #[arg(long)]
    pub episodes: bool,

    #[command(flatten)]
    pub memory: MemoryFileArgs,
}

#[derive(Debug, clap::Args)]
pub struct MemoryShowArgs {
    /// The memory's id.
    #[arg(value_name = "ID")]
    pub id: i64,

    #[command(flatten)]
    pub memory: MemoryFileArgs,
}

#[derive(Debug, clap::Args)]
pub struct MemoryForgetArgs {
    /// The memory's id.
    #[arg(value_name = "ID")]
    pub id: i64,

    /// Why (kept with it).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,

    #[command(flatten)]
    pub memory: MemoryFileArgs,
}

#[derive(Debug, clap::Args)]
pub struct MemoryExportArgs {
    /// Only this namespace.
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    #[command(flatten)]
    pub memory: MemoryFileArgs,
}

#[derive(Debug, clap::Args)]
pub struct MemoryImportArgs {
    /// A JSON Lines file `archon memory export` wrote (`-` for standard input).
    #[arg(value_name = "FILE")]
    pub input: PathBuf,

    /// Import into this namespace instead of the records' own.
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    #[command(flatten)]
    pub memory: MemoryFileArgs,
}
