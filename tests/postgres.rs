//! The run store on PostgreSQL through the real binary (`--store postgres://...`, `ARCHON_STORE`): run,
//! list, show, logs, resume after `kill -9`, approve and cancel, with the assertions the SQLite tests make;
//! and the store URLs that are refused, their passwords masked.
//!
//! PostgreSQL is `ARCHON_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432/test`); each test works
//! in a schema of its own, dropped afterwards. When the server cannot be reached the tests say so and pass,
//! except with `CI=true`, where they fail.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use tempfile::TempDir;

use crate::support::{Output, archon_with};

pub(crate) fn base_url() -> String {
    std::env::var("ARCHON_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Runs `sql` on a connection of its own.
fn admin(sql: &str) -> Result<(), String> {
    let (url, sql) = (base_url(), sql.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(|e| match std::error::Error::source(&e) {
                Some(cause) => format!("{e}: {cause}"),
                None => e.to_string(),
            })?;
            tokio::spawn(connection);
            client.batch_execute(&sql).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .unwrap_or_else(|_| Err("the admin thread panicked".to_owned()))
}

/// The first column of the rows `sql` returns, as text (`NULL` for a null), on a connection of its own.
fn admin_query(sql: &str) -> Result<Vec<String>, String> {
    let (url, sql) = (base_url(), sql.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            let messages = client.simple_query(&sql).await.map_err(|e| e.to_string())?;
            Ok(messages
                .iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => {
                        Some(row.get(0).unwrap_or("NULL").to_owned())
                    }
                    _ => None,
                })
                .collect())
        })
    })
    .join()
    .unwrap_or_else(|_| Err("the admin thread panicked".to_owned()))
}

/// The first column of the first row `sql` returns, as a number, on a connection of its own.
pub(crate) fn admin_count(sql: &str) -> Result<i64, String> {
    let rows = admin_query(sql)?;
    let first = rows
        .first()
        .ok_or_else(|| format!("`{sql}` returned no row"))?;
    first
        .parse()
        .map_err(|e| format!("`{sql}` returned `{first}`, not a number: {e}"))
}

/// A schema of the test database for one test, and a state directory; dropped afterwards.
pub(crate) struct Db {
    schema: String,
    dir: TempDir,
}

/// The test's database, or `None` after saying why when PostgreSQL cannot be reached (a failure with
/// `CI=true`).
pub(crate) fn db() -> Option<Db> {
    if let Err(e) = admin("SELECT 1") {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PostgreSQL at `{}` cannot be reached (required with CI=true): {e}",
            archon_engine::store::postgres::masked(&base_url())
        );
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "skipped: PostgreSQL at `{}` cannot be reached: {e}",
                base_url()
            );
        }
        return None;
    }
    let schema = format!("archon_cli_{}_{:08x}", std::process::id(), fastrand_u32());
    admin(&format!("CREATE SCHEMA {schema}")).expect("schema created");
    Some(Db {
        schema,
        dir: TempDir::new().expect("tempdir"),
    })
}

/// A random number, from the clock and the process (the tests need no better).
fn fastrand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish() as u32
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = admin(&format!("DROP SCHEMA {} CASCADE", self.schema));
    }
}

impl Db {
    pub(crate) fn url(&self) -> String {
        let base = base_url();
        let glue = if base.contains('?') { '&' } else { '?' };
        format!("{base}{glue}options=-c%20search_path%3D{}", self.schema)
    }

