//! Findings of the adversarial test pass, each pinned by the test that failed before its fix.

use std::path::Path;
use std::process::Command;

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
    let mut child = crate::support::spawn_until(dir.path(), &["run", "hup.yaml"], "started");
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

/// Two loopback origins: `from` redirects every request to the same path on `to`.
async fn redirecting_pair(status: u16) -> (wiremock::MockServer, wiremock::MockServer) {
    use wiremock::{Mock, MockServer, Request, ResponseTemplate};
    let (from, to) = (MockServer::start().await, MockServer::start().await);
    let target = to.uri();
    Mock::given(wiremock::matchers::any())
        .respond_with(move |request: &Request| {
            ResponseTemplate::new(status)
                .insert_header("location", format!("{target}{}", request.url.path()))
        })
        .mount(&from)
        .await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(500))
        .mount(&to)
        .await;
    (from, to)
}

/// A provider never follows a redirect to another origin: its API key (in `Authorization`, `x-api-key` or
/// `x-goog-api-key`) and the prompt would go with it. The error names the target, and nothing reaches it.
#[tokio::test]
async fn providers_refuse_redirects_to_another_origin() {
    use archon_engine::llm::anthropic::Anthropic;
    use archon_engine::llm::gemini::Gemini;
    use archon_engine::llm::openai::OpenAi;
    use archon_engine::llm::{ApiKey, ChatRequest, Message, Provider};

    for status in [302, 307, 308] {
        let (from, to) = redirecting_pair(status).await;
        let key = || Some(ApiKey::new("sk-never-leaves"));
        let settings = crate::support::llm_settings;
        let providers: Vec<Box<dyn Provider>> = vec![
            Box::new(
                OpenAi::new("o", format!("{}/v1", from.uri()), key(), settings()).expect("openai"),
            ),
            Box::new(Anthropic::new("a", from.uri(), key(), settings()).expect("anthropic")),
            Box::new(Gemini::new("g", from.uri(), key(), settings()).expect("gemini")),
        ];
        let request = ChatRequest {
            model: "m".into(),
            messages: vec![Message::user("hello")],
            ..ChatRequest::default()
        };
        for provider in providers {
            let error = provider
                .complete(&request)
                .await
                .expect_err("the redirect is refused");
            let target = to.uri();
            assert_eq!(
                error.message,
                format!(
                    "provider `{}`: the redirect was refused: the provider redirected to another origin, `{target}`, where the key is not sent",
                    provider.name()
                ),
                "{status}"
            );
        }
        assert_eq!(
            to.received_requests().await.expect("recorded").len(),
            0,
            "nothing reached the other origin ({status})"
        );
    }
}

