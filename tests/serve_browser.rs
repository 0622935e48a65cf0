//! The dashboard of `archon serve`: its pages over HTTP (what a viewer and an operator see and may do,
//! cross-site refusals, no secret in any page, the Content-Security-Policy and the cached assets, the run
//! list's filters and pages), and in a real headless Chromium driven by `tests/browser/dashboard.mjs`
//! (playwright-core, pinned in tests/npm): a run followed live while it executes, a call approved from
//! the approvals page, a failed step retried, a run form refusing a value its schema does not allow.
//! Screenshots go to `target/screenshots/`; with `ARCHON_UPDATE_SCREENSHOT=1` the run page's becomes
//! `docs/images/serve-run.png`, the README's.
//!
//! The browser tests need `chromium` (scripts/install-chromium.sh), Node.js and tests/npm's packages
//! (scripts/install-test-deps.sh): without them they are skipped with the reason, except under `CI=true`,
//! where they fail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tempfile::TempDir;

use crate::support::root;
use crate::support::serve::Server;

/// Builds and tests, then waits at `gate` until the file `go` exists beside it, then publishes.
const RELEASE: &str = r#"name: release
description: Builds and tests a version, then publishes it once it is let through
inputs:
  version: { type: string, default: "1.2.3", description: The version to release }
  replicas: { type: integer, minimum: 1, maximum: 5, default: 3, description: How many servers get it }
steps:
  - id: build
    tool: exec
    with: { argv: ["sh", "-c", "echo building {{ inputs.version }}"] }
  - id: test
    tool: exec
    with: { argv: ["sh", "-c", "echo 12 tests passed"] }
  - id: gate
    tool: exec
    needs: [build, test]
    timeout: 60s
    with: { argv: ["sh", "-c", "while [ ! -f go ]; do sleep 0.05; done; echo let through"] }
  - id: publish
    tool: exec
    needs: [gate]
    with: { argv: ["sh", "-c", "echo released {{ inputs.version }} to {{ inputs.replicas }} servers"] }
  - id: announce
    tool: echo
    needs: [publish]
    with: { text: "{{ inputs.version }} is out" }
outputs:
  released: "{{ steps.publish.output | trim }}"
"#;

/// Pays once a person approves, with a secret among its arguments.
const PAY: &str = r#"name: pay
secrets: [DASHBOARD_TEST_SECRET]
inputs:
  amount: { type: integer, default: 12 }
steps:
  - id: pay
    tool: exec
    approval: required
    with: { argv: ["sh", "-c", "echo paid {{ inputs.amount }} with {{ secrets.DASHBOARD_TEST_SECRET }} >> effects.txt"] }
"#;

/// Fails until the file `ok` exists beside it.
const FLAKY: &str = r#"name: flaky
steps:
  - id: check
    tool: exec
    with: { argv: ["sh", "-c", "test -f ok || { echo not yet >&2; exit 3; }"] }
  - id: after
    tool: echo
    needs: [check]
    with: { done: true }
"#;

/// Says hello, with its secret in what it prints (which the run masks).
const HELLO: &str = r#"name: hello
secrets: [DASHBOARD_TEST_SECRET]
steps:
  - id: greet
    tool: exec
    with: { argv: ["sh", "-c", "echo hello with {{ secrets.DASHBOARD_TEST_SECRET }}"] }
"#;

const SECRET: &str = "dashboard-secret-that-must-never-show";
const OPERATOR: &str = "operator-token-0123456789abcdef";
const VIEWER: &str = "viewer-token-0123456789abcdef";

fn workflows() -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    for (name, text) in [
        ("release.yaml", RELEASE),
        ("pay.yaml", PAY),
        ("flaky.yaml", FLAKY),
        ("hello.yaml", HELLO),
        (
            "broken.yaml",
            "name: broken\nsteps:\n  - id: a\n    tool: nope\n",
        ),
    ] {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    std::fs::write(
        dir.path().join("tokens"),
        format!("operator {OPERATOR} ana\nviewer {VIEWER} vic\n"),
    )
    .expect("write");
    dir
}

/// `archon serve . --port 0 ARGS` in `dir` (tests/support/serve.rs), with the secret of `pay` and
/// `hello`; stopped with SIGTERM (its runs are interrupted and their commands stopped) when dropped.
fn serve(dir: &Path, args: &[&str]) -> Server {
    crate::support::serve::serve(dir, args, &[("DASHBOARD_TEST_SECRET", SECRET)])
}

