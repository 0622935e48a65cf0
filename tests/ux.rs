//! The run experience of issue 15 ("a daily driver"): the live status line on a terminal, paused while an
//! approval prompt is open; colour on every command; error bodies cut to one line in progress and events,
//! whole in `archon logs`; `archon run --dry-run`; and what `archon show` says of `foreach` steps.

use std::path::Path;

use serde_json::Value as Json;
use tempfile::TempDir;

use crate::support::{Output, archon};

/// The id of the newest run in `dir`.
fn last_run(dir: &Path) -> String {
    let Output { stdout, .. } = archon(dir, &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs");
    runs[0]["id"].as_str().expect("id").to_owned()
}

/// Durations and run ids made stable for snapshots.
fn stable(text: &str, id: &str) -> String {
    let mut out = text.replace(id, "RUN");
    // `12 ms`, `in 3 ms` and `(12 ms)` become `N ms`.
    let mut cleaned = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find(" ms") {
        let head = &rest[..at];
        let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            cleaned.push_str(&head[..head.len() - digits]);
            cleaned.push('N');
        } else {
            cleaned.push_str(head);
        }
        cleaned.push_str(" ms");
        rest = &rest[at + 3..];
    }
    cleaned.push_str(rest);
    out = cleaned;
    out
}

const NOISY: &str = r#"name: noisy
steps:
  - id: noisy
    tool: exec
    with: { argv: [sh, -c, "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo line $i; echo err $i >&2; done; exit 2"] }
    retry: { attempts: 2, delay: 10ms, jitter: false }
"#;