/// The `http` tool follows redirects, but headers that carry a secret, and credentials of any kind, stay
/// behind once the chain leaves the spec's origin, also on later hops to the same new host; a body is
/// never resent to another origin.
#[tokio::test]
async fn http_redirects_leave_credentials_and_bodies_behind() {
    use wiremock::matchers::path;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let (origin, other) = (MockServer::start().await, MockServer::start().await);
    Mock::given(path("/start"))
        .respond_with(
            ResponseTemplate::new(302).insert_header("location", format!("{}/hop", other.uri())),
        )
        .mount(&origin)
        .await;
    Mock::given(path("/post"))
        .respond_with(
            ResponseTemplate::new(307).insert_header("location", format!("{}/hop", other.uri())),
        )
        .mount(&origin)
        .await;
    // A second hop on the new host, then the end.
    Mock::given(path("/hop"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", "/end"))
        .mount(&other)
        .await;
    Mock::given(path("/end"))
        .respond_with(ResponseTemplate::new(200).set_body_string("done"))
        .mount(&other)
        .await;

    let dir = TempDir::new().expect("tempdir");
    let spec = format!(
        r#"name: redirects
network: {{ allow: ["127.0.0.1"] }}
secrets: [TOKEN]
steps:
  - id: get
    tool: http
    with:
      url: "{origin}/start"
      headers: {{ x-api-key: "{{{{ secrets.TOKEN }}}}", authorization: "Bearer plain", x-trace: "kept" }}
  - id: post
    tool: http
    on_error: continue
    with:
      url: "{origin}/post"
      method: POST
      body: "payload"
"#,
        origin = origin.uri()
    );
    std::fs::write(dir.path().join("redirects.yaml"), spec).expect("write");
    let Output { code, stderr, .. } = crate::support::archon_with(
        dir.path(),
        &["run", "redirects.yaml"],
        &[("TOKEN", "tok-s3cr3t-value")],
    );
    assert_eq!(code, 0, "{stderr}");
    let seen = other.received_requests().await.expect("recorded");
    let hops: Vec<(String, Vec<String>)> = seen
        .iter()
        .map(|r| {
            let mut names: Vec<String> = r
                .headers
                .keys()
                .map(|k| k.as_str().to_owned())
                .filter(|k| k.starts_with('x') || k == "authorization")
                .collect();
            names.sort();
            (r.url.path().to_owned(), names)
        })
        .collect();
    assert_eq!(
        hops,
        [
            ("/hop".to_owned(), vec!["x-trace".to_owned()]),
            ("/end".to_owned(), vec!["x-trace".to_owned()]),
        ],
        "only the header without a credential reaches the other origin, on every hop"
    );
    let id = run_id(dir.path());
    let Output { stdout, .. } = archon(dir.path(), &["show", &id, "--json"]);
    let run: Json = serde_json::from_str(&stdout).expect("run");
    assert_eq!(
        run["results"]["post"]["error"],
        format!(
            "POST {}/post failed: redirect refused: `{}` is another origin, and the request body is not sent there",
            origin.uri(),
            other.uri()
        )
    );
}

/// The ranges the adversarial pass reached (benchmarking, documentation, the deprecated 6to4 relay, and an
/// IPv4-translated loopback) are refused, naming the registry block, from the IANA special-purpose
/// registries rather than a hand list.
#[test]
fn special_purpose_addresses_are_refused_by_name() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: ssrf
steps:
  - { id: bench, tool: http, with: { url: "http://198.18.0.1/" }, on_error: continue }
  - { id: doc2, tool: http, with: { url: "http://198.51.100.7/" }, on_error: continue }
  - { id: doc3, tool: http, with: { url: "http://203.0.113.9/" }, on_error: continue }
  - { id: relay, tool: http, with: { url: "http://192.88.99.1/" }, on_error: continue }
  - { id: translated, tool: http, with: { url: "http://[::ffff:0:127.0.0.1]/" }, on_error: continue }
"#;
    std::fs::write(dir.path().join("ssrf.yaml"), spec).expect("write");
    let Output { code, stderr, .. } = archon(dir.path(), &["run", "ssrf.yaml"]);
    assert_eq!(code, 0, "{stderr}");
    let id = run_id(dir.path());
    let Output { stdout, .. } = archon(dir.path(), &["show", &id, "--json"]);
    let run: Json = serde_json::from_str(&stdout).expect("run");
    let errors: Vec<String> = ["bench", "doc2", "doc3", "relay", "translated"]
        .iter()
        .map(|s| run["results"][s]["error"].as_str().unwrap_or("").to_owned())
        .collect();
    let refusal = |ip: &str, block: &str| {
        format!(
            "`{ip}` is an internal address ({block}), which `http` refuses unless `network.allow` lists it"
        )
    };
    assert_eq!(
        errors,
        [
            refusal("198.18.0.1", "benchmarking"),
            refusal("198.51.100.7", "documentation (TEST-NET-2)"),
            refusal("203.0.113.9", "documentation (TEST-NET-3)"),
            refusal("192.88.99.1", "deprecated (6to4 relay anycast)"),
            refusal("::ffff:0:7f00:1", "loopback"),
        ]
    );
}

/// A secret that the 1 MiB output cut would split is left out whole (the cut moves to its start), so its
/// head does not stay visible in the kept output.
#[test]
fn a_secret_split_by_the_output_cut_is_masked_before_it() {
    let dir = TempDir::new().expect("tempdir");
    let secret = "tok-0123456789abcdefghijklmnopqrstuvwxyz";
    // 1 MiB less 10 bytes of `a`, then the secret: the cut falls 10 bytes into it.
    let spec = r#"name: cut
secrets: [TOKEN]
steps:
  - id: flood
    tool: exec
    with:
      argv: [sh, -c, 'head -c 1048566 /dev/zero | tr "\0" a; printf "%s" "$TOKEN"; echo; echo done']
      env: { TOKEN: "{{ secrets.TOKEN }}" }
"#;
    std::fs::write(dir.path().join("cut.yaml"), spec).expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = crate::support::archon_with(
        dir.path(),
        &["run", "cut.yaml", "--json"],
        &[("TOKEN", secret)],
    );
    assert_eq!(code, 0, "{stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    let text = report["steps"]["flood"]["output"].as_str().expect("text");
    assert!(!text.contains(&secret[..6]), "the secret's head is visible");
    let tail = &text[text.len() - 60..];
    assert_eq!(
        tail.trim_start_matches('a'),
        "\n[archon: output truncated, 46 more bytes]",
        "the cut moves to the start of the secret, which is left out whole"
    );
}

/// The file tools a call gets inside a run: the workspace, nothing protected.
fn file_tool_context(workdir: &Path) -> archon_engine::tools::ToolContext {
    archon_engine::tools::ToolContext {
        workdir: workdir.to_path_buf(),
        protected: Vec::new(),
        env: Vec::new(),
        withheld: Vec::new(),
        network: Default::default(),
        redactor: Default::default(),
        helper: None,
    }
}

fn call_file_tool(
    name: &str,
    args: Json,
    cx: &archon_engine::tools::ToolContext,
) -> Result<Json, String> {
    let tool = archon_engine::tools::builtin::get(name).expect("a built-in");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime
        .block_on(tool.call(args, cx, None))
        .map(|o| o.output)
        .map_err(|e| e.message)
}

/// Issue 13, item 3: while another thread swaps a folder of the workspace for a symbolic link to a folder
/// outside it and back, no `write_file` lands outside and no `read_file` reads outside: paths are resolved
/// beneath the workspace by the kernel when they are opened, not checked and then opened. (Checked then
/// opened, 1 to 4 of 3,000 writes escaped.)
#[test]
fn file_tools_stay_inside_while_a_folder_is_swapped_for_a_link() {
    let dir = TempDir::new().expect("tempdir");
    let outside = TempDir::new().expect("tempdir");
    std::fs::write(outside.path().join("secret.txt"), "outside").expect("write");
    let sub = dir.path().join("sub");
    let link = dir.path().join("link");
    std::fs::create_dir(&sub).expect("mkdir");
    std::fs::write(sub.join("secret.txt"), "inside").expect("write");
    std::os::unix::fs::symlink(outside.path(), &link).expect("symlink");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, sub, link) = (stop.clone(), sub.clone(), link.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // `sub` is a folder, then (atomically) the link to the outside, then a folder again.
                nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &sub,
                    nix::fcntl::AT_FDCWD,
                    &link,
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                )
                .expect("exchange");
                swaps += 1;
            }
            swaps
        })
    };
    let cx = file_tool_context(dir.path());
    let mut read_outside = 0;
    for i in 0..3000 {
        let args = serde_json::json!({ "path": format!("sub/w{i}.txt"), "content": "x" });
        let _ = call_file_tool("write_file", args, &cx);
        let read = call_file_tool(
            "read_file",
            serde_json::json!({ "path": "sub/secret.txt" }),
            &cx,
        );
        if read.as_ref().is_ok_and(|text| text == "outside") {
            read_outside += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        swapper.join().expect("the swapper") > 100,
        "the folder was hardly swapped"
    );
    let written_outside = std::fs::read_dir(outside.path())
        .expect("list")
        .filter_map(Result::ok)
        .filter(|e| e.file_name() != "secret.txt")
        .count();
    assert_eq!(
        (written_outside, read_outside),
        (0, 0),
        "(files written outside, reads of the outside file) of 3,000 each"
    );
}

