//! Executing built-in tools. Arguments are checked against the tool's JSON Schema before anything runs;
//! commands run as an argument vector in their own process group. A call ends when its command exits;
//! what the command left running, and everything it started when the call is abandoned (timeout or
//! cancellation), is killed (`process::Tracked`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::io::AsyncWriteExt;

use super::{calculator, files, http, jq};
use crate::process;
use crate::tools::builtin;

/// Most bytes of a command's stdout or stderr kept; the rest is counted and dropped.
pub const MAX_CAPTURE_BYTES: usize = 1024 * 1024;
/// Bytes read past [`MAX_CAPTURE_BYTES`] so that a secret the cut would split is seen whole and left out
/// (longer than any encoded form of a secret a spec can hold in an environment variable).
const MASK_SLACK_BYTES: usize = 64 * 1024;
const CAPTURE_READ_BYTES: usize = MAX_CAPTURE_BYTES + MASK_SLACK_BYTES;

/// What a tool call produced.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    pub output: Json,
    pub text: String,
    pub exit_code: Option<i32>,
}

/// Why a tool call failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    pub message: String,
    pub exit_code: Option<i32>,
}

impl ToolError {
    pub(super) fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
            exit_code: None,
        }
    }
}

/// Where tools run.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// File tools and commands are confined to this directory.
    pub workdir: PathBuf,
    /// The spec's `env`, rendered, for commands.
    pub env: Vec<(String, String)>,
    /// What `http` may reach.
    pub network: std::sync::Arc<http::NetworkPolicy>,
    /// Secret values, masked in the excerpts errors quote before they are cut (a cut secret would no
    /// longer be recognised).
    pub redactor: std::sync::Arc<super::redact::Redactor>,
    /// The `archon` executable, run again for work that must be killable (jq filters).
    pub helper: Option<PathBuf>,
}

/// Told the process group id of each command a call starts, as soon as it starts.
pub type OnSpawn<'a> = Option<&'a (dyn Fn(u32) + Sync)>;

/// Calls a built-in tool with rendered arguments.
pub async fn call(
    name: &str,
    args: &Json,
    cx: &ToolContext,
    on_spawn: OnSpawn<'_>,
) -> Result<ToolOutput, ToolError> {
    check_arguments(name, args)?;
    match name {
        "echo" => Ok(ToolOutput {
            text: args.to_string(),
            output: args.clone(),
            exit_code: None,
        }),
        "sleep" => {
            let text = args["duration"].as_str().unwrap_or_default();
            let duration = humantime::parse_duration(text.trim())
                .map_err(|_| ToolError::new(format!("invalid duration `{text}` for `sleep`")))?;
            tokio::time::sleep(duration).await;
            Ok(ToolOutput {
                output: json!({ "slept_ms": duration.as_millis() as u64 }),
                text: String::new(),
                exit_code: None,
            })
        }
        "exec" => exec(args, cx, on_spawn).await,
        "shell" => {
            // The explicit opt-in to a shell: the command line goes to `sh -c` as one argument.
            let mut exec_args = args.clone();
            if let Some(object) = exec_args.as_object_mut() {
                let command = object.remove("command").unwrap_or(Json::Null);
                object.insert("argv".into(), json!(["sh", "-c", command]));
            }
            exec(&exec_args, cx, on_spawn).await
        }
        "read_file" | "write_file" | "list_files" => {
            let (workdir, args, name) = (cx.workdir.clone(), args.clone(), name.to_owned());
            off_thread(move || match name.as_str() {
                "read_file" => files::read_file(&workdir, &args),
                "write_file" => files::write_file(&workdir, &args),
                _ => files::list_files(&workdir, &args),
            })
            .await?
        }
        "http" => http::request(args, &cx.network, &cx.redactor).await,
        "json" => {
            let filter = args["query"].as_str().unwrap_or(".");
            let output = jq::query(cx.helper.as_deref(), &args["input"], filter).await?;
            Ok(ToolOutput {
                text: output.to_string(),
                output,
                exit_code: None,
            })
        }
        "calculator" => {
            let value = calculator::evaluate(args["expression"].as_str().unwrap_or_default())?;
            let output = if value.fract() == 0.0 && value.abs() < 9e15 {
                json!(value as i64)
            } else {
                json!(value)
            };
            Ok(ToolOutput {
                text: output.to_string(),
                output,
                exit_code: None,
            })
        }
        other => Err(ToolError::new(format!(
            "the built-in tool `{other}` cannot run in this version of archon"
        ))),
    }
}

