//! `archon init [NAME] [--toml] [--force]`: write a commented starter workflow that validates and runs as
//! it is, and the JSON Schema its first line points editors at.

use std::path::{Path, PathBuf};

use archon_engine::spec::schema::workflow_schema_text;

use super::Status;
use crate::args::InitArgs;
use crate::output;

/// Where the schema goes, relative to the workflow's folder: the state directory `archon run` uses when
/// started there.
const SCHEMA: &str = ".archon/workflow.schema.json";

const YAML: &str = r#"# yaml-language-server: $schema=.archon/workflow.schema.json
#
# A starter workflow, written by `archon init`. Check it, run it, then look at the run:
#
#   archon validate {file}
#   archon run {file} --input who=you
#   archon show --last
#
# The first line lets an editor (yaml-language-server, e.g. VS Code's YAML extension) complete and check
# this file: `archon init` wrote the JSON Schema of the format to `.archon/workflow.schema.json` beside it,
# in the state directory `archon run` keeps its runs in when started from this folder. After upgrading
# archon, refresh it with `archon schema > .archon/workflow.schema.json`.
# `archon tools` lists the tools a step can call; the whole format is in docs/spec.md.

# The workflow's name, as `archon runs` lists it.
name: {name}
description: A starter workflow - greet someone, then count the words of the greeting

# Inputs are given with `--input name=value`; one with a default may be left out.
inputs:
  who: { type: string, default: world, description: Who to greet }

# A step starts as soon as the steps it reads from (`steps.<id>`) or `needs` have finished; steps that do
# not depend on each other run in parallel.
steps:
  # A built-in tool: `echo` returns its arguments as its output.
  - id: greet
    tool: echo
    with: { message: "hello, {{ inputs.who }}" }

  # A command, run as an argument vector (never through a shell). It reads the greeting, so it runs
  # after `greet`; it is given 10 seconds, and one more attempt if it fails.
  - id: count
    tool: exec
    with:
      argv: [wc, -w]
      stdin: "{{ steps.greet.output.message }}"
      output: text
    timeout: 10s
    retry: { attempts: 2 }

# What the run reports when it succeeds.
outputs:
  greeting: "{{ steps.greet.output.message }}"
  words: "{{ steps.count.output | trim }}"
"#;

const TOML: &str = r#"#:schema .archon/workflow.schema.json
#
# A starter workflow, written by `archon init`. Check it, run it, then look at the run:
#
#   archon validate {file}
#   archon run {file} --input who=you
#   archon show --last
#
# The first line lets an editor (taplo, e.g. VS Code's Even Better TOML) complete and check this file:
# `archon init` wrote the JSON Schema of the format to `.archon/workflow.schema.json` beside it, in the
# state directory `archon run` keeps its runs in when started from this folder. After upgrading archon,
# refresh it with `archon schema > .archon/workflow.schema.json`.
# `archon tools` lists the tools a step can call; the whole format is in docs/spec.md.

# The workflow's name, as `archon runs` lists it.
name = "{name}"
description = "A starter workflow - greet someone, then count the words of the greeting"

# Inputs are given with `--input name=value`; one with a default may be left out.
[inputs.who]
type = "string"
default = "world"
description = "Who to greet"

# A step starts as soon as the steps it reads from (`steps.<id>`) or `needs` have finished; steps that do
# not depend on each other run in parallel.

# A built-in tool: `echo` returns its arguments as its output.
[[steps]]
id = "greet"
tool = "echo"
with = { message = "hello, {{ inputs.who }}" }

# A command, run as an argument vector (never through a shell). It reads the greeting, so it runs after
# `greet`; it is given 10 seconds, and one more attempt if it fails.
[[steps]]
id = "count"
tool = "exec"
with = { argv = ["wc", "-w"], stdin = "{{ steps.greet.output.message }}", output = "text" }
timeout = "10s"
retry = { attempts = 2 }

# What the run reports when it succeeds.
[outputs]
greeting = "{{ steps.greet.output.message }}"
words = "{{ steps.count.output | trim }}"
"#;

pub fn init(args: &InitArgs) -> anyhow::Result<Status> {
    // `""`, `notes/`, `notes/.yaml`: a folder at most, and no name to make a file of.
    let folder = &args.name[..args.name.rfind('/').map_or(0, |at| at + 1)];
    let last = &args.name[folder.len()..];
    if last.is_empty() || last.starts_with('.') {
        let hint = format!("`archon init {folder}workflow`");
        return Ok(if args.name.is_empty() {
            refuse("an empty NAME names no workflow", &hint)
        } else {
            refuse(&format!("`{}` holds no workflow name", args.name), &hint)
        });
    }
    let given = Path::new(&args.name);
    let written_ext = given.extension().and_then(|e| e.to_str());
    if args.toml && matches!(written_ext, Some("yaml" | "yml")) {
        let stem = given.with_extension("");
        return Ok(refuse(
            &format!("`{}` is a YAML file, and `--toml` asks for TOML", args.name),
            &format!(
                "`archon init {}.toml`, or `archon init {}` without `--toml`",
                stem.display(),
                args.name
            ),
        ));
    }
    let (file, toml) = match written_ext {
        Some("yaml" | "yml") if !args.toml => (given.to_path_buf(), false),
        Some("toml") => (given.to_path_buf(), true),
        _ => {
            let ext = if args.toml { "toml" } else { "yaml" };
            (PathBuf::from(format!("{}.{ext}", args.name)), args.toml)
        }
    };
    let name = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_owned();
    let slug = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !slug {
        return Ok(refuse(
            &format!(
                "`{name}` cannot name a workflow: names are lowercase letters, digits, `-` and `_`, starting with a letter or digit"
            ),
            &format!("`archon init {}`", suggest(&name)),
        ));
    }
    if file.exists() && !args.force {
        return Ok(refuse(
            &format!("`{}` already exists", file.display()),
            "choose another NAME, or `--force` to overwrite it",
        ));
    }
    let shown = file.display().to_string();
    let text = if toml { TOML } else { YAML }
        .replace("{file}", &shown)
        .replace("{name}", &name);
    let folder = file.parent().unwrap_or(Path::new(""));
    let schema = folder.join(SCHEMA);
    let written = schema
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&schema, workflow_schema_text()))
        .map_err(|e| (schema.clone(), e))
        .and_then(|()| std::fs::write(&file, text).map_err(|e| (file.clone(), e)));
    if let Err((path, e)) = written {
        output::stderr(&output::printable(&format!(
            "error: cannot write `{}`: {}\n",
            path.display(),
            e.to_string().to_lowercase()
        )));
        return Ok(Status::Failure);
    }
    output::stdout(&output::printable(&format!(
        "wrote `{shown}` and its schema `{}`\n  hint: `archon run {shown}` runs it\n",
        schema.display()
    )));
    Ok(Status::Success)
}

/// A name that would do: lowercase, with anything else as `-`.
fn suggest(name: &str) -> String {
    let slug: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let slug = slug.trim_matches('-');
    if slug.is_empty() {
        "workflow".to_owned()
    } else {
        slug.to_owned()
    }
}

fn refuse(message: &str, hint: &str) -> Status {
    output::stderr(&output::printable(&format!(
        "error: {message}\n  hint: {hint}\n"
    )));
    Status::Invalid
}