    /// The test's URL through the server's Unix-domain socket (its host the socket's directory), or
    /// `None` after saying why when the server has none on this host (a failure with `CI=true`).
    pub(crate) fn url_at_socket(&self) -> Option<String> {
        let (server, url) = self.url_through("127.0.0.1:1".parse().expect("address"));
        let port = server.rsplit_once(':').map_or("5432", |(_, port)| port);
        let directories = admin_query("SHOW unix_socket_directories").expect("socket directories");
        let found = directories
            .iter()
            .flat_map(|d| d.split(','))
            .map(str::trim)
            .find(|d| Path::new(d).join(format!(".s.PGSQL.{port}")).exists());
        let Some(directory) = found else {
            let why = format!(
                "the server at `{server}` has no Unix-domain socket on this host (directories: {directories:?})"
            );
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            #[allow(clippy::print_stderr)]
            {
                eprintln!("skipped: {why}");
            }
            return None;
        };
        let host = directory.replace('%', "%25").replace('/', "%2F");
        Some(url.replacen("127.0.0.1:1", &format!("{host}:{port}"), 1))
    }

    /// The server's address, and the test's URL with `addr` in its place: for a test that reaches the
    /// server through a forwarder of its own.
    pub(crate) fn url_through(&self, addr: std::net::SocketAddr) -> (String, String) {
        let url = self.url();
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let (user, rest) = rest.split_once('@').unwrap_or(("", rest));
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let server = rest[..end].to_owned();
        let user = if user.is_empty() {
            String::new()
        } else {
            format!("{user}@")
        };
        (server, format!("{scheme}://{user}{addr}{}", &rest[end..]))
    }

    /// Runs `sql` in the test's schema; the first column of the rows of its last statement, as text.
    pub(crate) fn sql(&self, sql: &str) -> Vec<String> {
        admin_query(&format!("SET search_path TO {}; {sql}", self.schema)).expect("the query runs")
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs archon in the test's directory, its runs in the test's schema (through `ARCHON_STORE`).
    pub(crate) fn archon(&self, args: &[&str]) -> Output {
        archon_with(self.path(), args, &[("ARCHON_STORE", &self.url())])
    }

    fn spawn(&self, args: &[&str]) -> Child {
        Command::new(env!("CARGO_BIN_EXE_archon"))
            .args(args)
            .current_dir(self.path())
            .env("NO_COLOR", "1")
            .env("ARCHON_STORE", self.url())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("archon starts")
    }

    fn runs(&self) -> Vec<Json> {
        let Output {
            code,
            stdout,
            stderr,
        } = self.archon(&["runs", "--json"]);
        assert_eq!(code, 0, "{stderr}");
        match serde_json::from_str(&stdout).expect("runs as JSON") {
            Json::Array(runs) => runs,
            other => panic!("not a list: {other}"),
        }
    }

    pub(crate) fn show(&self, id: &str) -> Json {
        let Output {
            code,
            stdout,
            stderr,
        } = self.archon(&["show", id, "--json"]);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str(&stdout).expect("run as JSON")
    }
}

fn wait_for(path: &Path, limit: Duration) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < limit,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn attempts(run: &Json, step: &str) -> Vec<Json> {
    run["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .filter(|a| a["step"] == step)
        .cloned()
        .collect()
}

const HELLO: &str = r#"name: hello
inputs:
  who: { type: string, default: world }
steps:
  - id: greet
    tool: exec
    with: { argv: [sh, -c, "echo hello, {{ inputs.who }}; echo careful >&2"] }
outputs:
  greeting: "{{ steps.greet.output }}"
"#;

#[test]
fn runs_are_kept_listed_shown_and_logged_in_postgres() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("hello.yaml"), HELLO).expect("write");
    // `--store` on the command line, as well as through the environment.
    let url = db.url();
    let Output {
        code,
        stdout,
        stderr,
    } = archon_with(
        db.path(),
        &[
            "run",
            "hello.yaml",
            "--input",
            "who=ann",
            "--json",
            "--store",
            &url,
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    let id = report["run_id"].as_str().expect("id").to_owned();
    // Nothing in the state directory: the run is in the database.
    assert!(!db.path().join(".archon/state.db").exists());
    let runs = db.runs();
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (
            runs[0]["id"].as_str(),
            runs[0]["status"].as_str(),
            runs[0]["workflow"].as_str()
        ),
        (Some(id.as_str()), Some("succeeded"), Some("hello"))
    );
    let run = db.show(&id);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["outputs"]["greeting"], "hello, ann");
    assert_eq!(attempts(&run, "greet").len(), 1);
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["logs", &id, "greet"]);
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (0, "hello, ann\n", "careful\n")
    );
    // The same run by prefix and as `--last`.
    let Output { code, stdout, .. } = db.archon(&["show", &id[..12], "--json"]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Json>(&stdout).expect("run")["id"],
        id.as_str()
    );
    let Output { code, stdout, .. } = db.archon(&["runs", "--check"]);
    assert_eq!(code, 0);
    assert_eq!(stdout, format!("`{}`: no damage found\n", db.url()));
    // A bundled example, through the environment this time.
    let hello = crate::support::root().join("workflows/hello.yaml");
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["run", hello.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    assert_eq!(report["outputs"]["greeting"], "hello, world");
    let shown = db.show(report["run_id"].as_str().expect("id"));
    assert_eq!(
        (shown["workflow"].as_str(), shown["status"].as_str()),
        (Some("hello"), Some("succeeded"))
    );
    assert_eq!(db.runs().len(), 2);
    // Without `--store`, the state directory's store is another one: empty.
    let Output { code, stdout, .. } =
        archon_with(db.path(), &["runs"], &[("NO_ARCHON_STORE", "1")]);
    assert_eq!((code, stdout.as_str()), (0, "no runs in `.archon`\n"));
}

