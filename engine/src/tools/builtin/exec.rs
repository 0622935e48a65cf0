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

/// Where to cut what was read of a stream so far, of which more may come, at `at` or before (`0`: not
/// yet): at a character boundary, before a secret the cut would split, and before a tail that may be the
/// start of a secret the next bytes complete (see [`crate::redact::Redactor::cut_streaming`]). Bytes
/// that are not UTF-8 end what a secret can span.
fn stream_cut(pending: &[u8], at: usize, redactor: &crate::redact::Redactor) -> usize {
    let (valid, complete) = match std::str::from_utf8(pending) {
        Ok(_) => (pending.len(), false),
        // A character still coming in.
        Err(e) if e.error_len().is_none() => (e.valid_up_to(), false),
        // Invalid bytes first: passed on as they are (no secret holds them).
        Err(e) if e.valid_up_to() == 0 => return e.error_len().unwrap_or(1).min(at),
        Err(e) => (e.valid_up_to(), true),
    };
    let text = std::str::from_utf8(&pending[..valid]).unwrap_or_default();
    if complete {
        redactor.cut_before(text, crate::text::floor_boundary(text, at))
    } else {
        redactor.cut_streaming(text, at)
    }
}

/// What a command writes to one stream, passed to its watcher as it comes: whole lines (a line longer
/// than [`WATCHED_LINE_BYTES`] in parts), cut where no secret is split and no secret can start in one
/// part and end in the next, secrets masked, up to [`crate::tools::MAX_WATCHED_BYTES`] and then a note
/// that the rest is not passed on.
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
        loop {
            let lines = self
                .pending
                .iter()
                .rposition(|b| *b == b'\n')
                .map(|end| end + 1);
            let cut = match lines {
                // A secret holds no line break: after one no secret is split.
                Some(end) if !self.redactor.spans_lines() => end,
                Some(end) => stream_cut(&self.pending, end, self.redactor),
                None if self.pending.len() > WATCHED_LINE_BYTES => {
                    stream_cut(&self.pending, WATCHED_LINE_BYTES, self.redactor)
                }
                None => 0,
            };
            if cut == 0 {
                break;
            }
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
            // Bytes were dropped past what is kept: a secret may start in it and end in them.
            let mut cut = if dropped > 0 {
                redactor.cut_streaming(&text, MAX_CAPTURE_BYTES)
            } else {
                redactor.cut_before(&text, MAX_CAPTURE_BYTES)
            };
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll};

    use super::*;
    use crate::redact::Redactor;

    /// A stream read in exactly the given chunks, as a pipe is when its writer waits between writes.
    struct Chunks(VecDeque<Vec<u8>>);

    impl tokio::io::AsyncRead for Chunks {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if let Some(mut chunk) = self.0.pop_front() {
                // What the reader's buffer cannot take is read next.
                if chunk.len() > buf.remaining() {
                    let rest = chunk.split_off(buf.remaining());
                    self.0.push_front(rest);
                }
                buf.put_slice(&chunk);
            }
            Poll::Ready(Ok(()))
        }
    }

    /// What a watcher was told, part by part.
    #[derive(Default)]
    struct Told(Mutex<Vec<String>>);

    impl crate::tools::Watch for Told {
        fn spawned(&self, _: u32) {}
        fn output(&self, _: Stream, text: &str) {
            self.0.lock().expect("told").push(text.to_owned());
        }
    }

    /// Reads `chunks` as a command's stdout: what the watcher was told, joined, and the step's text,
    /// masked as the run keeps it.
    async fn read(chunks: &[&[u8]], redactor: &Redactor) -> (String, String) {
        let told = Told::default();
        let mut captured = Captured::default();
        let stream = Chunks(chunks.iter().map(|c| c.to_vec()).collect());
        captured
            .read(Some(stream), Stream::Stdout, Some(&told), redactor)
            .await;
        let parts = told.0.into_inner().expect("told");
        let text = redactor.text(&captured.text(redactor)).into_owned();
        (parts.concat(), text)
    }

    /// A secret written in two parts around the cut of a line longer than [`WATCHED_LINE_BYTES`] is
    /// masked in what the watcher is told (the run's logs) and in the step's text, wherever the line is
    /// cut and the secret split; a start of the secret that turns out not to be it is passed on whole,
    /// in order, nothing lost or repeated.
    #[tokio::test]
    async fn a_secret_split_across_a_long_lines_cut_is_masked() {
        let secret = "s3cr3tvalue1234567890";
        let redactor = Redactor::new([secret.to_owned()]);
        for written in [secret, "s3cr3tvalue12345XYZ", "s3cr3tvalue1234567890!"] {
            let shown = written.replace(secret, crate::redact::MASK);
            for before in [
                WATCHED_LINE_BYTES - 21,
                WATCHED_LINE_BYTES - 12,
                WATCHED_LINE_BYTES - 3,
                WATCHED_LINE_BYTES - 1,
                WATCHED_LINE_BYTES,
                WATCHED_LINE_BYTES + 1,
            ] {
                for split in [1, 3, 5, 11, 18] {
                    let line = "x".repeat(before);
                    let (head, tail) = written.split_at(split);
                    let tail = format!("{tail} end\n");
                    let chunks = [line.as_bytes(), head.as_bytes(), tail.as_bytes()];
                    let (logs, text) = read(&chunks, &redactor).await;
                    let expected = format!("{line}{shown} end\n");
                    assert!(
                        logs == expected,
                        "{written} after {before} bytes, split at {split}: the logs end `{}`",
                        &logs[logs.len().saturating_sub(40)..]
                    );
                    assert!(
                        text == expected,
                        "{written} after {before} bytes, split at {split}: the text ends `{}`",
                        &text[text.len().saturating_sub(40)..]
                    );
                }
            }
        }
    }

    /// A character of the secret split between reads at the cut does not let it through either.
    #[tokio::test]
    async fn a_secret_split_inside_a_character_at_the_cut_is_masked() {
        let secret = "pässwort-geheim";
        let redactor = Redactor::new([secret.to_owned()]);
        let line = "x".repeat(WATCHED_LINE_BYTES - 1);
        let (head, tail) = secret.as_bytes().split_at(2);
        let tail = [tail, b" end\n"].concat();
        let (logs, text) = read(&[line.as_bytes(), head, &tail], &redactor).await;
        assert_eq!(logs, format!("{line}*** end\n"));
        assert_eq!(text, format!("{line}*** end\n"));
    }

    /// A secret of several lines written a line at a time is masked whole, and what follows it on its
    /// last line is passed on.
    #[tokio::test]
    async fn a_secret_of_several_lines_written_line_by_line_is_masked() {
        let secret = "-----BEGIN KEY-----\nc2VjcmV0LWtleQ==\n-----END KEY-----";
        let redactor = Redactor::new([secret.to_owned()]);
        let chunks: Vec<Vec<u8>> = format!("key:\n{secret}\nafter\n")
            .split_inclusive('\n')
            .map(|l| l.as_bytes().to_vec())
            .collect();
        let chunks: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let (logs, text) = read(&chunks, &redactor).await;
        assert_eq!(logs, "key:\n***\nafter\n");
        assert_eq!(text, "key:\n***\nafter\n");
    }
}