/// Issue 13, item 3: a path that goes down and back up stays inside and is not refused.
#[test]
fn a_path_through_a_folder_and_back_stays_inside() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    let cx = file_tool_context(dir.path());
    let written = call_file_tool(
        "write_file",
        serde_json::json!({ "path": "sub/../inside.txt", "content": "here" }),
        &cx,
    );
    let read = call_file_tool(
        "read_file",
        serde_json::json!({ "path": "sub/../inside.txt" }),
        &cx,
    );
    let escape = call_file_tool(
        "read_file",
        serde_json::json!({ "path": "sub/../../x" }),
        &cx,
    );
    assert_eq!(
        (written.map(|o| o["bytes"].clone()), read, escape),
        (
            Ok(serde_json::json!(4)),
            Ok(serde_json::json!("here")),
            Err("path `sub/../../x` is outside the workspace".to_owned())
        )
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("inside.txt")).expect("written inside"),
        "here"
    );
    // Listed paths stay relative to the workspace, whatever way the folder is written.
    let listed = ["", ".", "sub/.."].map(|path| {
        call_file_tool("list_files", serde_json::json!({ "path": path }), &cx)
            .map(|o| o.as_array().map(Vec::len).unwrap_or(0))
    });
    let named = call_file_tool("list_files", serde_json::json!({ "path": "sub/.." }), &cx);
    assert_eq!(listed, [Ok(1), Ok(1), Ok(1)]);
    assert_eq!(named, Ok(serde_json::json!(["inside.txt"])));
}

