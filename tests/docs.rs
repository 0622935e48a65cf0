//! Every command the README, docs/cli.md, docs/serve.md and docs/scale-out.md show in a shell block runs as
//! shown: for each document, in a scratch copy of the repository's example files, with `archon` on `PATH`
//! (and `cargo run --` read as `archon`), one block after another as a reader would type them (with the
//! scratch directory as `HOME`), each command exiting with status 0 unless its line says otherwise with a
//! trailing `# exit N`, and, in a ```console block, printing the lines shown below it (`...` standing for
//! any text; each shown line needs a printed line of its own). Besides `archon` (and the library's
//! example), a block may only make a directory (`mkdir -p`) and set shell variables (`NAME=value`, `export
//! NAME=value`: replayed before each later command of the document, as the reader's shell keeps them).
//! A command ending in `&` is a background job, numbered as a reader's shell numbers them: `archon serve
//! ... &` starts the server on a free port (`--port 0`, tests/support/serve.rs), and `archon worker ... &`
//! a worker, each awaited until it has printed the lines shown below it on its standard error (a worker
//! also its `worker: taking steps` line, once it is ready). The commands after a server are `curl`
//! against it too, typed with its address in place of the one shown (`http://127.0.0.1:8700`). `kill %1`
//! (`kill %1 %2 %3`) stops those jobs with SIGTERM, expects each to exit 0 (or the `# exit N` shown), and
//! their standard errors together to hold the lines shown below it.
//! docs/scale-out.md runs on a PostgreSQL schema of the test's own (tests/postgres.rs): every PostgreSQL
//! URL shown (`postgres://...`) is typed as the test's URL, and every one shown in what a command prints
//! is read as that URL masked; without a PostgreSQL server the guide is skipped, saying so, except with
//! `CI=true`. Without `curl` or `openssl` the commands from the first that needs one are skipped, saying
//! so, except with `CI=true`.
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::root;
use crate::support::serve::{PATIENCE, Server, stop_child};

/// The documents whose shell blocks are run, in the order a reader meets them.
const DOCUMENTS: &[&str] = &[
    "README.md",
    "docs/cli.md",
    "docs/serve.md",
    "docs/scale-out.md",
];

/// Commands shown that this test cannot run, each with the reason. Anything else that is shown runs.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "cargo test --workspace --locked",
        "it is the command that runs this test",
    ),
    (
        "archon serve workflows",
        "it serves until stopped; tests/serve_browser.rs starts `archon serve` and drives its pages",
    ),
    (
        "cargo install --locked --path .",
        "it builds a release binary into ~/.cargo/bin; `archon` on PATH stands for it here",
    ),
    (
        "archon worker --labels gpu,eu",
        "a worker in the foreground runs until stopped; tests/routing.rs runs workers with labels",
    ),
    (
        "archon worker",
        "a worker in the foreground runs until stopped; the walk-through of docs/scale-out.md runs three",
    ),
    (
        "archon run --submit --wait workflows/pay.yaml",
        "`workflows/pay.yaml` is not a bundled example; tests/worker_approvals.rs runs approvals on workers",
    ),
    (
        "archon show r6b0...",
        "`r6b0...` stands for the id of the run above; tests/worker_approvals.rs shows such a run",
    ),
    (
        "archon approve r6b0... --step pay",
        "`r6b0...` stands for the id of the run above; tests/worker_approvals.rs approves such a step",
    ),
];

/// A command shown in a shell block.
#[derive(Debug)]
struct Shown {
    document: &'static str,
    line: usize,
    command: String,
    exit: i32,
    /// In a ```console block, the lines shown below the command: each is a line it prints, where `...`
    /// stands for any text.
    prints: Vec<String>,
}

