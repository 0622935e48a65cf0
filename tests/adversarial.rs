//! An adversarial pass over issue 15 ("a daily driver"): what a hostile or a new user tries against
//! `run --dry-run`, the day-one commands and run ids, each finding pinned by a test.

use std::process::{Command, Stdio};

use tempfile::TempDir;

/// `archon completions SHELL | head -1` closes the pipe before the script is written: archon stops quietly
/// (as every command does on a closed pipe) rather than panicking with a backtrace.
#[test]
fn completions_into_a_closed_pipe_stop_quietly() {
    let dir = TempDir::new().expect("temp dir");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        // The reading end is closed before archon starts: its first write fails, whatever the timing.
        drop(reader);
        let output = Command::new(env!("CARGO_BIN_EXE_archon"))
            .args(["completions", shell])
            .current_dir(dir.path())
            .env("RUST_BACKTRACE", "0")
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("archon runs");
        assert_eq!(
            (
                output.status.code(),
                String::from_utf8_lossy(&output.stderr).into_owned()
            ),
            (Some(0), String::new()),
            "{shell}"
        );
    }
}