/// Runs blocking `work` on a thread of its own, so that the scheduler's thread never waits for it: a file
/// that never answers (a FIFO nobody writes, a hung network file system) holds that thread, not the run,
/// and the step's timeout and Ctrl-C still end the call. Not `spawn_blocking`: the runtime waits for its
/// blocking tasks when it shuts down, so one stuck read would keep archon from exiting.
async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ToolError> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("archon-io".into())
        .spawn(move || {
            let _ = sender.send(work());
        })
        .map_err(|e| ToolError::new(format!("cannot start a thread for a file tool: {e}")))?;
    receiver
        .await
        .map_err(|_| ToolError::new("a file tool stopped without an answer"))
}

/// Checks arguments against the tool's schema; a violation names the argument path.
fn check_arguments(name: &str, args: &Json) -> Result<(), ToolError> {
    static VALIDATORS: OnceLock<HashMap<&'static str, jsonschema::Validator>> = OnceLock::new();
    let validators = VALIDATORS.get_or_init(|| {
        builtin::all()
            .iter()
            .filter_map(|b| {
                jsonschema::validator_for(&b.parameters)
                    .ok()
                    .map(|v| (b.name, v))
            })
            .collect()
    });
    let Some(validator) = validators.get(name) else {
        return Err(ToolError::new(format!("unknown tool `{name}`")));
    };
    match validator.iter_errors(args).next() {
        None => Ok(()),
        Some(error) => {
            let path = error.instance_path().to_string();
            let at = if path.is_empty() {
                "arguments".to_owned()
            } else {
                format!(
                    "argument `{}`",
                    path.trim_start_matches('/').replace('/', ".")
                )
            };
            Err(ToolError::new(format!(
                "{at} of tool `{name}` is invalid: {}",
                error.masked()
            )))
        }
    }
}

/// How long a command's output pipes may stay open after it exited and what it left running was killed:
/// only a process that escaped the sweep (a new session and a cleared environment) holds them longer.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);