/// A command's error, whose text holds the last lines it wrote to stderr, is one line in progress and in
/// the event log, with a note saying where the rest is; the attempts and the step's result keep it whole,
/// and `archon logs` prints it after the command's output (issue 15, item 4).
#[test]
fn a_multi_line_error_is_one_line_in_progress_and_events_and_whole_in_logs() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("noisy.yaml"), NOISY).expect("write");
    let run = archon(
        dir.path(),
        &["run", "noisy.yaml", "--events", "events.jsonl"],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let id = last_run(dir.path());
    let full = "`sh` exited with code 2: err 8\nerr 9\nerr 10\nerr 11\nerr 12";
    insta::assert_snapshot!(stable(&run.stderr, &id), @r"
    started   noisy
    retrying  noisy (attempt 2 in N ms): `sh` exited with code 2: err 8 (+4 lines, see `archon logs RUN noisy`)
    failed    noisy (N ms): `sh` exited with code 2: err 8 (+4 lines, see `archon logs RUN noisy`)
    ");
    let cut = format!("`sh` exited with code 2: err 8 (+4 lines, see `archon logs {id} noisy`)");
    let events: Vec<Json> = std::fs::read_to_string(dir.path().join("events.jsonl"))
        .expect("events")
        .lines()
        .map(|l| serde_json::from_str(l).expect("event"))
        .collect();
    let errors: Vec<(&str, &str)> = events
        .iter()
        .filter_map(|e| Some((e["event"].as_str()?, e["error"].as_str()?)))
        .collect();
    assert_eq!(
        errors,
        [
            ("step_retried", cut.as_str()),
            ("step_finished", cut.as_str())
        ]
    );
    // The stored event log is the same.
    let shown: Json =
        serde_json::from_str(&archon(dir.path(), &["show", &id, "--json", "--events"]).stdout)
            .expect("show");
    let stored: Vec<&str> = shown["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["error"].as_str())
        .collect();
    assert_eq!(stored, [cut.as_str(), cut.as_str()]);
    // The step's result and each attempt keep the whole text.
    assert_eq!(shown["results"]["noisy"]["error"], full);
    let attempts: Vec<&str> = shown["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["error"].as_str().expect("error"))
        .collect();
    assert_eq!(attempts, [full, full]);
    // `archon logs` prints it after what the command wrote.
    let logs = archon(dir.path(), &["logs", &id, "noisy"]);
    assert_eq!(logs.code, 0);
    let err: String = (1..=12).map(|i| format!("err {i}\n")).collect();
    assert_eq!(
        logs.stderr,
        format!("{err}archon: attempt 2 of `noisy` failed: {full}\n")
    );
}

/// `archon ARGS` in `dir` with its standard input and error on a pseudo-terminal (standard output piped),
/// and what it writes there, read as it comes.
pub(crate) struct Terminal {
    child: std::process::Child,
    input: std::fs::File,
    bytes: std::sync::mpsc::Receiver<Vec<u8>>,
    /// Everything read so far.
    seen: Vec<u8>,
    deadline: std::time::Instant,
}

impl Terminal {
    pub(crate) fn spawn(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Terminal {
        Terminal::spawn_sized(dir, args, env, None)
    }

    /// With `columns`, the terminal is that wide and `COLUMNS` is not set (a shell does not export it);
    /// without, `COLUMNS` says 200.
    fn spawn_sized(
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        columns: Option<u16>,
    ) -> Terminal {
        use std::io::Read as _;
        let size = columns.map(|ws_col| nix::pty::Winsize {
            ws_row: 24,
            ws_col,
            ws_xpixel: 0,
            ws_ypixel: 0,
        });
        let pty = nix::pty::openpty(size.as_ref(), None).expect("a pseudo-terminal");
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_archon"));
        // A terminal that takes escape codes, whatever the tests' own `TERM` says (`dumb` in some CI).
        command
            .args(args)
            .current_dir(dir)
            .env_remove("NO_COLOR")
            .env("TERM", "xterm-256color");
        match columns {
            Some(_) => command.env_remove("COLUMNS"),
            None => command.env("COLUMNS", "200"),
        };
        command
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::from(
                pty.slave.try_clone().expect("dup"),
            ))
            .stderr(std::process::Stdio::from(pty.slave))
            .stdout(std::process::Stdio::piped());
        let child = command.spawn().expect("archon starts");
        // The terminal's other end stays open only in archon, so that reading ends when it exits.
        drop(command);
        let mut output = std::fs::File::from(pty.master.try_clone().expect("dup"));
        let (sender, bytes) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buffer = [0; 4096];
            // A terminal whose other end closed reads as an error (EIO), not as its end.
            while let Ok(n @ 1..) = output.read(&mut buffer) {
                if sender.send(buffer[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Terminal {
            child,
            input: std::fs::File::from(pty.master),
            bytes,
            seen: Vec::new(),
            deadline: std::time::Instant::now() + std::time::Duration::from_secs(30),
        }
    }

    /// Reads until `text` has been written (after byte `from`); returns where it ends.
    pub(crate) fn until(&mut self, from: usize, text: &str) -> usize {
        loop {
            if let Some(at) = find(&self.seen[from.min(self.seen.len())..], text.as_bytes()) {
                return from + at + text.len();
            }
            let left = self
                .deadline
                .saturating_duration_since(std::time::Instant::now());
            match self.bytes.recv_timeout(left) {
                Ok(bytes) => self.seen.extend(bytes),
                Err(_) => panic!(
                    "`{text}` was never written; the terminal shows:\n{}",
                    String::from_utf8_lossy(&self.seen).escape_debug()
                ),
            }
        }
    }

    /// What has been written and not read yet, without waiting.
    fn drain(&mut self) {
        while let Ok(bytes) = self.bytes.try_recv() {
            self.seen.extend(bytes);
        }
    }

    fn type_line(&mut self, line: &str) {
        use std::io::Write as _;
        self.input
            .write_all(format!("{line}\n").as_bytes())
            .expect("typed");
    }

    /// Waits for archon to exit and for the rest of what it wrote: its exit code, the terminal's text
    /// (line ends as written, `\r\n` made `\n`) and standard output.
    pub(crate) fn finish(mut self) -> (i32, String, String) {
        use std::io::Read as _;
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            out.read_to_string(&mut stdout).expect("stdout");
        }
        let status = self.child.wait().expect("exits");
        while let Ok(bytes) = self.bytes.recv_timeout(
            self.deadline
                .saturating_duration_since(std::time::Instant::now()),
        ) {
            self.seen.extend(bytes);
        }
        let text = String::from_utf8_lossy(&self.seen).replace("\r\n", "\n");
        (status.code().unwrap_or(-1), text, stdout)
    }
}

/// A test that fails leaves no archon waiting at its prompt.
impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

const TWO_STEPS: &str = r#"name: two
steps:
  - { id: first, tool: echo, with: { x: 1 } }
  - { id: second, tool: exec, needs: [first], with: { argv: [sh, -c, "exit 0"] } }
"#;

/// On a terminal, progress is one status line redrawn in place (issue 15, item 3); `NO_COLOR` leaves it
/// without colour, and without it the counts are coloured.
#[test]
fn a_terminal_shows_the_live_status_line() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("two.yaml"), TWO_STEPS).expect("write");
    let mut terminal = Terminal::spawn(
        dir.path(),
        &["--color", "auto", "run", "two.yaml"],
        &[("NO_COLOR", "1")],
    );
    terminal.until(
        0,
        "\r\x1b[2Krunning 1 | done 1 | failed 0 | skipped 0 | second",
    );
    let (code, text, stdout) = terminal.finish();
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("\r\x1b[2Krunning 0 | done 2 | failed 0 | skipped 0"),
        "{}",
        text.escape_debug()
    );
    assert!(
        text.ends_with("\r\x1b[2K"),
        "the status line is cleared at the end"
    );
    assert!(
        !text.contains("\x1b[3"),
        "no colour with NO_COLOR: {}",
        text.escape_debug()
    );
    assert!(
        stdout.starts_with("run ") && !stdout.contains('\x1b'),
        "{stdout}"
    );

    let mut terminal = Terminal::spawn(dir.path(), &["run", "two.yaml"], &[]);
    terminal.until(
        0,
        "\r\x1b[2Krunning 0 | \x1b[32mdone 2\x1b[0m | failed 0 | skipped 0",
    );
    let (code, _, stdout) = terminal.finish();
    assert_eq!(code, 0);
    assert!(
        !stdout.contains('\x1b'),
        "standard output is not a terminal: {stdout}"
    );
}

/// The status line fits the terminal it is drawn on, read from the terminal when `COLUMNS` is not set (a
/// shell does not export it): on a 60-column terminal it was cut at 99 columns, so it wrapped and every
/// redraw left a line behind.
#[test]
fn the_status_line_fits_the_terminals_width() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("wide.yaml"),
        r#"name: wide
steps:
  - id: a_step_whose_name_is_longer_than_the_terminal_is_wide
    tool: exec
    with: { argv: [sh, -c, "while [ ! -f go ]; do sleep 0.01; done"] }
"#,
    )
    .expect("write");
    let mut terminal = Terminal::spawn_sized(
        dir.path(),
        &["run", "wide.yaml"],
        &[("NO_COLOR", "1")],
        Some(60),
    );
    let end = terminal.until(0, "\r\x1b[2Krunning 1 | done 0 | failed 0 | skipped 0");
    std::fs::write(dir.path().join("go"), "").expect("go");
    let (code, text, _) = terminal.finish();
    assert_eq!(code, 0, "{text}");
    let line = text[end..].split('\r').next().unwrap_or_default();
    // 59 columns: the 41 of the counts, then ` | ` and as much of the name as fits.
    assert_eq!(line, " | a_step_whose_na");
}

