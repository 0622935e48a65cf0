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
    /// Print the JSON Schema of the workflow format.
    Schema,
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
    #[command(flatten)]
    pub workflow: WorkflowArgs,

    /// Most steps running at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_parallel: u32,

    /// The workspace commands run in (default: the spec's directory).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// Print the final run report as JSON on standard output.
    #[arg(long)]
    pub json: bool,

    /// Append every run event as a JSON line to this file.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
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