/// Issue 13, item 4: file tools refuse archon's state directory, the default one and one given with
/// `--state-dir`, under its name and through a link, so a step cannot overwrite the run store.
#[test]
fn file_tools_refuse_the_state_directory() {
    let dir = TempDir::new().expect("tempdir");
    std::os::unix::fs::symlink("store", dir.path().join("alias")).expect("symlink");
    std::fs::write(
        dir.path().join("wf.yaml"),
        r#"name: store
steps:
  - { id: wal, tool: write_file, with: { path: .archon/state.db-wal, content: "" }, on_error: continue }
  - { id: custom, tool: write_file, with: { path: store/state.db, content: "" }, on_error: continue }
  - { id: dotted, tool: read_file, with: { path: ./store/../store/state.db }, on_error: continue }
  - { id: linked, tool: read_file, with: { path: alias/state.db }, on_error: continue }
  - { id: listed, tool: list_files, with: { path: store }, on_error: continue }
"#,
    )
    .expect("spec");
    let errors = |state_dir: &str| {
        let output = archon(dir.path(), &["run", "wf.yaml", "--state-dir", state_dir]);
        assert_eq!(output.code, 0, "{}", output.stderr);
        let Output { stdout, .. } = archon(
            dir.path(),
            &[
                "show",
                &run_id_in(dir.path(), state_dir),
                "--json",
                "--state-dir",
                state_dir,
            ],
        );
        let report: Json = serde_json::from_str(&stdout).expect("JSON");
        ["wal", "custom", "dotted", "linked", "listed"]
            .iter()
            .map(|step| report["results"][step]["error"].as_str().map(str::to_owned))
            .collect::<Vec<_>>()
    };
    let refused = |path: &str, dir: &str| {
        Some(format!(
            "`{path}` is in archon's state directory `{dir}`, which file tools do not touch"
        ))
    };
    assert_eq!(
        errors("store"),
        [
            None,
            refused("store/state.db", "store"),
            refused("./store/../store/state.db", "store"),
            refused("alias/state.db", "store"),
            refused("store", "store"),
        ]
    );
    assert_eq!(
        errors(".archon")[0],
        refused(".archon/state.db-wal", ".archon")
    );
}