/// The commands of the ```sh and ```console blocks of `text`. In a ```sh block every line is a command:
/// comment lines and blank lines are left out, and a line ending in `\` goes on with the next. In a
/// ```console block a command starts with `$ `, and the lines below it are what it prints. A trailing
/// `# exit N` (or `# exit N: why`) gives the status the command ends with.
fn shown(document: &'static str, text: &str) -> Vec<Shown> {
    let mut commands: Vec<Shown> = Vec::new();
    let mut block: Option<&str> = None;
    let mut pending: Option<(usize, String)> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        let Some(kind) = block else {
            block = match trimmed {
                "```sh" => Some("sh"),
                "```console" => Some("console"),
                _ => None,
            };
            continue;
        };
        if trimmed == "```" {
            assert!(
                pending.is_none(),
                "{document}:{}: a command ends with `\\` at the end of its block",
                index + 1
            );
            block = None;
            continue;
        }
        let typed = if kind == "console" && pending.is_none() {
            match line.strip_prefix("$ ") {
                Some(command) => command.trim(),
                None => {
                    let last = commands
                        .last_mut()
                        .filter(|c| c.document == document)
                        .unwrap_or_else(|| {
                            panic!("{document}:{}: output before any `$ ` command", index + 1)
                        });
                    last.prints.push(line.to_owned());
                    continue;
                }
            }
        } else {
            trimmed
        };
        if pending.is_none() && (typed.is_empty() || typed.starts_with('#')) {
            continue;
        }
        let (start, mut command) = pending.take().unwrap_or((index + 1, String::new()));
        if let Some(head) = typed.strip_suffix('\\') {
            command.push_str(head);
            pending = Some((start, command));
            continue;
        }
        command.push_str(typed);
        let (command, comment) = split_comment(&command);
        let exit = match comment.and_then(|c| c.strip_prefix("exit ")) {
            // `# exit 3: why` says why after the status.
            Some(code) => code
                .split_once(':')
                .map_or(code, |(code, _)| code)
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{document}:{start}: `# exit {code}` is not a status")),
            None => 0,
        };
        commands.push(Shown {
            document,
            line: start,
            command,
            exit,
            prints: Vec::new(),
        });
    }
    assert!(block.is_none(), "{document}: a shell block is not closed");
    commands
}

/// Whether `line` is what `shown` shows, where `...` stands for any text and a run of two or more spaces
/// for any such run: a table's columns are as wide as the values in them (a run id is shorter when the
/// process that made it had a small id), and a page shows one width.
fn matches(shown: &str, line: &str) -> bool {
    let (shown, line) = (squeezed(shown), squeezed(line));
    let (shown, line) = (shown.as_str(), line.as_str());
    let parts: Vec<&str> = shown.split("...").collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return line == shown;
    }
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// `text` with each run of two or more spaces made two spaces.
fn squeezed(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut spaces = 0;
    for c in text.chars() {
        if c == ' ' {
            spaces += 1;
            continue;
        }
        out.push_str(&" ".repeat(spaces.min(2)));
        spaces = 0;
        out.push(c);
    }
    out.push_str(&" ".repeat(spaces.min(2)));
    out
}

/// The first of the `shown` lines that `printed` does not print, each printed line standing for one shown
/// line at most (the shown lines with the fewest `...` are matched first).
fn unprinted<'a>(shown: &'a [String], printed: &str) -> Option<&'a str> {
    let lines: Vec<&str> = printed
        .lines()
        .map(|line| line.trim_end_matches('\r'))
        .collect();
    let mut used = vec![false; lines.len()];
    let mut order: Vec<&String> = shown.iter().collect();
    order.sort_by_key(|line| line.matches("...").count());
    for expected in order {
        let found = (0..lines.len()).find(|&i| !used[i] && matches(expected, lines[i]));
        match found {
            Some(i) => used[i] = true,
            None => return Some(expected),
        }
    }
    None
}

/// A command line and its trailing comment (`# ...` after white space, outside quotes), if any.
fn split_comment(line: &str) -> (String, Option<&str>) {
    let mut quote = None;
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(open), _) if c == open => quote = None,
            (None, '#') if previous.is_whitespace() => {
                return (
                    line[..at].trim_end().to_owned(),
                    Some(line[at + 1..].trim()),
                );
            }
            _ => {}
        }
        previous = c;
    }
    (line.to_owned(), None)
}

fn every_shown_command() -> Vec<Shown> {
    DOCUMENTS
        .iter()
        .flat_map(|document| {
            let text = std::fs::read_to_string(root().join(document))
                .unwrap_or_else(|e| panic!("cannot read {document}: {e}"));
            shown(document, &text)
        })
        .collect()
}

/// A scratch directory laid out like the repository where the docs' commands are typed: the example
/// workflows and the schema, and a `bin/archon` that is the binary under test.
fn scratch() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for folder in ["workflows", "schemas"] {
        copy_tree(&root().join(folder), &dir.path().join(folder));
    }
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_archon"), bin.join("archon")).expect("link");
    (dir, bin)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// The example program `name`, which `cargo test` builds beside the test binary; outside CI a narrower