const SLOW: &str = r#"name: slow
tools:
  watch:
    description: Waits for the `go` file; safe to repeat
    idempotent: true
    parameters: { type: object, properties: {} }
    command: [sh, -c, "while [ ! -f go ]; do sleep 0.02; done"]
steps:
  - { id: first, tool: write_file, with: { path: first.txt, content: done } }
  - id: wait
    needs: [first]
    tool: exec
    with: { argv: [sh, -c, "touch started; while [ ! -f go ]; do sleep 0.02; done; echo ran >> effects.txt"] }
  - { id: cheap, needs: [first], tool: watch }
  - { id: last, needs: [wait, cheap], tool: write_file, with: { path: last.txt, content: "{{ steps.first.output.bytes }} bytes" } }
"#;

#[test]
fn a_run_killed_with_sigkill_resumes_from_postgres() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    let mut child = db.spawn(&["run", "slow.yaml"]);
    wait_for(&db.path().join("started"), Duration::from_secs(20));
    // Wait until the store holds the process group of the attempt under way.
    let id = db.runs()[0]["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !attempts(&db.show(&id), "wait")
        .iter()
        .any(|a| a["status"] == "running" && !a["pgid"].is_null())
    {
        assert!(
            Instant::now() < deadline,
            "the process group was never recorded"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // While the owner lives, nobody else may resume the run.
    let Output { code, stderr, .. } = db.archon(&["resume", &id]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is being run by process"), "{stderr}");
    child.kill().expect("killed");
    child.wait().expect("reaped");

    assert_eq!(db.runs()[0]["status"], "interrupted");
    let Output { code, stderr, .. } = db.archon(&["resume", &id]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("`wait`") && !stderr.contains("`cheap`"),
        "{stderr}"
    );
    assert!(stderr.contains("its command is still running"), "{stderr}");

    // The leftover command is stopped by the resume; then `go` lets the new attempt finish.
    let mut resumed = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["resume", &id, "--rerun-in-doubt"])
        .current_dir(db.path())
        .env("NO_COLOR", "1")
        .env("ARCHON_STORE", db.url())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("archon starts");
    let stderr = resumed.stderr.take().expect("piped");
    let go = db.path().join("go");
    let reader = std::thread::spawn(move || {
        use std::io::{BufRead, BufReader};
        let mut text = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.expect("utf-8");
            if text.is_empty() {
                std::fs::write(&go, "").expect("write");
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let status = resumed.wait().expect("exits");
    let stderr = reader.join().expect("joined");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("reused    first"), "{stderr}");
    assert!(stderr.contains("stopped process group"), "{stderr}");
    let run = db.show(&id);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(
        attempts(&run, "first").len(),
        1,
        "finished steps do not run again"
    );
    assert_eq!(attempts(&run, "wait").len(), 2);
    assert_eq!(
        std::fs::read_to_string(db.path().join("effects.txt")).expect("written"),
        "ran\n",
        "the killed attempt never got to its effect"
    );
    assert_eq!(
        std::fs::read_to_string(db.path().join("last.txt")).expect("written"),
        "4 bytes"
    );
}

const APPROVE: &str = r#"name: approve
steps:
  - id: pay
    tool: exec
    approval: required
    with: { argv: ["sh", "-c", "echo paid >> effects.txt"] }
  - id: after
    tool: echo
    with: { done: "{{ steps.pay.exit_code }}" }
"#;

#[test]
fn a_run_paused_for_approval_is_approved_and_resumed_from_postgres() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("approve.yaml"), APPROVE).expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["run", "approve.yaml", "--no-input", "--json"]);
    assert_eq!(code, 3, "{stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    let id = report["run_id"].as_str().expect("id").to_owned();
    assert_eq!(report["status"], "waiting_approval");
    assert!(!db.path().join("effects.txt").exists(), "nothing ran");
    assert_eq!(db.runs()[0]["status"], "waiting_approval");

    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&[
        "approve",
        &id,
        "--step",
        "pay",
        "--reason",
        "invoice checked",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("approved pay: `exec`"), "{stdout}");
    let Output { code, stderr, .. } = db.archon(&["approve", &id]);
    assert_eq!(code, 2, "nothing is left to approve: {stderr}");

    let Output { code, stderr, .. } = db.archon(&["resume", &id, "--no-input"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(db.path().join("effects.txt")).expect("ran"),
        "paid\n",
        "exactly one execution"
    );
    let run = db.show(&id);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["approvals"][0]["decision"]["approved"], true);
    assert_eq!(run["approvals"][0]["decision"]["reason"], "invoice checked");
}

#[test]
fn cancel_stops_a_live_run_in_postgres_for_good() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    let mut child = db.spawn(&["run", "slow.yaml"]);
    wait_for(&db.path().join("started"), Duration::from_secs(20));
    let id = db.runs()[0]["id"].as_str().expect("id").to_owned();
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["cancel", &id]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("asked the process"), "{stdout}");
    let status = child.wait().expect("exits");
    assert_eq!(status.code(), Some(130));
    assert_eq!(db.runs()[0]["status"], "cancelled");
    let Output { code, stderr, .. } = db.archon(&["resume", &id]);
    assert_eq!(code, 2);
    assert!(stderr.contains("was cancelled"), "{stderr}");
}