/// A terminal that says it is dumb (`TERM=dumb`: Emacs' shell, some CI logs) cannot move the cursor or
/// paint: progress is one plain line per event there, without colour, as when standard error is a file.
#[test]
fn a_dumb_terminal_gets_plain_lines() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("two.yaml"), TWO_STEPS).expect("write");
    let terminal = Terminal::spawn(dir.path(), &["run", "two.yaml"], &[("TERM", "dumb")]);
    let (code, text, _) = terminal.finish();
    assert_eq!(code, 0, "{text}");
    let text = text
        .lines()
        .map(|l| l.split_once(" (").map_or(l, |(head, _)| head))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        text,
        "started   first\nsucceeded first\nstarted   second\nsucceeded second"
    );
}

const PROMPTED: &str = r#"name: prompted
steps:
  - id: pay
    tool: exec
    approval: required
    with: { argv: [sh, -c, "echo paid >> effects.txt"] }
  - id: other
    tool: exec
    with: { argv: [sh, -c, "while [ ! -f go ]; do sleep 0.01; done; exit 3"] }
    on_error: continue
"#;

/// While the terminal's approval prompt is open, the status line is cleared and nothing else is written:
/// a step that fails meanwhile is shown once the prompt is answered (issue 15, item 3).
#[test]
fn progress_waits_while_the_approval_prompt_is_open() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("prompted.yaml"), PROMPTED).expect("write");
    let mut terminal = Terminal::spawn(dir.path(), &["run", "prompted.yaml"], &[("NO_COLOR", "1")]);
    let asked = terminal.until(0, "to approve, anything else denies: ");
    let text = String::from_utf8_lossy(&terminal.seen[..asked]).into_owned();
    let code = text
        .rsplit("type ")
        .next()
        .and_then(|t| t.split(' ').next())
        .expect("a code")
        .to_owned();
    assert!(
        text.ends_with(&format!(
            "\r\x1b[2K\napproval needed: step `pay` calls `exec`\n  why: the step says `approval: required`\n  arguments:\n    {{\n      \"with\": {{\n        \"argv\": [\n          \"sh\",\n          \"-c\",\n          \"echo paid >> effects.txt\"\n        ]\n      }}\n    }}\ntype {code} to approve, anything else denies: "
        ).replace('\n', "\r\n").replace("\r\r\n", "\r\n")),
        "{}",
        text.escape_debug()
    );
    // Another step fails while the prompt is open.
    std::fs::write(dir.path().join("go"), "").expect("write");
    let id = loop {
        let runs: Json =
            serde_json::from_str(&archon(dir.path(), &["runs", "--json"]).stdout).expect("runs");
        let id = runs[0]["id"].as_str().expect("id").to_owned();
        let shown: Json =
            serde_json::from_str(&archon(dir.path(), &["show", &id, "--json"]).stdout)
                .expect("show");
        if shown["results"]["other"]["status"] == "failed" {
            break id;
        }
        assert!(
            std::time::Instant::now() < terminal.deadline,
            "`other` never failed"
        );
        std::thread::yield_now();
    };
    terminal.drain();
    assert_eq!(
        String::from_utf8_lossy(&terminal.seen[asked..]),
        "",
        "written while the prompt was open"
    );
    terminal.type_line(&code);
    let answered = terminal.until(asked, &format!("{code}\r\n"));
    assert_eq!(
        answered,
        asked + code.len() + 2,
        "the answer follows the prompt"
    );
    let (status, text, stdout) = terminal.finish();
    assert_eq!(status, 0, "{text}");
    let after = &text[text.find(&format!("{code}\n")).expect("answer") + code.len() + 1..];
    // What was held (`other` failed), the status line, then the rest of the run.
    let after = stable(after, &id).replace(&archon_engine::session::person(None), "USER");
    insta::assert_snapshot!(after.escape_debug().to_string(), @r"\r\u{1b}[2Kfailed    other (N ms): `sh` exited with code 3\nrunning 1 | done 0 | failed 1 | skipped 0 | pay\r\u{1b}[2Kapproved  pay exec by USER\nrunning 1 | done 0 | failed 1 | skipped 0 | pay\r\u{1b}[2Krunning 0 | done 1 | failed 1 | skipped 0\r\u{1b}[2K");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("effects.txt")).expect("paid"),
        "paid\n"
    );
    assert!(
        stdout.starts_with(&format!("run {id} of `prompted` succeeded")),
        "{stdout}"
    );
}

