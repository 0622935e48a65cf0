//! `archon logs` (issue 15, item 1): both streams of every attempt of a command are kept in the run store,
//! secrets masked and capped, and printed again, stdout to standard output and stderr to standard error;
//! `--follow` prints them as the run goes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::Value as Json;
use tempfile::TempDir;

use crate::support::{Output, archon, archon_with};

/// The id of the newest run in `dir`.
fn last_run(dir: &std::path::Path) -> String {
    let Output { stdout, .. } = archon(dir, &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs");
    runs[0]["id"].as_str().expect("id").to_owned()
}

const NOISY: &str = r#"name: noisy
steps:
  - id: noisy
    tool: exec
    with: { argv: [sh, -c, "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo line $i; echo err $i >&2; done; echo attempt >> attempts; exit 2"] }
    retry: { attempts: 2, delay: 10ms }
"#;

#[test]
fn a_failed_commands_output_is_kept_whole_for_every_attempt() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("noisy.yaml"), NOISY).expect("write");
    let run = archon(dir.path(), &["run", "noisy.yaml"]);
    assert_eq!(run.code, 1);
    let id = last_run(dir.path());
    let hints: Vec<&str> = run
        .stdout
        .lines()
        .chain(run.stderr.lines())
        .filter(|l| l.contains("hint:"))
        .collect();
    assert_eq!(
        hints,
        [format!(
            "  hint: `archon logs {id} noisy` prints everything its commands wrote"
        )]
    );
    let lines = |prefix: &str| -> String { (1..=12).map(|i| format!("{prefix} {i}\n")).collect() };
    // The last attempt's, stdout and stderr apart.
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["logs", &id, "noisy"]);
    assert_eq!(code, 0, "{stderr}");
    // Then the attempt's whole error, which progress and events show cut to its first line.
    let failed = |n: u32| {
        format!(
            "archon: attempt {n} of `noisy` failed: `sh` exited with code 2: err 8\nerr 9\nerr 10\nerr 11\nerr 12\n"
        )
    };
    assert_eq!(stdout, lines("line"));
    assert_eq!(stderr, lines("err") + &failed(2));
    // The first attempt's too.
    let first = archon(dir.path(), &["logs", &id, "noisy", "--attempt", "1"]);
    assert_eq!(
        (first.stdout, first.stderr),
        (lines("line"), lines("err") + &failed(1))
    );
    // Without a step: every step's.
    let all = archon(dir.path(), &["logs", &id]);
    assert_eq!(all.stdout, lines("line"));
    // An attempt that did not happen, and a step that does not exist.
    let none = archon(dir.path(), &["logs", &id, "noisy", "--attempt", "3"]);
    assert_eq!(
        (none.code, none.stdout.as_str(), none.stderr.as_str()),
        (
            0,
            "",
            format!("note: no command of attempt 3 of step `noisy` of run `{id}` wrote anything\n")
                .as_str()
        )
    );
    let unknown = archon(dir.path(), &["logs", &id, "nope"]);
    insta::assert_snapshot!(unknown.stderr.replace(&id, "RUN"), @r"
    error: run `RUN` has no attempt of a step `nope`
      hint: its steps with attempts: `noisy`
    ");
    assert_eq!(unknown.code, 2);
}

/// The calls of a composite tool write under their own names once more than one has written.
#[test]
fn the_calls_inside_a_composite_tool_are_named() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: parts
tools:
  both:
    description: two commands
    parameters: { type: object, properties: {} }
    steps:
      - { id: one, tool: exec, with: { argv: [sh, -c, "echo from one"] } }
      - { id: two, needs: [one], tool: exec, with: { argv: [sh, -c, "echo from two; echo oops >&2"] } }
steps:
  - { id: outer, tool: both }
"#;
    std::fs::write(dir.path().join("parts.yaml"), spec).expect("write");
    assert_eq!(archon(dir.path(), &["run", "parts.yaml"]).code, 0);
    let id = last_run(dir.path());
    let Output { stdout, stderr, .. } = archon(dir.path(), &["logs", &id, "outer"]);
    insta::assert_snapshot!(stdout, @r"
    outer/one | from one
    outer/two | from two
    ");
    assert_eq!(stderr, "outer/two | oops\n");
}

/// Secrets are masked before output is kept, and what passes the cap is counted out with a note.
#[test]
fn logs_mask_secrets_and_stop_at_the_cap() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: big
secrets: [LOG_TOKEN]
steps:
  - id: big
    tool: exec
    with:
      argv: [sh, -c, "echo token $T; head -c 3000000 /dev/zero | tr '\\0' 'x' | fold -w 99"]
      env: { T: "{{ secrets.LOG_TOKEN }}" }
