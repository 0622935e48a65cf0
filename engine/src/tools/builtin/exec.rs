//! The `exec` tool: runs a program with arguments as an argument vector (no shell) in its own process
//! group. A call ends when its command exits; what the command left running, and everything it started when
//! the call is abandoned (timeout or cancellation), is killed (`process::Tracked`).

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::io::AsyncWriteExt;

use super::{SENSITIVE, Tool, ToolContext, ToolError, ToolOutput, Watcher, object, timeout};
use crate::process;
use crate::tools::Stream;
use crate::tools::{CallFuture, SafetyRule};

/// Most bytes of a command's stdout or stderr kept; the rest is counted and dropped.
pub const MAX_CAPTURE_BYTES: usize = 1024 * 1024;
/// Bytes read past [`MAX_CAPTURE_BYTES`] so that a secret the cut would split is seen whole and left out
/// (longer than any encoded form of a secret a spec can hold in an environment variable).
const MASK_SLACK_BYTES: usize = 64 * 1024;
const CAPTURE_READ_BYTES: usize = MAX_CAPTURE_BYTES + MASK_SLACK_BYTES;

pub(super) struct Exec;

/// The arguments of a tool that runs a command: what to run (`what`, required, with its schema), and how.
pub(super) fn command_parameters(what: &str, schema: Json) -> Json {
    // What to run comes first, as models read the schema in order.
    let mut properties = serde_json::Map::from_iter([(what.to_owned(), schema)]);
    if let Json::Object(how) = json!({
        "cwd": { "type": "string" },
        "env": { "type": "object", "additionalProperties": { "type": "string" } },
        "stdin": { "type": "string" },
        "output": { "enum": ["text", "json", "lines"] },
        "ok_exit_codes": { "type": "array", "items": { "type": "integer" } },
        "timeout": timeout(),
    }) {
        properties.extend(how);
    }
    object(Json::Object(properties), &[what])
}

impl Tool for Exec {
    fn name(&self) -> &'static str {
        "exec"
    }

    fn description(&self) -> &'static str {
        "Run a program with arguments (argv, no shell)"
    }

    fn parameters(&self) -> Json {
        command_parameters(
            "argv",
            json!({ "type": "array", "items": { "type": "string" }, "minItems": 1 }),
        )
    }

    fn safety(&self) -> SafetyRule {
        SENSITIVE
    }

    fn runs_commands(&self) -> bool {
        true
    }

    fn durations(&self) -> &'static [&'static str] {
        &["timeout"]
    }

    fn call<'a>(
        &'a self,
        args: Json,
        cx: &'a ToolContext,
        on_spawn: Watcher<'a>,
    ) -> CallFuture<'a> {
        Box::pin(async move { exec(&args, cx, on_spawn).await })
    }
}

/// How long a command's output pipes may stay open after it exited and what it left running was killed:
/// only a process that escaped the sweep (a new session and a cleared environment) holds them longer.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);