const ITEMS: &str = r#"name: items
steps:
  - id: each
    foreach: "[0, 1, 2, 3]"
    tool: exec
    with: { argv: [sh, -c, "if [ {{ item }} = 1 ] && [ ! -f once ]; then touch once; exit 4; fi; if [ {{ item }} = 2 ]; then echo bad >&2; exit 5; fi; if [ {{ item }} = 3 ]; then printf 'one\ntwo\nthree\n' >&2; exit 6; fi"] }
    retry: { attempts: 2, delay: 1ms, jitter: false }
    fallback: { tool: echo, with: { fell: "{{ item }}" } }
  - id: strict
    needs: [each]
    foreach: "[0, 1, 2]"
    tool: exec
    with: { argv: [sh, -c, "if [ {{ item }} = 1 ]; then echo no >&2; exit 7; fi"] }
    retry: { attempts: 2, delay: 1ms, jitter: false }
    on_error: continue
"#;

/// `show` lists the items of a `foreach` step that failed or that their fallback saved, with their index,
/// attempts and error, and its attempt counts are those of `show --json`, fallbacks' attempts included
/// (issue 15: `show` for `foreach` steps).
#[test]
fn show_lists_the_items_that_failed_or_fell_back_with_attempts_as_json_counts_them() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("items.yaml"), ITEMS).expect("write");
    let run = archon(dir.path(), &["run", "items.yaml"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = last_run(dir.path());
    let text = archon(dir.path(), &["show", &id]).stdout;
    let table: String = text
        .lines()
        .skip_while(|l| !l.starts_with("STEP"))
        .map(|l| format!("{l}\n"))
        .collect();
    insta::assert_snapshot!(table.replace(&id, "RUN"), @r"
    STEP       STATUS                ATTEMPTS  ERROR
    each       succeeded             9
    each[2]    succeeded (fallback)  3         `sh` exited with code 5: bad
    each[3]    succeeded (fallback)  3         `sh` exited with code 6: one (+2 lines, see `archon logs RUN each[3]`)
    strict     failed                4         item 1: `sh` exited with code 7: no
    strict[1]  failed                2         `sh` exited with code 7: no
    ");
    let shown: Json =
        serde_json::from_str(&archon(dir.path(), &["show", &id, "--json"]).stdout).expect("json");
    let mut results: Vec<String> = shown["results"]
        .as_object()
        .expect("results")
        .iter()
        .map(|(name, r)| {
            format!(
                "{name}: {} {} attempts, fallback {}, error {}",
                r["status"], r["attempts"], r["fallback"], r["error"]
            )
        })
        .collect();
    results.sort();
    insta::assert_snapshot!(results.join("\n"), @r#"
    each: "succeeded" 9 attempts, fallback true, error null
    each[0]: "succeeded" 1 attempts, fallback false, error null
    each[1]: "succeeded" 2 attempts, fallback false, error null
    each[2]: "succeeded" 3 attempts, fallback true, error null
    each[3]: "succeeded" 3 attempts, fallback true, error null
    strict: "failed" 4 attempts, fallback false, error "item 1: `sh` exited with code 7: no"
    strict[0]: "succeeded" 1 attempts, fallback false, error null
    strict[1]: "failed" 2 attempts, fallback false, error "`sh` exited with code 7: no"
    strict[2]: "succeeded" 1 attempts, fallback false, error null
    "#);
    // Every row's attempts are its result's, and as many as the attempts recorded.
    for line in table.lines().skip(1) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        let (name, attempts) = (cells[0], cells.iter().find_map(|c| c.parse::<u64>().ok()));
        assert_eq!(
            attempts,
            shown["results"][name]["attempts"].as_u64(),
            "{name}: {line}"
        );
        let recorded = shown["attempts"]
            .as_array()
            .expect("attempts")
            .iter()
            .filter(|a| {
                let step = a["step"].as_str().expect("step");
                step == name || (!name.contains('[') && step.starts_with(&format!("{name}[")))
            })
            .count() as u64;
        assert_eq!(attempts, Some(recorded), "{name}");
    }
}

/// `--color always` paints statuses on every command, terminal or not: progress, the run's summary, `runs`,
/// `show` and `logs` (issue 15, item 3).
#[test]
fn color_always_paints_statuses_on_every_command() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("noisy.yaml"), NOISY).expect("write");
    let run = archon(dir.path(), &["--color", "always", "run", "noisy.yaml"]);
    assert_eq!(run.code, 1);
    let id = last_run(dir.path());
    let shown = |text: &str| stable(text, &id).replace('\x1b', "␛");
    insta::assert_snapshot!(shown(&(run.stderr + &run.stdout)), @r"
    started   noisy
    ␛[33mretrying␛[0m  noisy (attempt 2 in N ms): `sh` exited with code 2: err 8 (+4 lines, see `archon logs RUN noisy`)
    ␛[31mfailed␛[0m    noisy (N ms): `sh` exited with code 2: err 8 (+4 lines, see `archon logs RUN noisy`)
    run RUN of `noisy` ␛[31mfailed␛[0m in N ms: ␛[31m1 failed␛[0m
      hint: `archon logs RUN noisy` prints everything its commands wrote
    ");
    let runs = archon(dir.path(), &["runs", "--color", "always"]);
    let status = runs
        .stdout
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(2));
    assert_eq!(status, Some("\x1b[31mfailed\x1b[0m"), "{}", runs.stdout);
    let show = archon(dir.path(), &["--color", "always", "show", &id]).stdout;
    let table: String = show
        .lines()
        .skip_while(|l| !l.starts_with("STEP"))
        .collect::<Vec<_>>()
        .join("\n");
    insta::assert_snapshot!(shown(&table), @r"
    STEP   STATUS  ATTEMPTS  ERROR
    noisy  ␛[31mfailed␛[0m  2         `sh` exited with code 2: err 8 (+4 lines, see `archon logs RUN noisy`)
    ");
    let logs = archon(dir.path(), &["--color", "always", "logs", &id, "noisy"]);
    assert_eq!(
        logs.stderr.lines().nth(12).map(shown).as_deref(),
        Some("archon: attempt 2 of `noisy` ␛[31mfailed␛[0m: `sh` exited with code 2: err 8")
    );
    // Without `--color`, `NO_COLOR` (set by `archon`) and a pipe: none.
    let plain = archon(dir.path(), &["show", &id]);
    assert!(!plain.stdout.contains('\x1b'), "{}", plain.stdout);
}

const DEPLOY: &str = r#"name: deploy
inputs:
  target: { type: string, default: staging }
secrets: [DEPLOY_TOKEN]
steps:
  - id: build
    tool: exec
    with: { argv: [sh, -c, "touch built; echo v1"] }
  - id: upload
    tool: exec
    if: "inputs.target == 'staging'"
    approval: required
    with:
      argv: [sh, -c, "touch uploaded; echo {{ steps.build.text }}"]
      env: { TOKEN: "{{ secrets.DEPLOY_TOKEN }}", TARGET: "{{ inputs.target }}" }
  - id: notify
    foreach: "['ana', 'bo']"
    tool: echo
    with: { to: "{{ item }}", target: "{{ inputs.target | upper }}" }
  - id: check
    if: "steps.upload.status == 'succeeded'"
    tool: echo
    with: { ok: true }
"#;

/// `archon run --dry-run` shows each wave and each step's rendered arguments, secrets masked and what is
/// known only at run time marked, and says whether `if:` and `foreach:` can be decided; it runs nothing and
/// records nothing (issue 15: `run --dry-run`).
#[test]
fn a_dry_run_shows_each_steps_rendered_arguments_and_runs_nothing() {
    let dir = TempDir::new().expect("tempdir");
    let hello = crate::support::root().join("workflows/hello.yaml");
    let out = archon(
        dir.path(),
        &[
            "run",
            "--dry-run",
            hello.to_str().expect("path"),
            "--input",
            "who=ana",
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    insta::assert_snapshot!(out.stdout, @r#"
    dry run of `hello`: 1 step in 1 wave; nothing is run

    wave 1
      greet  tool echo
        with: {"message":"hello, ana"}
    "#);

    std::fs::write(dir.path().join("deploy.yaml"), DEPLOY).expect("write");
    let out = crate::support::archon_with(
        dir.path(),
        &["run", "--dry-run", "deploy.yaml"],
        &[("DEPLOY_TOKEN", "s3cr3t-t0ken-value")],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    insta::assert_snapshot!(out.stdout, @r#"
    dry run of `deploy`: 4 steps in 3 waves; nothing is run

    wave 1
      build  tool exec
        with: {"argv":["sh","-c","touch built; echo v1"]}
      notify  tool echo
        foreach: `['ana', 'bo']`: 2 items
        with: {"to":"<known at run time: {{ item }}>","target":"STAGING"}

    wave 2
      upload  tool exec  (after build)  (asks for approval)
        if: `inputs.target == 'staging'` is true: it runs
        with: {"argv":["sh","-c","<known at run time: touch uploaded; echo {{ steps.build.text }}>"],"env":{"TOKEN":"***","TARGET":"staging"}}

    wave 3
      check  tool echo  (after upload)
        if: `steps.upload.status == 'succeeded'`: decided at run time (reads `steps.upload.status`)
        with: {"ok":true}
    "#);
    assert!(!out.stdout.contains("s3cr3t-t0ken-value"));
    let json = crate::support::archon_with(
        dir.path(),
        &[
            "run",
            "--dry-run",
            "deploy.yaml",
            "--json",
            "--input",
            "target=prod",
        ],
        &[("DEPLOY_TOKEN", "s3cr3t-t0ken-value")],
    );
    let dry: Json = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(
        dry["waves"][1][0]["condition"],
        serde_json::json!({ "decided": "now", "expression": "inputs.target == 'staging'", "value": false })
    );
    assert!(!json.stdout.contains("s3cr3t-t0ken-value"));
    // Nothing ran and nothing was recorded.
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["deploy.yaml"]);
    // A secret that is not set fails the dry run as it would fail the run.
    let unset = archon(dir.path(), &["run", "--dry-run", "deploy.yaml"]);
    assert_eq!(unset.code, 1);
    assert!(
        unset
            .stderr
            .starts_with("error: secret `DEPLOY_TOKEN` is not set"),
        "{}",
        unset.stderr
    );
}

/// Anything but the code shown denies the call: the step fails and its command never runs.
#[test]
fn a_wrong_code_at_the_prompt_denies() {
    let dir = TempDir::new().expect("tempdir");
    let spec = PROMPTED.split("  - id: other").next().expect("pay");
    std::fs::write(dir.path().join("pay.yaml"), spec).expect("write");
    let mut terminal = Terminal::spawn(dir.path(), &["run", "pay.yaml"], &[("NO_COLOR", "1")]);
    let asked = terminal.until(0, "to approve, anything else denies: ");
    let text = String::from_utf8_lossy(&terminal.seen[..asked]).into_owned();
    let code = text
        .rsplit("type ")
        .next()
        .and_then(|t| t.split(' ').next());
    let wrong = if code == Some("0000") { "1111" } else { "0000" };
    terminal.type_line(wrong);
    let (status, text, stdout) = terminal.finish();
    assert_eq!(status, 1, "{text}");
    let after = &text[text.find(&format!("{wrong}\n")).expect("answer")..];
    assert!(
        after.contains("denied    pay exec by "),
        "{}",
        after.escape_debug()
    );
    assert!(
        !dir.path().join("effects.txt").exists(),
        "the denied command ran"
    );
    assert!(stdout.contains(" of `prompted` failed in "), "{stdout}");
}