#[test]
fn a_store_url_that_is_not_postgres_is_refused_and_passwords_are_masked() {
    let dir = TempDir::new().expect("tempdir");
    let Output {
        code,
        stdout,
        stderr,
    } = archon_with(
        dir.path(),
        &["runs", "--store", "mysql://ann:s3cret@db.example/runs"],
        &[],
    );
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (
            1,
            "",
            "error: unsupported run store `mysql://ann:***@db.example/runs`: only PostgreSQL URLs (`postgres://` or `postgresql://`) are supported\n  hint: leave `--store` (and `ARCHON_STORE`) out to keep runs in the state directory\n"
        )
    );
    // `archon runs` on the store `url`: its status, standard output and standard error.
    let runs_at = |url: &str| {
        let Output {
            code,
            stdout,
            stderr,
        } = archon_with(dir.path(), &["runs"], &[("ARCHON_STORE", url)]);
        (code, stdout, stderr)
    };
    // Nothing listens on port 1.
    assert_eq!(
        runs_at("postgres://ann:s3cret@127.0.0.1:1/runs"),
        (
            1,
            String::new(),
            "error: cannot reach the run store `postgres://ann:***@127.0.0.1:1/runs`: error connecting to server: connection refused (os error 111)\n  hint: check that the PostgreSQL server is up and reachable from here\n".to_owned()
        )
    );
    // No socket there: the hint names the socket file looked for (a password with a raw `/` is masked
    // whole).
    assert_eq!(
        runs_at("postgres://ann:s3/cret@%2Fnowhere%2Fsockets:5433/runs"),
        (
            1,
            String::new(),
            "error: cannot reach the run store `postgres://ann:***@%2Fnowhere%2Fsockets:5433/runs`: error connecting to server: no such file or directory (os error 2)\n  hint: check that the PostgreSQL server is up and listens on `/nowhere/sockets/.s.PGSQL.5433` (the URL's host is the socket's directory)\n".to_owned()
        )
    );
    // `--help` names the variable but never shows its value.
    let Output { stdout, .. } = archon_with(
        dir.path(),
        &["runs", "--help"],
        &[("ARCHON_STORE", "postgres://ann:s3cret@127.0.0.1:1/runs")],
    );
    assert!(stdout.contains("[env: ARCHON_STORE]"), "{stdout}");
    assert!(!stdout.contains("s3cret"), "{stdout}");
}

