//! `archon serve` as the tests run it, the one way every test module starts one (tests/serve.rs,
//! serve_browser.rs, serve_triggers.rs, docs.rs): the real binary on a free port (`--port 0`), found
//! where it says `listening on URL`, everything it writes on standard error kept for the test to read
//! and wait for, stopped with SIGTERM (as a person's Ctrl-C or a service manager would) when the test
//! asks or drops it.

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

/// How long a test waits for what a server should do promptly (a line, an API answer).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A running `archon serve` and where it listens.
pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub url: String,
    pub http: reqwest::Client,
    /// The bearer token requests send, if any.
    pub token: Option<String>,
    /// Everything it wrote on standard error, from its first line.
    stderr: Arc<Mutex<String>>,
}

/// `archon serve . --port 0 ARGS` in `dir`, with `env` set and neither `ARCHON_STATE_DIR` nor
/// `ARCHON_SERVE_TOKEN` taken from the test's own environment.
pub fn serve(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut command = Command::new(env!("CARGO_BIN_EXE_archon"));
    command
        .args(["serve", ".", "--port", "0"])
        .args(args)
        .current_dir(dir)
        .env_remove("ARCHON_STATE_DIR")
        .env_remove("ARCHON_SERVE_TOKEN")
        .envs(env.iter().copied());
    start(command)
}

/// Starts `command`, which starts a server (`archon serve`, or a shell that `exec`s it), and returns
/// once it says where it listens; panics with what it said if it ends first.
pub fn start(mut command: Command) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the server starts");
    let stderr = child.stderr.take().expect("its standard error");
    let mut lines = std::io::BufReader::new(stderr).lines();
    let said = Arc::new(Mutex::new(String::new()));
    let url = loop {
        let Some(Ok(line)) = lines.next() else {
            let status = child.wait().expect("it ends");
            panic!(
                "the server ended ({status}) before it said where it listens:\n{}",
                said.lock().map(|s| s.clone()).unwrap_or_default()
            );
        };
        if let Ok(mut said) = said.lock() {
            said.push_str(&line);
            said.push('\n');
        }
        if let Some(url) = line.strip_prefix("listening on ") {
            break url.trim_end_matches('/').to_owned();
        }
    };
    let keep = said.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if let Ok(mut said) = keep.lock() {
                said.push_str(&line);
                said.push('\n');
            }
        }
    });
    Server {
        child,
        url,
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client"),
        token: None,
        stderr: said,
    }
}

impl Server {
    /// Everything it wrote on standard error so far.
    pub fn said(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits (at most [`PATIENCE`]) until it has written the line `line` on standard error.
    pub async fn wait_said(&self, line: &str) {
        let deadline = Instant::now() + PATIENCE;
        while !self.said().lines().any(|l| l == line) {
            assert!(
                Instant::now() < deadline,
                "never said `{line}`:\n{}",
                self.said()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A request to `path` (from `/`), with the bearer token if the server has one set.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// `GET path`: its status and body (JSON, or the text as a JSON string).
    pub async fn get(&self, path: &str) -> (u16, Json) {
        answer(self.request(reqwest::Method::GET, path)).await
    }

    /// `POST path` with a JSON body: its status and body.
    pub async fn post(&self, path: &str, body: Json) -> (u16, Json) {
        answer(self.request(reqwest::Method::POST, path).json(&body)).await
    }

    /// Polls `GET path` until it answers `200` with a body of which `done` holds, [`PATIENCE`] at most.
    pub async fn poll(&self, path: &str, done: impl Fn(&Json) -> bool) -> Json {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (status, body) = self.get(path).await;
            if status == 200 && done(&body) {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{path} never got there: {status} {body}\n{}",
                self.said()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends it SIGTERM.
    pub fn terminate(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM was not sent");
    }

    /// Stops it with SIGTERM and waits (10 s at most, then kills it) for it to end; how it ended.
    pub fn stop(&mut self) -> ExitStatus {
        stop_child(&mut self.child, Duration::from_secs(10))
    }
}

/// Stops `child` with SIGTERM and waits (`patience` at most, then kills it) for it to end; how it ended.
/// Never panics: a drop while a test panics calls it.
pub fn stop_child(child: &mut Child, patience: Duration) -> ExitStatus {
    if let Ok(Some(status)) = child.try_wait() {
        return status;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait().expect("it ends")
}

impl Drop for Server {
    /// Stopped as [`Server::stop`] does, its runs interrupted and their commands stopped.
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

async fn answer(request: reqwest::RequestBuilder) -> (u16, Json) {
    let response = request.send().await.expect("answered");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Json::String(text)),
    )
}