/// build (`cargo test --test main`) may not have built it, and its command is skipped, saying so.
#[allow(clippy::print_stderr)]
fn example(name: &str) -> Option<PathBuf> {
    let deps = std::env::current_exe().expect("the test binary");
    let binary = deps
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("examples").join(name))
        .expect("the build directory");
    if binary.is_file() {
        return Some(binary);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the example `{name}` was not built at `{}`: run the whole `cargo test --workspace`",
        binary.display()
    );
    eprintln!("skipped: the example `{name}` is not built (`cargo test --workspace` builds it)");
    None
}

/// The address the docs show a server at; a server the docs start listens on a free port instead, and
/// the commands after it are typed with its address in place of this one.
const SHOWN_ADDRESS: &str = "http://127.0.0.1:8700";

/// A reader's shell while they follow one document: the variables they set, the jobs they started in
/// the background, and the store the test gives them.
#[derive(Default)]
struct Reader {
    /// The assignments typed so far (`NAME=value`, `export NAME=value`), replayed before each command.
    assignments: Vec<String>,
    /// The background jobs still running, with the numbers the reader's shell gave them.
    jobs: Vec<(usize, Job)>,
    /// The test's own PostgreSQL URL, typed in place of every one shown.
    store: Option<String>,
}

impl Reader {
    /// `typed` as it runs: after the assignments so far, with the server's address for the one shown
    /// and the test's store for every one shown.
    fn script(&self, typed: &str) -> String {
        let mut script = self.assignments.join("\n");
        script.push('\n');
        script.push_str(typed);
        self.typed(&script)
    }

    /// `text` as typed here: the server's address and the test's store in place of those shown.
    fn typed(&self, text: &str) -> String {
        let text = self.address(text);
        match &self.store {
            Some(url) => with_store(&text, url),
            None => text,
        }
    }

    /// The lines shown below a command as they read here: the server's address, and the test's store
    /// masked as archon prints it, in place of those shown.
    fn expected(&self, shown: &[String]) -> Vec<String> {
        shown
            .iter()
            .map(|line| {
                let line = self.address(line);
                match &self.store {
                    Some(url) => with_store(&line, &archon_engine::store::postgres::masked(url)),
                    None => line,
                }
            })
            .collect()
    }

    /// `text` with the address of the server started in the background in place of the shown one.
    fn address(&self, text: &str) -> String {
        match self.server() {
            Some(server) => text.replace(SHOWN_ADDRESS, &server.url),
            None => text.to_owned(),
        }
    }

    fn server(&self) -> Option<&Server> {
        self.jobs.iter().find_map(|(_, job)| match job {
            Job::Server(server) => Some(server),
            Job::Worker(_) => None,
        })
    }

    /// The number a shell gives the next background job: one more than the highest still running.
    fn next_job(&self) -> usize {
        self.jobs.iter().map(|(n, _)| n + 1).max().unwrap_or(1)
    }
}

