//! What the test modules share: running the real binary, and listing spec files.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use archon_engine::llm::client::Settings;

pub mod serve;

/// What a run of `archon` printed and how it exited.
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the real `archon` binary in `dir`, without color.
pub fn archon(dir: &Path, args: &[&str]) -> Output {
    archon_with(dir, args, &[])
}

/// Runs the real `archon` binary in `dir`, without color, with `env` set and no LLM provider
/// configured from the test's own environment.
pub fn archon_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_archon"));
    command.args(args).current_dir(dir).env("NO_COLOR", "1");
    if !env.is_empty() {
        for (key, _) in std::env::vars() {
            if key.ends_with("_API_KEY") || key.ends_with("_BASE_URL") || key.starts_with("ARCHON_")
            {
                command.env_remove(key);
            }
        }
        command.envs(env.iter().copied());
    }
    let output = command.output().expect("archon runs");
    Output {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Starts `archon ARGS` in `dir` (output discarded) and returns it once the file `marker` appears there,
/// written by a step it runs; panics if it never does within 10 s.
pub fn spawn_until(dir: &Path, args: &[&str], marker: &str) -> std::process::Child {
    let child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("archon starts");
    let started = std::time::Instant::now();
    while !dir.join(marker).exists() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "`{marker}` never appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The spec files (`.yaml`, `.yml`, `.toml`) directly in `dir`, sorted.
pub fn spec_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "toml")
                )
        })
        .collect();
    files.sort();
    files
}

/// Provider settings for tests against a local server: short timeout, two quick retries, and `Retry-After`
/// honoured up to 5 s.
pub fn llm_settings() -> Settings {
    Settings {
        timeout: Duration::from_millis(500),
        retries: 2,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(50),
        max_retry_after: Duration::from_secs(5),
        ..Settings::default()
    }
}

/// An OpenAI-compatible chat completion (for a local wiremock server) whose message is `message`.
pub fn chat_completion(message: serde_json::Value) -> wiremock::ResponseTemplate {
    let finish = if message.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "local-model",
        "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
        "usage": { "prompt_tokens": 100, "completion_tokens": 10 }
    }))
}

/// A program of the test dependencies in `tests/npm` (installed by `scripts/install-test-deps.sh`), with
/// Node to run it; `None` after saying why when either is missing, except with `CI=true`, where a missing
/// prerequisite fails the test.
pub fn npm_bin(name: &str) -> Option<PathBuf> {
    let path = root().join("tests/npm/node_modules/.bin").join(name);
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let missing = if !node {
        "Node is not installed".to_owned()
    } else if !path.exists() {
        format!(
            "`{}` is missing: run scripts/install-test-deps.sh",
            path.display()
        )
    } else {
        return Some(path);
    };
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{missing} (required with CI=true)"
    );
    #[allow(clippy::print_stderr)]
    {
        eprintln!("skipped: {missing}");
    }
    None
}

/// The test server, built next to the `archon` binary (`target/<profile>/examples/mcp_test_server`):
/// `cargo test` builds examples, a narrower run (`cargo test --test main`) does not, so it is built here
/// (a quick no-op when it is up to date).
pub fn mcp_fixture() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let path = Path::new(env!("CARGO_BIN_EXE_archon"))
                .parent()
                .expect("the binary's directory")
                .join("examples/mcp_test_server");
            {
                let mut build = vec!["build", "-q", "--example", "mcp_test_server"];
                if path
                    .parent()
                    .and_then(Path::parent)
                    .is_some_and(|p| p.ends_with("release"))
                {
                    build.push("--release");
                }
                let status = Command::new(env!("CARGO"))
                    .args(build)
                    .current_dir(root())
                    .status()
                    .expect("cargo runs");
                assert!(status.success(), "cannot build the MCP test server");
            }
            path
        })
        .clone()
}

/// Polls `done` until it holds, for at most `limit`.
pub fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}