/// `archon serve` on the database shows, live, the runs other processes record there (from another state
/// directory: only the database is shared), and the runs it starts are there for the CLI.
#[tokio::test(flavor = "multi_thread")]
async fn serve_shows_the_runs_other_processes_record_in_postgres_live() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("hello.yaml"), HELLO).expect("write");
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    let token = "operator-token-0123456789abcdef";
    std::fs::write(db.path().join("tokens"), format!("operator {token} ana\n")).expect("write");
    let url = db.url();
    let mut server = crate::serve::serve(
        db.path(),
        &["--token-file", "tokens"],
        &[("ARCHON_STORE", &url)],
    );
    server.token = Some(token.to_owned());
    let mut list = server.stream("/api/v1/runs/stream").await;
    let elsewhere = TempDir::new().expect("tempdir");
    std::fs::write(elsewhere.path().join("hello.yaml"), HELLO).expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = archon_with(
        elsewhere.path(),
        &["run", "hello.yaml", "--input", "who=cli", "--json"],
        &[("ARCHON_STORE", &url)],
    );
    assert_eq!(code, 0, "{stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    let id = report["run_id"].as_str().expect("id").to_owned();
    loop {
        let (kind, data) = list.next(Duration::from_secs(20)).await;
        if kind == "run" && data["id"] == id.as_str() && data["status"] == "succeeded" {
            break;
        }
    }
    let (status, body) = server.get(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    // A run the server starts is in the database, for the CLI anywhere.
    let started = server
        .start("hello", serde_json::json!({"who": "server"}))
        .await;
    server.wait_for(&started, &["succeeded"]).await;
    let Output {
        code,
        stdout,
        stderr,
    } = archon_with(
        elsewhere.path(),
        &["show", &started, "--json"],
        &[("ARCHON_STORE", &url)],
    );
    assert_eq!(code, 0, "{stderr}");
    let run: Json = serde_json::from_str(&stdout).expect("run");
    assert_eq!(
        (run["status"].as_str(), run["outputs"]["greeting"].as_str()),
        (Some("succeeded"), Some("hello, server"))
    );

    // `archon cancel` from another state directory stops only that run of the server: the database
    // says the server serves many runs, so it is asked, not signalled.
    let slow = server.start("slow", serde_json::json!({})).await;
    let started = db.path().join("started");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !started.exists() {
        assert!(Instant::now() < deadline, "the slow run never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let Output {
        code,
        stdout,
        stderr,
    } = archon_with(
        elsewhere.path(),
        &["cancel", &slow],
        &[("ARCHON_STORE", &url)],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("asked the process"), "{stdout}");
    server.wait_for(&slow, &["cancelled"]).await;
    let (status, _) = server.get("/api/v1/session").await;
    assert_eq!(status, 200, "the server goes on");
}