/// `text` with `url` in place of every PostgreSQL URL in it (`postgres://` or `postgresql://`, up to
/// white space, a quote or a backquote).
fn with_store(text: &str, url: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    loop {
        let start = ["postgres://", "postgresql://"]
            .iter()
            .filter_map(|scheme| rest.find(scheme))
            .min();
        let Some(start) = start else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..start]);
        out.push_str(url);
        rest = &rest[start..];
        let end = rest
            .find(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`'))
            .unwrap_or(rest.len());
        rest = &rest[end..];
    }
}

/// A job a reader started in the background.
enum Job {
    Server(Server),
    Worker(Worker),
}

impl Job {
    /// Everything it wrote on standard error so far.
    fn said(&self) -> String {
        match self {
            Job::Server(server) => server.said(),
            Job::Worker(worker) => worker.said(),
        }
    }

    /// Stops it with SIGTERM; how it ended.
    fn stop(&mut self) -> ExitStatus {
        match self {
            Job::Server(server) => server.stop(),
            Job::Worker(worker) => worker.stop(),
        }
    }
}

/// An `archon worker` a reader started in the background, everything it writes on standard error kept.
struct Worker {
    child: Child,
    said: Arc<Mutex<String>>,
}

impl Worker {
    /// Starts `command`, a shell that `exec`s the worker.
    fn start(mut command: Command) -> Worker {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the worker starts");
        let stderr = child.stderr.take().expect("its standard error");
        let said = Arc::new(Mutex::new(String::new()));
        let keep = said.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Ok(mut said) = keep.lock() {
                    said.push_str(&line);
                    said.push('\n');
                }
            }
        });
        Worker { child, said }
    }

    fn said(&self) -> String {
        self.said.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops it with SIGTERM and waits ([`PATIENCE`] at most, then kills it) for it to end.
    fn stop(&mut self) -> ExitStatus {
        stop_child(&mut self.child, PATIENCE)
    }
}

impl Drop for Worker {
    /// A worker a failing test left running is not left behind.
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Waits ([`PATIENCE`] at most) until the job has printed every line of `expected` on its standard error.
fn await_lines(at: &str, command: &str, job: &mut Job, expected: &[String]) {
    let deadline = Instant::now() + PATIENCE;
    while let Some(missing) = unprinted(expected, &job.said()) {
        let ended = match job {
            Job::Worker(worker) => worker.child.try_wait().ok().flatten(),
            Job::Server(_) => None,
        };
        assert!(
            ended.is_none() && Instant::now() < deadline,
            "{at}: `{command}` did not print a line like\n  {missing}\n{}it printed:\n{}",
            ended.map_or_else(String::new, |status| format!("it ended ({status}); ")),
            job.said()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `command` only sets a shell variable (`NAME=value` or `export NAME=value`, no command after).
fn assignment(command: &str) -> bool {
    let rest = command.strip_prefix("export ").unwrap_or(command);
    let Some((name, value)) = rest.split_once('=') else {
        return false;
    };
    let simple_value = !value.starts_with(' ') && !value.contains(" archon ");
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && simple_value
}

/// Whether a program the docs' commands use is installed; outside CI, says so when it is not.
#[allow(clippy::print_stderr)]
fn installed(program: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .output()
        .or_else(|_| Command::new(program).arg("version").output())
        .is_ok();
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "`{program}` is not installed: the docs' commands need it"
        );
        eprintln!("skipped: `{program}` is not installed, and the docs' commands need it");
    }
    found
}

/// Runs every command `document` shows, in order, in a scratch directory of its own, with `store` (the
/// test's PostgreSQL URL) for every store URL shown; returns the commands of NOT_RUN it met and how many
/// it ran.
fn follow(
    document: &'static str,
    commands: &[Shown],
    store: Option<&str>,
) -> (Vec<&'static str>, usize) {
    let mut skipped = Vec::new();
    let mut ran = 0;
    let (dir, bin) = scratch();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut reader = Reader {
        store: store.map(str::to_owned),
        ..Reader::default()
    };
    for shown in commands.iter().filter(|s| s.document == document) {
        if let Some((command, _)) = NOT_RUN.iter().find(|(c, _)| *c == shown.command) {
            skipped.push(*command);
            continue;
        }
        let typed = if let Some(rest) = shown.command.strip_prefix("cargo run -- ") {
            format!("archon {rest}")
        } else if let Some(rest) = shown.command.strip_prefix("cargo run --example ") {
            let (name, args) = rest.split_once(" -- ").unwrap_or((rest, ""));
            match example(name) {
                Some(binary) => format!("{} {args}", binary.display()),
                None => continue,
            }
        } else {
            shown.command.clone()
        };
        let at = format!("{}:{}", shown.document, shown.line);
        let mut command = Command::new("sh");
        command
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("HOME", dir.path())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        for (key, _) in std::env::vars() {
            if key.ends_with("_API_KEY") || key.ends_with("_BASE_URL") || key.starts_with("ARCHON_")
            {
                command.env_remove(key);
            }
        }

        // `archon serve ... &`, `archon worker ... &`: a job in the background, the server on a free port.
        if let Some(background) = typed.strip_suffix('&').map(str::trim_end) {
            assert_eq!(shown.exit, 0, "{at}: a job in the background has no status");
            let job = if background.starts_with("archon serve ") {
                assert!(
                    reader.server().is_none(),
                    "{at}: a second server is started while one runs"
                );
                command
                    .arg("-c")
                    .arg(reader.script(&format!("exec {background} --port 0")));
                Job::Server(crate::support::serve::start(command))
            } else if background == "archon worker" || background.starts_with("archon worker ") {
                command
                    .arg("-c")
                    .arg(reader.script(&format!("exec {background}")));
                let mut worker = Job::Worker(Worker::start(command));
                // Its signal handlers are in place once it says so.
                let ready = ["worker: taking steps ...".to_owned()];
                await_lines(&at, &shown.command, &mut worker, &ready);
                worker
            } else {
                panic!(
                    "{at}: `{}` is neither `archon serve` nor `archon worker` in the background",
                    shown.command
                );
            };
            let number = reader.next_job();
            reader.jobs.push((number, job));
            let expected = reader.expected(&shown.prints);
            let (_, job) = reader.jobs.last_mut().expect("just started");
            await_lines(&at, &shown.command, job, &expected);
            ran += 1;
            continue;
        }
        // `kill %1`, `kill %1 %2 %3`: those background jobs stop (SIGTERM) and end as shown.
        if let Some(jobs) = typed.strip_prefix("kill ") {
            let mut said = String::new();
            for job in jobs.split_whitespace() {
                let number: usize = job
                    .strip_prefix('%')
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("{at}: `{job}` is not a job (`%N`)"));
                let index = reader
                    .jobs
                    .iter()
                    .position(|(n, _)| *n == number)
                    .unwrap_or_else(|| {
                        panic!("{at}: there is no job `%{number}` in the background")
                    });
                let (_, mut job) = reader.jobs.remove(index);
                let status = job.stop();
                assert_eq!(
                    status.code(),
                    Some(shown.exit),
                    "{at}: job `%{number}` ended with {status}\nit printed:\n{}",
                    job.said()
                );
                said.push_str(&job.said());
            }
            if let Some(missing) = unprinted(&reader.expected(&shown.prints), &said) {
                panic!(
                    "{at}: the jobs did not print a line like\n  {missing}\nthey printed:\n{said}"
                );
            }
            ran += 1;
            continue;
        }

        let is_assignment = assignment(&typed);
        let is_curl = typed.starts_with("curl ") && reader.server().is_some();
        assert!(
            typed.starts_with("archon ")
                || typed.contains("/examples/")
                || typed.starts_with("mkdir -p ")
                || is_assignment
                || is_curl,
            "{at}: `{}` is neither an `archon` command, `mkdir -p`, a variable set, `curl` against the \
             server started before it, `kill` of a background job, nor in NOT_RUN",
            shown.command
        );
        if (is_curl && !installed("curl")) || (typed.contains("openssl ") && !installed("openssl"))
        {
            return (skipped, ran);
        }
        let output = command
            .arg("-c")
            .arg(reader.script(&typed))
            .output()
            .expect("sh runs");
        assert_eq!(
            output.status.code(),
            Some(shown.exit),
            "{at}: `{}` exited with {:?}, not {}\nstdout:\n{}\nstderr:\n{}",
            shown.command,
            output.status.code(),
            shown.exit,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        if let Some(missing) = unprinted(&reader.expected(&shown.prints), &printed) {
            panic!(
                "{at}: `{}` did not print a line like\n  {missing}\nit printed:\n{printed}",
                shown.command
            );
        }
        if is_assignment {
            reader.assignments.push(typed);
        }
        ran += 1;
    }
    (skipped, ran)
}

#[test]
fn every_command_in_the_readme_and_the_cli_reference_runs_as_shown() {
    let commands = every_shown_command();
    let mut ran = 0;
    for document in ["README.md", "docs/cli.md"] {
        ran += follow(document, &commands, None).1;
    }
    assert!(
        ran >= 10,
        "only {ran} commands ran: the docs show more than that"
    );
}

/// docs/serve.md as a reader follows it: the refusal to listen beyond loopback without a token, then a
/// server started in the background on the example workflows, and the `curl` commands it shows against
/// that server (a webhook delivery signed with `openssl`, the same delivery again, a forged one, the
/// triggers and firings the API tells of), each answering as shown; then the server stopped.
#[test]
fn the_serve_guide_runs_against_the_server_it_starts() {
    let commands = every_shown_command();
    let (_, ran) = follow("docs/serve.md", &commands, None);
    let curls = commands
        .iter()
        .filter(|c| c.document == "docs/serve.md" && c.command.starts_with("curl "))
        .count();
    assert!(
        curls >= 4,
        "docs/serve.md shows only {curls} `curl` commands"
    );
    if installed("curl") && installed("openssl") {
        assert_eq!(
            ran,
            commands
                .iter()
                .filter(|c| c.document == "docs/serve.md")
                .count(),
            "every command of docs/serve.md runs"
        );
    }
}

/// docs/scale-out.md as a reader follows it, on a PostgreSQL schema of the test's own: the example run on
/// one machine, then again with `ARCHON_STORE` set, three workers started in the background, a run
/// submitted to them and followed to its end, its logs, the workers stopped; then a run submitted with no
/// worker left, shown waiting for one, and cancelled. Every command the guide shows runs but those in
/// NOT_RUN.
#[test]
fn the_scale_out_guide_runs_on_a_store_and_workers_of_its_own() {
    let commands = every_shown_command();
    let guide: Vec<&Shown> = commands
        .iter()
        .filter(|c| c.document == "docs/scale-out.md")
        .collect();
    let workers = guide
        .iter()
        .filter(|c| c.command.starts_with("archon worker ") && c.command.ends_with('&'))
        .count();
    assert_eq!(
        workers, 3,
        "docs/scale-out.md starts {workers} workers, not three"
    );
    assert!(
        guide.iter().any(|c| c.command == "kill %1 %2 %3"),
        "docs/scale-out.md does not stop its workers"
    );
    let Some(db) = crate::postgres::db() else {
        return;
    };
    let (skipped, ran) = follow("docs/scale-out.md", &commands, Some(&db.url()));
    assert_eq!(
        ran + skipped.len(),
        guide.len(),
        "every command of docs/scale-out.md runs but those in NOT_RUN"
    );
    assert!(ran >= 15, "only {ran} commands of docs/scale-out.md ran");
}

/// Every exception is still shown somewhere: a stale one would hide nothing, but says what is not run.
#[test]
fn every_command_not_run_is_shown() {
    let commands = every_shown_command();
    for (command, why) in NOT_RUN {
        assert!(
            commands.iter().any(|c| c.command == *command),
            "NOT_RUN lists `{command}` ({why}), which no document shows"
        );
    }
}

/// The shell blocks are read as a reader would: continuation lines joined, comments left out, exit
/// statuses taken from the line.
#[test]
fn shell_blocks_are_read_line_by_line() {
    let text = "text\n```sh\n# a comment\narchon validate \\\n  bad.yaml # exit 2\n\narchon runs  # what ran\narchon run x.yaml --input 'who=a # b'\narchon run y.yaml # exit 3: waits\n```\n```text\narchon not a command\n```\n";
    let commands: Vec<(usize, String, i32)> = shown("doc.md", text)
        .into_iter()
        .map(|s| (s.line, s.command, s.exit))
        .collect();
    let console =
        "```console\n$ archon runs  # exit 1\nRUN  WORKFLOW\nr... hello\n$ archon version\n```\n";
    let shown: Vec<(usize, String, i32, Vec<String>)> = shown("doc.md", console)
        .into_iter()
        .map(|s| (s.line, s.command, s.exit, s.prints))
        .collect();
    assert_eq!(
        shown,
        vec![
            (
                2,
                "archon runs".to_owned(),
                1,
                vec!["RUN  WORKFLOW".to_owned(), "r... hello".to_owned()]
            ),
            (5, "archon version".to_owned(), 0, vec![]),
        ]
    );
    assert!(matches("r... hello", "r6b0 hello"));
    assert!(matches("a ... b ... c", "a x b y c"));
    assert!(!matches("r... hello", "run hello world"));
    assert!(!matches("abc...abc", "abc"));
    // A table's columns are as wide as their values.
    assert!(matches("RUN     WORKFLOW", "RUN  WORKFLOW"));
    assert!(matches("RUN  WORKFLOW", "RUN       WORKFLOW"));
    assert!(!matches("RUN  WORKFLOW", "RUN WORKFLOW"));
    assert!(!matches("RUN WORKFLOW", "RUN  WORKFLOW"));
    let shown = |lines: &[&str]| lines.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>();
    assert_eq!(unprinted(&shown(&["a ...", "a 1"]), "a 1\na 2\n"), None);
    assert_eq!(
        unprinted(&shown(&["a ...", "a ...", "a ..."]), "a 1\na 2\n"),
        Some("a ...")
    );
    assert_eq!(
        with_store(
            "export S='postgres://u:p@db.internal/a?x=1' `postgresql://h/b` c",
            "postgres://t@127.0.0.1/test"
        ),
        "export S='postgres://t@127.0.0.1/test' `postgres://t@127.0.0.1/test` c"
    );
    let mut reader = Reader::default();
    assert_eq!(reader.next_job(), 1);
    reader
        .jobs
        .push((2, Job::Worker(Worker::start(Command::new("true")))));
    assert_eq!(reader.next_job(), 3);
    assert_eq!(
        commands,
        vec![
            (4, "archon validate bad.yaml".to_owned(), 2),
            (7, "archon runs".to_owned(), 0),
            (8, "archon run x.yaml --input 'who=a # b'".to_owned(), 0),
            (9, "archon run y.yaml".to_owned(), 3),
        ]
    );
}