/// A response's status, headers and body.
struct Got {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Got {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

impl Server {
    async fn got(&self, request: reqwest::RequestBuilder) -> Got {
        let response = request.send().await.expect("answered");
        Got {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.text().await.expect("a body"),
        }
    }

    async fn page(&self, path: &str, token: Option<&str>) -> Got {
        let mut request = self.http.get(format!("{}{path}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        self.got(request).await
    }

    /// Starts a run through the API with the operator's token; its id.
    async fn start_run(&self, workflow: &str, token: Option<&str>) -> String {
        let mut request = self
            .http
            .post(format!("{}/api/v1/workflows/{workflow}/runs", self.url))
            .json(&json!({}));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        } else {
            let session = self.page("/api/v1/session", None).await;
            let csrf: Json = serde_json::from_str(&session.body).expect("json");
            request = request.header("x-csrf-token", csrf["csrf"].as_str().expect("csrf"));
        }
        let got = self.got(request).await;
        assert_eq!(got.status, 202, "{}", got.body);
        let started: Json = serde_json::from_str(&got.body).expect("json");
        started["run_id"].as_str().expect("run id").to_owned()
    }

    /// Follows the run's event stream until its `run` event says one of `statuses`.
    async fn wait_status(&self, run: &str, statuses: &[&str], token: Option<&str>) {
        let mut request = self
            .http
            .get(format!("{}/api/v1/runs/{run}/stream", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let mut response = request.send().await.expect("stream");
        let mut buffer = String::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let kind = block.lines().find_map(|l| l.strip_prefix("event:"));
                let data = block.lines().find_map(|l| l.strip_prefix("data:"));
                if let (Some("run"), Some(data)) = (kind.map(str::trim), data) {
                    let summary: Json = serde_json::from_str(data.trim()).expect("json");
                    if statuses.contains(&summary["status"].as_str().unwrap_or_default()) {
                        return;
                    }
                }
            }
            let chunk = tokio::time::timeout_at(deadline, response.chunk())
                .await
                .unwrap_or_else(|_| panic!("run `{run}` never reached {statuses:?}"))
                .expect("the stream reads")
                .expect("the stream is open");
            buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

/// Whether `html` has an attribute such as `onclick=`.
fn inline_handler(html: &str) -> bool {
    html.split(" on").skip(1).any(|rest| {
        let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
        !name.is_empty() && rest[name.len()..].starts_with('=')
    })
}

const FORM: &str = "application/x-www-form-urlencoded";

/// A form's body.
fn form(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// Each `data-run` of a runs page, in order.
fn listed(html: &str) -> Vec<String> {
    html.split("<tr data-run=\"")
        .skip(1)
        .filter_map(|part| part.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// The `value` of the hidden `csrf` field of a page.
fn csrf_of(html: &str) -> String {
    html.split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a csrf field")
        .to_owned()
}

// ---------------------------------------------------------------------------------------------------
// Over HTTP

#[tokio::test]
async fn pages_send_a_strict_policy_and_assets_named_by_their_content() {
    let dir = workflows();
    let server = serve(dir.path(), &[]);
    let page = server.page("/workflows", None).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-security-policy"),
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    assert_eq!(page.header("x-frame-options"), "DENY");
    assert_eq!(page.header("cache-control"), "no-store");
    // No inline script or style anywhere: only the two files, by their hashed names.
    assert_eq!(page.body.matches("<script").count(), 1, "{}", page.body);
    assert!(!page.body.contains("<style"));
    assert!(!page.body.contains(" style="));
    assert!(
        !inline_handler(&page.body),
        "an inline handler: {}",
        page.body
    );
    let script = page
        .body
        .split(r#"<script src=""#)
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a script")
        .to_owned();
    let css = page
        .body
        .split(r#"<link rel="stylesheet" href=""#)
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a stylesheet")
        .to_owned();
    let hashed = |name: &str, ext: &str| {
        name.strip_prefix("/assets/app.")
            .and_then(|rest| rest.strip_suffix(ext))
            .is_some_and(|hash| hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    assert!(hashed(&script, ".js"), "{script}");
    assert!(hashed(&css, ".css"), "{css}");
    let js = server.page(&script, None).await;
    assert_eq!(
        (
            js.status,
            js.header("content-type"),
            js.header("cache-control")
        ),
        (
            200,
            "text/javascript; charset=utf-8",
            "public, max-age=31536000, immutable"
        )
    );
    assert_eq!(
        js.body,
        std::fs::read_to_string(root().join("cli/commands/serve/pages/assets/app.js")).expect("js")
    );
    let sheet = server.page(&css, None).await;
    assert_eq!(sheet.header("content-type"), "text/css; charset=utf-8");
    assert_eq!(
        server
            .page("/assets/app.000000000000.js", None)
            .await
            .status,
        404
    );
    // `/` is the run list.
    let home = server.page("/", None).await;
    assert_eq!((home.status, home.header("location")), (303, "/runs"));
}

#[tokio::test]
async fn no_page_shows_a_secret() {
    let dir = workflows();
    let server = serve(dir.path(), &[]);
    let hello = server.start_run("hello", None).await;
    server.wait_status(&hello, &["succeeded"], None).await;
    let pay = server.start_run("pay", None).await;
    server.wait_status(&pay, &["waiting_approval"], None).await;
    let mut all = String::new();
    for path in [
        "/runs".to_owned(),
        "/workflows".to_owned(),
        "/workflows/hello".to_owned(),
        "/workflows/pay".to_owned(),
        "/approvals".to_owned(),
        format!("/runs/{hello}"),
        format!("/runs/{hello}/step?name=greet"),
        format!("/runs/{hello}/trail"),
        format!("/runs/{pay}"),
    ] {
        let got = server.page(&path, None).await;
        assert_eq!(got.status, 200, "{path}: {}", got.body);
        all.push_str(&got.body);
    }
    // What the run printed and the call's arguments are there, masked.
    assert!(all.contains("hello with ***"), "{all}");
    assert!(
        all.contains("echo paid 12 with *** &gt;&gt; effects.txt"),
        "{all}"
    );
    assert!(!all.contains(SECRET), "a page shows the secret");
}

#[tokio::test]
async fn a_viewer_sees_no_action_and_cannot_post() {
    let dir = workflows();
    let server = serve(dir.path(), &["--token-file", "tokens"]);
    let run = server.start_run("flaky", Some(OPERATOR)).await;
    server.wait_status(&run, &["failed"], Some(OPERATOR)).await;
    // Without credentials, a page sends to the login form.
    let anonymous = server.page(&format!("/runs/{run}"), None).await;
    assert_eq!(
        (anonymous.status, anonymous.header("location")),
        (303, format!("/login?next=%2Fruns%2F{run}").as_str())
    );
    // An operator's page has the actions; a viewer's has none, and no run form.
    let operator = server.page(&format!("/runs/{run}"), Some(OPERATOR)).await;
    assert!(
        operator.body.contains(r#"action="/runs/"#),
        "{}",
        operator.body
    );
    assert!(operator.body.contains(">Retry failed steps</button>"));
    for path in [format!("/runs/{run}"), "/workflows/flaky".to_owned()] {
        let viewer = server.page(&path, Some(VIEWER)).await;
        assert_eq!(viewer.status, 200);
        assert!(
            !viewer.body.contains("method=\"post\""),
            "{path}: {}",
            viewer.body
        );
        assert!(
            viewer
                .body
                .contains("vic <span class=\"role\">(viewer)</span>")
        );
    }
    let viewer_form = server.page("/workflows/flaky", Some(VIEWER)).await;
    assert!(
        viewer_form
            .body
            .contains("<p>Viewers cannot start runs: log in with an operator token to run it.</p>")
    );
    // A viewer's POST is refused before anything runs.
    for path in [
        format!("/runs/{run}/retry"),
        format!("/runs/{run}/cancel"),
        "/workflows/flaky".to_owned(),
    ] {
        let refused = server
            .got(
                server
                    .http
                    .post(format!("{}{path}", server.url))
                    .bearer_auth(VIEWER)
                    .header("content-type", FORM)
                    .body(form(&[("from", "check")])),
            )
            .await;
        assert_eq!(refused.status, 403, "{path}");
        assert!(refused.body.contains("a viewer cannot change anything"));
    }
    // Logged in with a cookie, an operator's form needs its CSRF token, and a cross-site POST is
    // refused even with it.
    let login = server
        .got(
            server
                .http
                .post(format!("{}/login", server.url))
                .header("content-type", FORM)
                .body(form(&[("token", OPERATOR), ("next", "/workflows/flaky")])),
        )
        .await;
    assert_eq!(login.status, 303);
    let cookie = login
        .header("set-cookie")
        .split(';')
        .next()
        .expect("cookie")
        .to_owned();
    let page = server
        .got(
            server
                .http
                .get(format!("{}/runs/{run}", server.url))
                .header("cookie", &cookie),
        )
        .await;
    let csrf = csrf_of(&page.body);
    let post = |fields: Vec<(&'static str, String)>, origin: Option<&'static str>| {
        let mut request = server
            .http
            .post(format!("{}/runs/{run}/retry", server.url))
            .header("cookie", &cookie)
            .header("content-type", FORM)
            .body(form(
                &fields
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect::<Vec<_>>(),
            ));
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request
    };
    let no_token = server.got(post(vec![], None)).await;
    assert_eq!(no_token.status, 403);
    assert!(no_token.body.contains("the CSRF token is missing or wrong"));
    let cross = server
        .got(post(
            vec![("csrf", csrf.clone())],
            Some("http://evil.example"),
        ))
        .await;
    assert_eq!(cross.status, 403);
    assert!(cross.body.contains("cross-site requests are refused"));
    std::fs::write(dir.path().join("ok"), "").expect("write");
    let retried = server.got(post(vec![("csrf", csrf)], None)).await;
    assert_eq!(
        (retried.status, retried.header("location")),
        (303, format!("/runs/{run}").as_str())
    );
    server
        .wait_status(&run, &["succeeded"], Some(OPERATOR))
        .await;
}

#[tokio::test]
async fn a_refused_action_shows_why_on_the_runs_page() {
    let dir = workflows();
    let server = serve(dir.path(), &[]);
    let run = server.start_run("flaky", None).await;
    server.wait_status(&run, &["failed"], None).await;
    let page = server.page(&format!("/runs/{run}"), None).await;
    let refused = server
        .got(
            server
                .http
                .post(format!("{}/runs/{run}/resume", server.url))
                .header("content-type", FORM)
                .body(form(&[("csrf", &csrf_of(&page.body))])),
        )
        .await;
    assert_eq!(refused.status, 409);
    let problem = refused
        .body
        .split(r#"<p class="problem" role="alert">"#)
        .nth(1)
        .and_then(|p| p.split("</p>").next())
        .expect("a problem");
    assert_eq!(
        problem,
        format!(
            "run <code>{run}</code> already ended: <code>failed</code><br><span class=\"hint\">hint: <code>archon retry {run} --from STEP</code> runs a step and everything after it again</span>"
        )
    );
}

#[tokio::test]
async fn the_run_list_filters_and_pages() {
    let dir = workflows();
    std::fs::write(dir.path().join("ok"), "").expect("write");
    // 51 runs of `hello` and one of `flaky`, each through `archon run` on the same state directory.
    let mut hello = Vec::new();
    for _ in 0..51 {
        let out = crate::support::archon_with(
            dir.path(),
            &["run", "hello.yaml", "--json"],
            &[("DASHBOARD_TEST_SECRET", SECRET)],
        );
        assert_eq!(out.code, 0, "{}", out.stderr);
        let report: Json = serde_json::from_str(&out.stdout).expect("json");
        hello.push(report["run_id"].as_str().expect("id").to_owned());
    }
    std::fs::remove_file(dir.path().join("ok")).expect("remove");
    let out = crate::support::archon_with(dir.path(), &["run", "flaky.yaml", "--json"], &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let flaky: Json = serde_json::from_str(&out.stdout).expect("json");
    let flaky = flaky["run_id"].as_str().expect("id").to_owned();
    let server = serve(dir.path(), &[]);
    hello.reverse();
    let first = server.page("/runs", None).await;
    assert_eq!(first.status, 200);
    let mut expected: Vec<String> = vec![flaky.clone()];
    expected.extend(hello[..49].iter().cloned());
    assert_eq!(listed(&first.body), expected);
    assert!(first.body.contains("Runs 1–50 of 52, newest first."));
    let next = first
        .body
        .split(r#"<a href=""#)
        .find_map(|part| part.split_once(r#"" rel="next">Older runs »</a>"#))
        .map(|(href, _)| href.replace("&amp;", "&"))
        .expect("a next page");
    let second = server.page(&next, None).await;
    assert_eq!(listed(&second.body), hello[49..].to_vec());
    assert!(second.body.contains("Runs 51–52 of 52, newest first."));
    assert!(second.body.contains(r#"<a href="/runs">« Newest</a>"#));
    assert!(!second.body.contains("Older runs"));
    let failed = server.page("/runs?status=failed", None).await;
    assert_eq!(listed(&failed.body), vec![flaky.clone()]);
    assert!(
        failed
            .body
            .contains(r#"<option value="failed" selected>failed</option>"#)
    );
    let by_workflow = server.page("/runs?workflow=flaky&status=", None).await;
    assert_eq!(listed(&by_workflow.body), vec![flaky]);
    let later = server.page("/runs?since=2999-01-01T00:00", None).await;
    assert_eq!(listed(&later.body), Vec::<String>::new());
    assert!(later.body.contains("No run matches."));
    let earlier = server.page("/runs?until=2000-01-01", None).await;
    assert!(earlier.body.contains("No run matches."));
    let wrong = server.page("/runs?since=yesterday", None).await;
    assert_eq!(wrong.status, 400);
    assert!(wrong.body.contains(
        r#"<p class="problem" role="alert"><code>since</code> is not a time: <code>yesterday</code><br><span class="hint">hint: write <code>2026-11-27T04:20</code> (UTC), <code>2026-11-27</code>, or milliseconds since the epoch</span></p>"#
    ), "{}", wrong.body);
}

// ---------------------------------------------------------------------------------------------------
// In Chromium

/// What the browser tests need: Chromium, Node.js and playwright-core.
struct Browser {
    chromium: PathBuf,
}

/// The browser, or `None` (with the reason printed) when something it needs is missing outside CI.
#[allow(clippy::print_stderr)]
fn browser() -> Option<Browser> {
    let chromium = std::env::var_os("ARCHON_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let driver = root().join("tests/npm/node_modules/playwright-core/package.json");
    let missing = if !chromium.exists() {
        Some(format!(
            "no Chromium at `{}` (scripts/install-chromium.sh installs it)",
            chromium.display()
        ))
    } else if !node {
        Some("no `node` on PATH".to_owned())
    } else if !driver.exists() {
        Some("playwright-core is not installed (scripts/install-test-deps.sh)".to_owned())
    } else {
        None
    };
    match missing {
        None => Some(Browser { chromium }),
        Some(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("the browser tests cannot run under CI: {reason}")
        }
        Some(reason) => {
            eprintln!("skipped: {reason}");
            None
        }
    }
}

/// Where screenshots go: `target/screenshots/`.
fn screenshots() -> PathBuf {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from);
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).expect("screenshots directory");
    dir
}

impl Browser {
    /// Runs a scenario of tests/browser/dashboard.mjs against `server`; what it observed.
    fn drive(&self, server: &Server, scenario: &str, workdir: &Path, run: Option<&str>) -> Json {
        let output = Command::new("node")
            .arg(root().join("tests/browser/dashboard.mjs"))
            .arg(scenario)
            .current_dir(root().join("tests/npm"))
            .env("ARCHON_URL", &server.url)
            .env("WORKDIR", workdir)
            .env("SCREENSHOTS", screenshots())
            .env("CHROMIUM", &self.chromium)
            .env("RUN", run.unwrap_or_default())
            .env("SECRET", SECRET)
            .output()
            .expect("node runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "scenario `{scenario}` failed:\n{}\n{stdout}",
            String::from_utf8_lossy(&output.stderr)
        );
        let observed: Json =
            serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("json");
        assert_eq!(observed["problems"], json!([]), "the page logged errors");
        observed
    }
}

#[tokio::test]
async fn browser_follows_a_run_live_while_it_executes() {
    let Some(browser) = browser() else { return };
    let dir = workflows();
    let server = serve(dir.path(), &[]);
    let observed = browser.drive(&server, "live", dir.path(), None);
    let step = |node: &str, word: &str| json!({"node": format!("status-{node}"), "word": word, "cell": format!("status-{node}")});
    assert_eq!(observed["gate_running"], step("running", "running"));
    assert_eq!(observed["publish_before"], step("pending", "not started"));
    assert_eq!(observed["gate_done"], step("succeeded", "succeeded"));
    assert_eq!(observed["publish_done"], step("succeeded", "succeeded"));
    assert_eq!(observed["run_status"], "✓ succeeded");
    assert_eq!(observed["live_without_reload"], true);
    assert_eq!(
        observed["listed"],
        json!({"rows": 1, "count": "Runs 1–1 of 1, newest first.", "notReloaded": true})
    );
    assert_eq!(observed["latencies"], true);
    assert_eq!(
        observed["outputs"],
        "{\n  \"released\": \"released 1.2.3 to 3 servers\"\n}"
    );
    if std::env::var("ARCHON_UPDATE_SCREENSHOT").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(root().join("docs/images")).expect("docs/images");
        std::fs::copy(
            screenshots().join("run.png"),
            root().join("docs/images/serve-run.png"),
        )
        .expect("copied");
    }
}

#[tokio::test]
async fn browser_approves_a_waiting_call_and_the_run_finishes() {
    let Some(browser) = browser() else { return };
    let dir = workflows();
    let server = serve(dir.path(), &[]);
    let run = server.start_run("pay", None).await;
    server.wait_status(&run, &["waiting_approval"], None).await;
    let observed = browser.drive(&server, "approve", dir.path(), Some(&run));
    assert_eq!(observed["cards"], 1);
    assert_eq!(
        observed["arguments"],
        "{\n  \"with\": {\n    \"argv\": [\n      \"sh\",\n      \"-c\",\n      \"echo paid 12 with *** >> effects.txt\"\n    ]\n  }\n}"
    );
    assert_eq!(observed["why"], "the step says approval: required");
    assert_eq!(observed["after"], "No call waits for a decision.");
    assert_eq!(
        observed["decision"],
        format!("✓ approved by {} at TIME: looks right", person())
    );
    assert_eq!(
        observed["pay"],
        json!({"node": "status-succeeded", "word": "succeeded", "cell": "status-succeeded"})
    );
    assert_eq!(observed["page_holds_secret"], false);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("effects.txt")).expect("paid"),
        format!("paid 12 with {SECRET}\n")
    );
}

/// Who decisions are recorded as on a server without tokens (the user running it).
fn person() -> String {
    archon_engine::session::person(None)
}

#[tokio::test]
async fn browser_retries_a_failed_step() {
    let Some(browser) = browser() else { return };
    let dir = workflows();
    let server = serve(dir.path(), &[]);
    let run = server.start_run("flaky", None).await;
    server.wait_status(&run, &["failed"], None).await;
    let observed = browser.drive(&server, "retry", dir.path(), Some(&run));
    let step = |status: &str, word: &str| json!({"node": format!("status-{status}"), "word": word, "cell": format!("status-{status}")});
    assert_eq!(observed["check_failed"], step("failed", "failed"));
    assert_eq!(observed["after_skipped"], step("skipped", "skipped"));
    assert_eq!(observed["error"], "`sh` exited with code 3: not yet");
    assert_eq!(observed["check_done"], step("succeeded", "succeeded"));
    assert_eq!(observed["after_done"], step("succeeded", "succeeded"));
    assert_eq!(observed["attempts"], "2");
}

#[tokio::test]
async fn browser_shows_the_schema_error_of_a_run_form() {
    let Some(browser) = browser() else { return };
    let dir = workflows();
    // The run the valid form starts goes through its gate at once.
    std::fs::write(dir.path().join("go"), "").expect("write");
    let server = serve(dir.path(), &[]);
    let observed = browser.drive(&server, "form", dir.path(), None);
    assert_eq!(observed["invalid_fields"], json!(["replicas"]));
    assert_eq!(
        observed["error"],
        "input replicas is invalid: 9 is greater than the maximum of 5"
    );
    assert_eq!(
        observed["described"],
        "input-1-errors input-1-help input-1-notes"
    );
    assert_eq!(
        observed["kept"],
        json!({"version": "1.2.3", "replicas": "9"})
    );
    assert_eq!(
        observed["summary"],
        "The run did not start: 1 input has a problem, shown next to it."
    );
    assert_eq!(observed["started"], true);
}