fn run_id_in(dir: &Path, state_dir: &str) -> String {
    let Output { stdout, .. } = archon(dir, &["runs", "--json", "--state-dir", state_dir]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs as JSON");
    runs[0]["id"].as_str().expect("an id").to_owned()
}

/// Runs archon and gives its output, or fails the test when it has not finished within 20 s (a read that
/// blocks on a FIFO would never end).
fn archon_within(dir: &Path, args: &[&str]) -> (i32, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("archon starts");
    let (sender, receiver) = std::sync::mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let output = child.wait_with_output().expect("archon ends");
        let _ = sender.send(output);
    });
    match receiver.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(output) => (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr),
        ),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("archon {args:?} did not finish within 20 s");
        }
    }
}

/// Issue 13, item 12: a FIFO, a device or a link to one given to `validate` or `--inputs` is refused at
/// once instead of being read until memory runs out or forever.
#[test]
fn files_that_never_end_are_refused_before_they_are_read() {
    let dir = TempDir::new().expect("tempdir");
    nix::unistd::mkfifo(&dir.path().join("spec.yaml"), nix::sys::stat::Mode::S_IRWXU)
        .expect("mkfifo");
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.yaml")).expect("symlink");
    nix::unistd::mkfifo(
        &dir.path().join("inputs.json"),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .expect("mkfifo");
    std::fs::write(
        dir.path().join("wf.yaml"),
        "name: t\ninputs:\n  who: { type: string }\nsteps:\n  - { id: a, tool: echo, with: { v: \"{{ inputs.who }}\" } }\n",
    )
    .expect("spec");
    let fifo = archon_within(dir.path(), &["validate", "spec.yaml"]);
    let zero = archon_within(dir.path(), &["validate", "zero.yaml"]);
    let inputs = archon_within(dir.path(), &["run", "wf.yaml", "--inputs", "inputs.json"]);
    let unreadable = |file: &str, what: &str| {
        format!(
            "error[archon::unreadable_file]: cannot read `{file}`: it is {what}, not a regular file\n --> {file}:1:1\n  |\n1 |\n  | ^\n\n1 of 1 file invalid: 1 error\n"
        )
    };
    assert_eq!(
        [fifo, zero, inputs],
        [
            (2, unreadable("spec.yaml", "a FIFO")),
            (2, unreadable("zero.yaml", "a device")),
            (
                2,
                "error: cannot read inputs file `inputs.json`: it is a FIFO, not a regular file\n"
                    .to_owned()
            ),
        ]
    );
}

/// `archon run wf.yaml` of `spec` in `dir`, with files limited to `blocks` of 1 KiB (`ulimit -f`).
fn run_under_file_size_limit(dir: &Path, spec: &str, blocks: u32) -> std::process::Output {
    std::fs::write(dir.join("wf.yaml"), spec).expect("spec");
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -f {blocks}; exec {} run wf.yaml",
            env!("CARGO_BIN_EXE_archon")
        ))
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("bash runs")
}

/// Issue 13, item 17: with a file size limit (`ulimit -f`), a store write past it used to kill archon with
/// SIGXFSZ and no word (exit 153); now the write fails and archon says why, on stderr, and exits 1.
#[test]
fn a_file_size_limit_is_reported_not_fatal() {
    let dir = TempDir::new().expect("tempdir");
    let output = run_under_file_size_limit(
        dir.path(),
        "name: t\nsteps:\n  - { id: a, tool: echo, with: { v: 1 } }\n",
        20,
    );
    assert_eq!(
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned()
        ),
        (
            Some(1),
            String::new(),
            "error: cannot write state database `.archon/state.db`: disk i/o error\n  hint: files are limited to 20480 bytes here (`ulimit -f`): the store may have reached that size\n".to_owned()
        )
    );
}

