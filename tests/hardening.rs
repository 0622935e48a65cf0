//! Findings of the adversarial test pass, each pinned by the test that failed before its fix.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use tempfile::TempDir;

use crate::support::{Output, archon};

fn run_id(dir: &Path) -> String {
    let Output { stdout, .. } = archon(dir, &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs as JSON");
    runs[0]["id"].as_str().expect("an id").to_owned()
}

/// Escape sequences a tool prints (a window title, clearing the screen, a carriage return that writes a
/// fake line over a real one, a right-to-left override) reach the terminal as visible escapes.
#[test]
fn terminal_escape_sequences_from_tools_are_shown_escaped() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: loud
steps:
  - id: colour
    tool: exec
    with: { argv: [printf, "\e[31mred\e[0m\u202Eabc"] }
  - id: liar
    tool: exec
    with: { argv: [sh, -c, 'printf "\033]0;pwned\007\033[2Jbad\rsucceeded liar\n" >&2; exit 1'] }
outputs:
  shown: "{{ steps.colour.output }}"
"#;
    std::fs::write(dir.path().join("loud.yaml"), spec).expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["run", "loud.yaml"]);
    assert_eq!(code, 1, "{stderr}");
    let id = run_id(dir.path());
    let Output {
        stdout: shown,
        stderr: show_err,
        ..
    } = archon(dir.path(), &["show", &id]);
    for (what, text) in [
        ("run's stdout", &stdout),
        ("run's stderr", &stderr),
        ("show", &shown),
        ("show's stderr", &show_err),
    ] {
        assert!(
            !text.contains(['\u{1b}', '\u{7}', '\r', '\u{202e}']),
            "{what} carries raw control characters: {text:?}"
        );
    }
    assert!(
        stdout.contains("  shown: \\u{001b}[31mred\\u{001b}[0m\\u{202e}abc\n"),
        "{stdout}"
    );
    let failed = stderr
        .lines()
        .find(|l| l.starts_with("failed    liar"))
        .expect("the failure is reported");
    assert!(
        failed.ends_with("\\u{001b}]0;pwned\\u{0007}\\u{001b}[2Jbad\\u{000d}succeeded liar"),
        "{failed}"
    );
}

/// Closing the terminal sends SIGHUP: the run stops like on Ctrl-C, its command is killed, and the run is
/// left interrupted (resumable), not `running` with its children alive.
#[test]
fn sighup_stops_the_run_like_ctrl_c() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: hup
steps:
  - id: wait
    tool: exec
    with: { argv: [sh, -c, 'echo $$ > pid; touch started; exec sleep 30'] }
"#;
    std::fs::write(dir.path().join("hup.yaml"), spec).expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["run", "hup.yaml"])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("archon starts");
    let started = Instant::now();
    while !dir.path().join("started").exists() {
        assert!(started.elapsed() < Duration::from_secs(10), "never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let sleeper: i32 = std::fs::read_to_string(dir.path().join("pid"))
        .expect("pid written")
        .trim()
        .parse()
        .expect("a pid");
    let _ = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status();
    let status = child.wait().expect("exits");
    assert_eq!(status.code(), Some(130), "ends as interrupted, not killed");
    let Output { stdout, .. } = archon(dir.path(), &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs");
    assert_eq!(runs[0]["status"], "interrupted");
    assert!(
        !Path::new(&format!("/proc/{sleeper}")).exists()
            || std::fs::read_to_string(format!("/proc/{sleeper}/stat"))
                .is_ok_and(|s| s.contains(") Z ")),
        "the step's command was killed"
    );
}
