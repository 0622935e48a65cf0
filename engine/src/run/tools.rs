//! Executing built-in tools. Arguments are checked against the tool's JSON Schema before anything runs;
//! commands run as an argument vector in their own process group, which is killed whole when the call is
//! abandoned (timeout or cancellation).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{calculator, files, http, jq};
use crate::tools::builtin;

/// Most bytes of a command's stdout or stderr kept; the rest is counted and dropped.
pub const MAX_CAPTURE_BYTES: usize = 1024 * 1024;

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
        "read_file" => files::read_file(&cx.workdir, args),
        "write_file" => files::write_file(&cx.workdir, args),
        "list_files" => files::list_files(&cx.workdir, args),
        "http" => http::request(args, &cx.network, &cx.redactor).await,
        "json" => {
            let output = jq::query(&args["input"], args["query"].as_str().unwrap_or("."))?;
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

/// Kills a command's whole process group if the call is abandoned before the command finished.
struct GroupGuard {
    pid: Option<rustix::process::Pid>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

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
    let mut child = command.spawn().map_err(|e| {
        ToolError::new(format!(
            "cannot start `{program}`: {}",
            e.to_string().to_lowercase()
        ))
    })?;
    let mut guard = GroupGuard {
        pid: child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32)),
    };
    if let (Some(on_spawn), Some(pid)) = (on_spawn, child.id()) {
        on_spawn(pid);
    }
    if let (Some(input), Some(mut stdin)) = (args["stdin"].as_str(), child.stdin.take()) {
        let input = input.to_owned();
        tokio::spawn(async move {
            let _ = stdin.write_all(input.as_bytes()).await;
        });
    }
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let (out, err, status) = tokio::join!(read_capped(stdout), read_capped(stderr), child.wait());
    let status = status.map_err(|e| ToolError::new(format!("`{program}` did not finish: {e}")))?;
    // The command finished by itself: its group is left alone.
    guard.pid = None;
    let code = status.code();
    let ok_codes: Vec<i64> = args["ok_exit_codes"]
        .as_array()
        .map_or_else(|| vec![0], |c| c.iter().filter_map(Json::as_i64).collect());
    if !code.is_some_and(|c| ok_codes.contains(&i64::from(c))) {
        let tail: String = cx
            .redactor
            .text(&err.text)
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
        "json" => serde_json::from_str(&out.text).map_err(|e| ToolError {
            message: format!("`{program}` did not print valid JSON: {e}"),
            exit_code: code,
        })?,
        "lines" => Json::Array(
            out.text
                .lines()
                .map(|l| Json::String(l.to_owned()))
                .collect(),
        ),
        _ => Json::String(out.text.trim_end_matches('\n').to_owned()),
    };
    Ok(ToolOutput {
        output,
        text: out.text,
        exit_code: code,
    })
}

struct Captured {
    text: String,
}

/// Reads a stream to its end, keeping at most [`MAX_CAPTURE_BYTES`] and marking what was dropped.
async fn read_capped(stream: Option<impl AsyncRead + Unpin>) -> Captured {
    let Some(mut stream) = stream else {
        return Captured {
            text: String::new(),
        };
    };
    let mut kept = Vec::new();
    let mut dropped = 0usize;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = MAX_CAPTURE_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..n.min(room)]);
                dropped += n.saturating_sub(room);
            }
        }
    }
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if dropped > 0 {
        text.push_str(&format!(
            "\n[archon: output truncated, {dropped} more bytes]"
        ));
    }
    Captured { text }
}

/// Parses a duration written in a spec.
pub fn duration(text: &str) -> Option<Duration> {
    humantime::parse_duration(text.trim()).ok()
}