/// Issue 13, item 2: templates that build without end, from the spec and from a step's output, fail their
/// step with a message instead of exhausting memory or overflowing the stack (a string doubled in a loop
/// reached 23 GB; `replace` and `indent` over an output built gigabytes; a list nested 100,000 deep
/// aborted the process, and `resume` aborted the same way). archon runs under a 1 GiB data limit, so a
/// template that escaped its 256 MiB budget would end it with an allocation failure.
#[test]
fn templates_that_build_without_end_fail_their_step_within_the_budget() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: bombs
steps:
  - id: double
    tool: echo
    with: { text: "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}" }
  - id: deep_json
    tool: echo
    with: { text: "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l | tojson }}" }
  - id: big
    tool: echo
    with: { text: "{{ 'x' * 1000000 }}" }
  - id: replaced
    tool: echo
    with: { text: "{{ steps.big.output.text | replace('x', steps.big.output.text) | length }}" }
  - id: indented
    tool: echo
    with: { text: "{{ steps.big.output.text | replace('x', 'x\n') | indent(100000) | length }}" }
  - id: small
    tool: echo
    with: { text: "{% for i in range(3) %}{{ i ~ steps.big.output.text | length }}{% endfor %}" }
"#;
    std::fs::write(dir.path().join("bombs.yaml"), spec).expect("spec");
    let output = Command::new("sh")
        .args([
            "-c",
            "ulimit -d 1048576 && exec \"$0\" run bombs.yaml --json",
        ])
        .arg(env!("CARGO_BIN_EXE_archon"))
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        // Without it, mimalloc's reserved arena counts against the limit.
        .env("MIMALLOC_ARENA_RESERVE", "0")
        .output()
        .expect("archon runs");
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Json = serde_json::from_slice(&output.stdout).expect("report");
    let step = |id: &str| {
        let step = &report["steps"][id];
        (
            step["status"].as_str().unwrap_or_default().to_owned(),
            step["error"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let failed = |error: &str| ("failed".to_owned(), error.to_owned());
    assert_eq!(
        [
            step("double"),
            step("deep_json"),
            step("replaced"),
            step("indented"),
        ],
        [
            failed(
                "cannot render template `{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.`: it needed more than 256 MiB of memory"
            ),
            failed(
                "cannot render template `{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %`: cannot write the value as JSON: it is nested more than 256 levels deep"
            ),
            failed(
                "cannot render expression `steps.big.output.text | replace('x', steps.big.output.text) | length`: it needed more than 256 MiB of memory"
            ),
            failed(
                "cannot render expression `steps.big.output.text | replace('x', 'x\n') | indent(100000) | length`: it needed more than 256 MiB of memory"
            ),
        ]
    );
    assert_eq!(
        report["steps"]["small"]["output"]["text"],
        "010000001100000021000000"
    );
}

/// Issue 13, item 17: a store in a folder archon cannot write, without the `-shm` file SQLite keeps beside
/// its write-ahead log (copied from a backup, on a read-only mount), could not be listed ("unable to open
/// database file"). It is now read from a private copy: `runs`, `show` and `runs --check` work, and a
/// change is refused with a message. The read-only mount is made in a mount namespace of its own
/// (`unshare -m`, as root); where that is not allowed the test is skipped, except in CI.
#[test]
#[allow(clippy::print_stderr)]
fn a_read_only_store_without_its_shm_file_can_be_listed() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("t.yaml"),
        "name: t\nsteps:\n  - { id: a, tool: echo, with: { x: 1 } }\n",
    )
    .expect("spec");
    assert_eq!(archon(dir.path(), &["run", "t.yaml"]).code, 0);
    let id = run_id(dir.path());
    let state = dir.path().join(".archon");
    let _ = std::fs::remove_file(state.join("state.db-shm"));
    assert!(
        state.join("state.db-wal").exists(),
        "the run's records are still in the log"
    );
    let script = format!(
        "mount --bind \"$0\" \"$0\" && mount -o remount,ro,bind \"$0\" || exit 99
         touch \"$0/probe\" 2>/dev/null && exit 98
         \"$1\" runs; echo \"exit $?\"
         \"$1\" show {id} | head -3; \"$1\" runs --check; echo \"exit $?\"
         \"$1\" run t.yaml; echo \"exit $?\""
    );
    let output = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .arg(&state)
        .arg(env!("CARGO_BIN_EXE_archon"))
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .output();
    let output = match output {
        Ok(output) if output.status.code() != Some(99) => output,
        other => {
            let why = format!("cannot make a read-only mount here: {other:?}");
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            eprintln!("skipped: {why}");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The time and the duration vary, and the columns' width with the run id's length: both are read
    // where the header puts them.
    let (header, row) = (
        stdout.lines().next().unwrap_or_default(),
        stdout.lines().nth(1).unwrap_or_default(),
    );
    let column = |name: &str| header.find(name).unwrap_or(header.len());
    let started = row
        .get(column("STARTED")..column("DURATION"))
        .unwrap_or_default()
        .trim_end();
    let duration = row.get(column("DURATION")..).unwrap_or_default();
    assert_eq!(
        (stdout.replace(started, "TIME"), stderr.as_ref()),
        (
            format!(
                "{:<width$}WORKFLOW  STATUS     STARTED               DURATION\n{id}  t         succeeded  TIME  {duration}\nexit 0\nrun       {id}\nworkflow  t ({})\nstatus    succeeded\n`.archon/state.db`: no damage found\nexit 0\nexit 1\n",
                "RUN",
                dir.path().join("t.yaml").display(),
                width = id.len() + 2,
            ),
            "error: the run store `.archon` is read-only: its runs can be listed and shown, not changed\n  hint: run the command where the state directory can be written, or point `--state-dir` at a copy\n"
        )
    );
}

/// Issue 13, item 17: the run's store failing mid-run (here a file size limit reached by the log; a full
/// disk is the same failure) ends the run failed, exit 1, with the error and what to do on standard error.
/// It exited 130, Ctrl-C's code, as if a person had interrupted it, with the error on standard output and
/// a hint to resume at once. Lifted the limit, `resume` continues the run as it was last saved.
#[test]
fn a_store_that_fails_mid_run_fails_the_run_and_says_so() {
    let dir = TempDir::new().expect("tempdir");
    let output = run_under_file_size_limit(
        dir.path(),
        // The step's output is written when it has ended, and goes past the limit.
        "name: t\nsteps:\n  - id: many\n    tool: echo\n    with: { v: \"{{ 'x' * 3000000 }}\" }\n",
        2000,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let id = stdout
        .split_whitespace()
        .nth(1)
        .expect("a run id")
        .to_owned();
    // The run's id, and durations (`12 ms`), vary.
    let shown = |text: &[u8]| {
        let text = String::from_utf8_lossy(text).replace(&id, "RUN");
        let mut out = String::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(" ms") {
            let digits = rest[..at].len()
                - rest[..at]
                    .trim_end_matches(|c: char| c.is_ascii_digit())
                    .len();
            out.push_str(&rest[..at - digits]);
            out.push_str(if digits > 0 { "N ms" } else { " ms" });
            rest = &rest[at + 3..];
        }
        out.push_str(rest);
        out
    };
    assert_eq!(
        (output.status.code(), shown(&output.stdout), shown(&output.stderr)),
        (
            Some(1),
            "run RUN of `t` failed in N ms: 1 succeeded\n".to_owned(),
            "started   many\nsucceeded many (N ms)\nerror: the run's state could not be saved: cannot write state database `.archon/state.db`: disk i/o error\n  hint: files are limited to 2048000 bytes here (`ulimit -f`): the store may have reached that size\n  hint: the store keeps the run as it was last saved; once the state directory can be written again, `archon resume RUN` continues it\n".to_owned()
        )
    );
    let resumed = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["resume", &id])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .expect("archon runs");
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
}