async fn exec(
    args: &Json,
    cx: &ToolContext,
    on_spawn: OnSpawn<'_>,
) -> Result<ToolOutput, ToolError> {
    let argv: Vec<String> = args["argv"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    let Some((program, rest)) = argv.split_first() else {
        return Err(ToolError::new(
            "`exec` needs at least the program in `argv`",
        ));
    };
    let cwd = match args["cwd"].as_str() {
        Some(dir) => files::confine(&cx.workdir, dir)?,
        None => cx.workdir.clone(),
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .current_dir(&cwd)
        .envs(cx.env.iter().map(|(k, v)| (k, v)))
        .stdin(if args["stdin"].is_string() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(env) = args["env"].as_object() {
        command.envs(env.iter().filter_map(|(k, v)| v.as_str().map(|v| (k, v))));
    }
    // Set last, so that the call's own `env` cannot hide a command from the sweep.
    let tag = process::new_tag();
    command.env(process::TAG_VAR, &tag);
    let mut child = command.spawn().map_err(|e| {
        ToolError::new(format!(
            "cannot start `{program}`: {}",
            e.to_string().to_lowercase()
        ))
    })?;
    // Dropped with the call if it is abandoned: the command and all it started are killed.
    let tracked = child.id().map(|leader| process::Tracked::new(leader, tag));
    if let (Some(on_spawn), Some(pid)) = (on_spawn, child.id()) {
        on_spawn(pid);
    }
    if let (Some(input), Some(mut stdin)) = (args["stdin"].as_str(), child.stdin.take()) {
        let input = input.to_owned();
        tokio::spawn(async move {
            let _ = stdin.write_all(input.as_bytes()).await;
        });
    }
    let (mut out, mut err) = (Captured::default(), Captured::default());
    let status = {
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let reading = async {
            tokio::join!(
                process::read_into(stdout, &mut out.kept, &mut out.dropped, CAPTURE_READ_BYTES),
                process::read_into(stderr, &mut err.kept, &mut err.dropped, CAPTURE_READ_BYTES),
            )
        };
        let mut reading = std::pin::pin!(reading);
        let mut drained = false;
        // The call ends when the command exits, not when its output pipes close: a process it left
        // running in the background may hold them open for as long as it lives.
        let status = tokio::select! {
            status = child.wait() => status,
            _ = &mut reading => {
                drained = true;
                child.wait().await
            }
        };
        let status =
            status.map_err(|e| ToolError::new(format!("`{program}` did not finish: {e}")))?;
        if let Some(tracked) = tracked {
            tracked.exited();
        }
        if !drained {
            // What is still in the pipes was written before the command exited or its leftovers died.
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut reading).await;
        }
        status
    };
    let (out, err) = (out.text(&cx.redactor), err.text(&cx.redactor));
    let code = status.code();
    let ok_codes: Vec<i64> = args["ok_exit_codes"]
        .as_array()
        .map_or_else(|| vec![0], |c| c.iter().filter_map(Json::as_i64).collect());
    if !code.is_some_and(|c| ok_codes.contains(&i64::from(c))) {
        let tail: String = cx
            .redactor
            .text(&err)
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        let how = code.map_or_else(
            || "was killed by a signal".to_owned(),
            |c| format!("exited with code {c}"),
        );
        let message = if tail.is_empty() {
            format!("`{program}` {how}")
        } else {
            format!("`{program}` {how}: {tail}")
        };
        return Err(ToolError {
            message,
            exit_code: code,
        });
    }
    let output = match args["output"].as_str().unwrap_or("text") {
        "json" => serde_json::from_str(&out).map_err(|e| ToolError {
            message: format!("`{program}` did not print valid JSON: {e}"),
            exit_code: code,
        })?,
        "lines" => Json::Array(out.lines().map(|l| Json::String(l.to_owned())).collect()),
        _ => Json::String(out.trim_end_matches('\n').to_owned()),
    };
    Ok(ToolOutput {
        output,
        text: out,
        exit_code: code,
    })
}

/// What was read of a command's stdout or stderr.
#[derive(Default)]
struct Captured {
    kept: Vec<u8>,
    dropped: usize,
}

impl Captured {
    /// The text kept, cut at [`MAX_CAPTURE_BYTES`] (earlier when the cut would split a secret, whose head
    /// would then stay visible: it is read whole past the cut and left out whole), and marked when bytes
    /// were dropped. Secrets in what is kept are masked wherever it goes, as whole values.
    fn text(self, redactor: &super::redact::Redactor) -> String {
        let mut text = String::from_utf8_lossy(&self.kept).into_owned();
        let mut dropped = self.dropped;
        if text.len() > MAX_CAPTURE_BYTES {
            let mut cut = redactor.cut_before(&text, MAX_CAPTURE_BYTES);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            dropped += text.len() - cut;
            text.truncate(cut);
        }
        if dropped > 0 {
            text.push_str(&format!(
                "\n[archon: output truncated, {dropped} more bytes]"
            ));
        }
        text
    }
}

/// Parses a duration written in a spec.
pub fn duration(text: &str) -> Option<Duration> {
    humantime::parse_duration(text.trim()).ok()
}