"#;
    std::fs::write(dir.path().join("big.yaml"), spec).expect("write");
    let run = archon_with(
        dir.path(),
        &["run", "big.yaml"],
        &[("LOG_TOKEN", "tok-5e3r3t-value")],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = last_run(dir.path());
    let Output { stdout, .. } = archon(dir.path(), &["logs", &id, "big"]);
    assert!(stdout.starts_with("token ***\nxxx"), "{}", &stdout[..40]);
    assert!(!stdout.contains("tok-5e3r3t-value"));
    assert!(
        stdout.ends_with(
            "\n[archon: the rest of this attempt's stdout is not kept: more than 1 MiB]\n"
        ),
        "{}",
        &stdout[stdout.len() - 120..]
    );
    let store = std::fs::read(dir.path().join(".archon/state.db")).unwrap_or_default();
    let wal = std::fs::read(dir.path().join(".archon/state.db-wal")).unwrap_or_default();
    let secret = b"tok-5e3r3t-value";
    assert!(
        !store.windows(secret.len()).any(|w| w == secret)
            && !wal.windows(secret.len()).any(|w| w == secret),
        "the secret reached the store"
    );
}

/// `--follow` prints what a running step writes as it writes it, and ends with the run.
#[test]
fn follow_prints_output_as_the_run_goes() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: slow
steps:
  - id: slow
    tool: exec
    with: { argv: [sh, -c, "echo first; touch started; while [ ! -f go ]; do sleep 0.02; done; echo second"] }
"#;
    std::fs::write(dir.path().join("slow.yaml"), spec).expect("write");
    let mut run = crate::support::spawn_until(dir.path(), &["run", "slow.yaml"], "started");
    let id = last_run(dir.path());
    let mut follow = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["logs", &id, "--follow"])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("archon logs starts");
    let mut lines = BufReader::new(follow.stdout.take().expect("stdout")).lines();
    assert_eq!(
        lines.next().and_then(Result::ok).as_deref(),
        Some("first"),
        "printed while the step still runs"
    );
    std::fs::write(dir.path().join("go"), "").expect("write");
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("second"));
    assert!(lines.next().is_none(), "the output ends with the run");
    assert!(follow.wait().expect("exits").success());
    assert!(run.wait().expect("exits").success());
}

/// Writes `x` times the first argument and the head of the third argument cut at the second, waits until
/// the reader has taken all of it from the pipe, then writes the rest and ` end`.
const SPLIT_WRITER: &str = r#"import fcntl, struct, sys, termios, time
n, k, v = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
out = sys.stdout.buffer
def drained():
    while struct.unpack("i", fcntl.ioctl(1, termios.FIONREAD, b"\0\0\0\0"))[0]:
        time.sleep(0.002)
out.write(b"x" * n + v[:k]); out.flush(); drained()
out.write(v[k:] + b" end\n"); out.flush()
"#;

/// A secret written in two parts around the 64 KiB cut of a long line (the second once the first was
/// read) is masked in the stored logs and the step's text; a start of the secret that is not the secret
/// is kept whole. Skipped without `python3` (which can wait for the pipe to be read), except in CI.
#[test]
#[allow(clippy::print_stderr)]
fn a_secret_written_across_a_long_lines_cut_is_masked() {
    if Command::new("python3").arg("-V").output().is_err() {
        let why = "python3 is not installed";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipped: {why}");
        return;
    }
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("split.py"), SPLIT_WRITER).expect("write");
    let secret = "s3cr3tvalue1234567890";
    // (step, bytes before, where the value is cut, the value, what is shown of it)
    let cases = [
        ("at5", 65533, 5, "{{ secrets.MYSEC }}", "***"),
        ("at18", 65524, 18, "{{ secrets.MYSEC }}", "***"),
        ("at1", 65535, 1, "{{ secrets.MYSEC }}", "***"),
        ("at11", 65530, 11, "{{ secrets.MYSEC }}", "***"),
        (
            "not",
            65533,
            5,
            "s3cr3tvalue12345XYZ",
            "s3cr3tvalue12345XYZ",
        ),
    ];
    let mut spec = "name: split\nsecrets: [MYSEC]\nsteps:\n".to_owned();
    for (id, before, at, value, _) in cases {
        spec.push_str(&format!(
            "  - {{ id: {id}, tool: exec, with: {{ argv: [python3, split.py, \"{before}\", \"{at}\", \"{value}\"] }} }}\n"
        ));
    }
    std::fs::write(dir.path().join("split.yaml"), spec).expect("write");
    let run = archon_with(
        dir.path(),
        &["run", "--json", "split.yaml"],
        &[("MYSEC", secret)],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report: Json = serde_json::from_str(&run.stdout).expect("report");
    let id = last_run(dir.path());
    for (step, before, at, _, shown) in cases {
        let expected = format!("{}{shown} end\n", "x".repeat(before));
        let Output { stdout, .. } = archon(dir.path(), &["logs", &id, step]);
        assert!(
            stdout == expected,
            "{step}: the logs end `{}`",
            &stdout[stdout.len().saturating_sub(40)..]
        );
        let text = report["steps"][step]["text"].as_str().unwrap_or_default();
        assert!(
            text == expected,
            "{step} (cut at {at}): the text ends `{}`",
            &text[text.len().saturating_sub(40)..]
        );
    }
}