pub(super) async fn exec(
    args: &Json,
    cx: &ToolContext,
    on_spawn: Watcher<'_>,
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
    // An argument, perhaps rendered from a template, so it is read here.
    let limit =
        match args["timeout"].as_str() {
            None => None,
            Some(text) => Some(humantime::parse_duration(text.trim()).map_err(|_| {
                ToolError::new(format!("invalid duration `{text}` for `{program}`"))
            })?),
        };
    let cwd = match args["cwd"].as_str() {
        Some(dir) => super::files::confine(&cx.workdir, dir)?,
        None => cx.workdir.clone(),
    };
    let mut command = tokio::process::Command::new(program);
    for name in &cx.withheld {
        command.env_remove(name);
    }
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
    if let (Some(watch), Some(pid)) = (on_spawn, child.id()) {
        watch.spawned(pid);
    }
    if let (Some(input), Some(mut stdin)) = (args["stdin"].as_str(), child.stdin.take()) {
        let input = input.to_owned();
        tokio::spawn(async move {
            let _ = stdin.write_all(input.as_bytes()).await;
        });
    }
    let (mut out, mut err) = (Captured::default(), Captured::default());
    let waiting = async {
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let reading = async {
            tokio::join!(
                out.read(stdout, Stream::Stdout, on_spawn, &cx.redactor),
                err.read(stderr, Stream::Stderr, on_spawn, &cx.redactor),
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
        Ok(status)
    };
    // The call's own limit; abandoning the wait kills the command and all it started.
    let status = match limit {
        None => waiting.await?,
        Some(limit) => tokio::time::timeout(limit, waiting).await.map_err(|_| {
            ToolError::new(format!(
                "`{program}` timed out after {}",
                humantime::format_duration(limit)
            ))
        })??,
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
            class: crate::tools::ErrorClass::Other,
        });
    }
    let output = match args["output"].as_str().unwrap_or("text") {
        "json" => serde_json::from_str(&out).map_err(|e| ToolError {
            message: format!("`{program}` did not print valid JSON: {e}"),
            exit_code: code,
            class: crate::tools::ErrorClass::Other,
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

/// Most bytes of a line passed on to a watcher at once: a longer one goes in parts.
const WATCHED_LINE_BYTES: usize = 64 * 1024;

/// Where to cut the first part of a line longer than [`WATCHED_LINE_BYTES`]: at a character boundary, and
/// before a secret the cut would split (unless the secret starts the line).
fn long_line_cut(pending: &[u8], redactor: &crate::redact::Redactor) -> usize {
    let head = &pending[..WATCHED_LINE_BYTES];
    let valid = match std::str::from_utf8(head) {
        Ok(_) => head.len(),
        Err(e) if e.valid_up_to() > 0 => e.valid_up_to(),
        Err(_) => return head.len(),
    };
    let text = std::str::from_utf8(&head[..valid]).unwrap_or_default();
    match redactor.cut_before(text, valid) {
        0 => valid,
        cut => cut,
    }
}

/// What a command writes to one stream, passed to its watcher as it comes: whole lines (a line longer
/// than [`WATCHED_LINE_BYTES`] in parts cut where no secret is split), secrets masked, up to
/// [`crate::tools::MAX_WATCHED_BYTES`] and then a note that the rest is not passed on.
struct Tee<'a> {
    watch: &'a dyn crate::tools::Watch,
    which: Stream,
    redactor: &'a crate::redact::Redactor,
    /// Bytes read after the last whole line passed on.
    pending: Vec<u8>,
    told: usize,
}

impl Tee<'_> {
    fn push(&mut self, bytes: &[u8]) {
        if self.told >= crate::tools::MAX_WATCHED_BYTES {
            return;
        }
        self.pending.extend_from_slice(bytes);
        if let Some(end) = self.pending.iter().rposition(|b| *b == b'\n') {
            let lines: Vec<u8> = self.pending.drain(..=end).collect();
            self.tell(&lines);
        }
        while self.pending.len() > WATCHED_LINE_BYTES {
            let cut = long_line_cut(&self.pending, self.redactor);
            let part: Vec<u8> = self.pending.drain(..cut).collect();
            self.tell(&part);
        }
    }

    fn finish(&mut self) {
        let rest = std::mem::take(&mut self.pending);
        if !rest.is_empty() {
            self.tell(&rest);
        }
    }

    fn tell(&mut self, bytes: &[u8]) {
        if self.told >= crate::tools::MAX_WATCHED_BYTES {
            return;
        }
        self.told += bytes.len();
        let text = String::from_utf8_lossy(bytes);
        self.watch.output(self.which, &self.redactor.text(&text));
        if self.told >= crate::tools::MAX_WATCHED_BYTES {
            self.watch.output(
                self.which,
                &format!(
                    "[archon: the rest of this command's {} is not kept: more than {} MiB]\n",
                    self.which.as_str(),
                    crate::tools::MAX_WATCHED_BYTES / (1024 * 1024)
                ),
            );
        }
    }
}

impl Captured {
    /// Reads `stream` to its end, keeping up to [`CAPTURE_READ_BYTES`] and passing what was written to
    /// `watch` as it comes (see [`Tee`]).
    async fn read(
        &mut self,
        stream: Option<impl tokio::io::AsyncRead + Unpin>,
        which: Stream,
        watch: Watcher<'_>,
        redactor: &crate::redact::Redactor,
    ) {
        use tokio::io::AsyncReadExt;
        let Some(mut stream) = stream else { return };
        let mut buffer = vec![0u8; 64 * 1024];
        let mut tee = watch.map(|watch| Tee {
            watch,
            which,
            redactor,
            pending: Vec::new(),
            told: 0,
        });
        loop {
            let n = match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let room = CAPTURE_READ_BYTES.saturating_sub(self.kept.len());
            self.kept.extend_from_slice(&buffer[..n.min(room)]);
            self.dropped += n.saturating_sub(room);
            if let Some(tee) = &mut tee {
                tee.push(&buffer[..n]);
            }
        }
        if let Some(tee) = &mut tee {
            tee.finish();
        }
    }

    /// The text kept, cut at [`MAX_CAPTURE_BYTES`] (earlier when the cut would split a secret, whose head
    /// would then stay visible: it is read whole past the cut and left out whole), and marked when bytes
    /// were dropped. Secrets in what is kept are masked wherever it goes, as whole values.
    fn text(self, redactor: &crate::redact::Redactor) -> String {
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
