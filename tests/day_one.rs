//! The day-one commands (issue 15, item 7): `init`, `tools`, `completions`, `version`, run ids people can
//! type (a unique prefix, `--last`), `runs` filters and `prune`.

use std::path::Path;

use rusqlite::Connection;
use serde_json::Value as Json;
use tempfile::TempDir;

use crate::support::{Output, archon, root, spawn_until};

/// Runs `archon ARGS` in `dir` and returns what it printed, asserting that it succeeded quietly.
fn ok(dir: &Path, args: &[&str]) -> String {
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir, args);
    assert_eq!(code, 0, "{args:?}: {stderr}");
    if args[0] != "run" {
        assert_eq!(stderr, "", "{args:?}");
    }
    stdout
}

/// Runs `archon ARGS` in `dir`, expecting it to refuse with exit 2 and nothing on standard output;
/// returns what it wrote on standard error.
fn refused(dir: &Path, args: &[&str]) -> String {
    let out = archon(dir, args);
    assert_eq!(out.code, 2, "{args:?}: {}{}", out.stdout, out.stderr);
    assert_eq!(out.stdout, "", "{args:?}");
    out.stderr
}

/// A directory whose `.archon` holds a copy of the store the previous version wrote (five runs of
/// 2026-11-23; see tests/fixtures/store/README.md).
fn fixture_store() -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    std::fs::create_dir(dir.path().join(".archon")).expect("mkdir");
    std::fs::copy(
        root().join("tests/fixtures/store/state.db"),
        dir.path().join(".archon/state.db"),
    )
    .expect("copy");
    dir
}

fn run_ids(dir: &Path) -> Vec<String> {
    let runs: Json = serde_json::from_str(&ok(dir, &["runs", "--json"])).expect("JSON");
    runs.as_array()
        .expect("list")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect()
}

#[test]
fn init_writes_a_starter_that_validates_without_warning_and_runs() {
    let dir = TempDir::new().expect("tempdir");
    let schema = ok(dir.path(), &["schema"]);
    for (args, file) in [
        (&["init"][..], "workflow.yaml"),
        (&["init", "--toml"][..], "workflow.toml"),
        (&["init", "nightly-build"][..], "nightly-build.yaml"),
    ] {
        let said = ok(dir.path(), args);
        assert_eq!(
            said,
            format!(
                "wrote `{file}` and its schema `.archon/workflow.schema.json`\n  hint: `archon run {file}` runs it\n"
            )
        );
        let text = std::fs::read_to_string(dir.path().join(file)).expect("written");
        insta::assert_snapshot!(format!("init_{file}"), text);
        // The schema the first line points at is there, and is the format's.
        let modeline = text.lines().next().expect("a first line");
        let target = modeline
            .rsplit([' ', '='])
            .next()
            .expect("a path on the first line");
        assert_eq!(target, ".archon/workflow.schema.json", "{modeline}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(target)).expect("schema written"),
            schema
        );
        // It validates with no diagnostic at all, and runs as written.
        let report: Json =
            serde_json::from_str(&ok(dir.path(), &["validate", file, "--format", "json"]))
                .expect("JSON");
        assert_eq!(report["diagnostics"], serde_json::json!([]), "{report}");
        assert_eq!(
            report["summary"],
            serde_json::json!({ "files": 1, "skipped": 0, "errors": 0, "warnings": 0 })
        );
        let run: Json = serde_json::from_str(&ok(
            dir.path(),
            &["run", file, "--input", "who=you and me", "--json"],
        ))
        .expect("JSON");
        assert_eq!(run["status"], "succeeded", "{run}");
        assert_eq!(
            run["outputs"],
            serde_json::json!({ "greeting": "hello, you and me", "words": "4" })
        );
    }

    // It never overwrites a file unless told to.
    std::fs::write(dir.path().join("workflow.yaml"), "mine\n").expect("write");
    insta::assert_snapshot!(refused(dir.path(), &["init"]), @r"
    error: `workflow.yaml` already exists
      hint: choose another NAME, or `--force` to overwrite it
    ");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("workflow.yaml")).expect("read"),
        "mine\n"
    );
    ok(dir.path(), &["init", "--force"]);
    assert!(
        std::fs::read_to_string(dir.path().join("workflow.yaml"))
            .expect("read")
            .starts_with("# yaml-language-server: $schema=.archon/workflow.schema.json\n")
    );
    insta::assert_snapshot!(refused(dir.path(), &["init", "Release Notes"]), @r"
    error: `Release Notes` cannot name a workflow: names are lowercase letters, digits, `-` and `_`, starting with a letter or digit
      hint: `archon init release-notes`
    ");
}

/// A spec that declares one tool of every kind.
const TOOLS_SPEC: &str = r#"name: kinds
tools:
  build:
    description: Build the project
    parameters:
      type: object
      properties:
        target: { type: string, description: What to build }
        jobs: { type: integer }
      required: [target]
    command: [make, "{{ target }}"]
  status:
    description: Ask the service how it is
    http: { url: "https://status.example.com/health", method: GET }
    idempotent: true
  twice:
    description: Echo twice
    parameters:
      type: object
      properties: { text: { type: string } }
      required: [text]
    steps:
      - { id: one, tool: echo, with: { text: "{{ text }}" } }
      - { id: two, tool: echo, with: { text: "{{ steps.one.output.text }}" } }
    result: "{{ steps.two.output.text }}"
  greet:
    description: The greeting sub-workflow
    workflow: sub.yaml
  github:
    description: The GitHub MCP server
    mcp: { command: [github-mcp-server, stdio], tools: [list_issues, get_issue] }
steps:
  - { id: a, tool: echo, with: { text: hi } }
"#;

#[test]
fn tools_lists_the_builtins_and_a_specs_declared_tools() {
    let dir = TempDir::new().expect("tempdir");
    insta::assert_snapshot!("tools_builtin", ok(dir.path(), &["tools"]));
    let text = ok(dir.path(), &["tools", "--json"]);
    insta::assert_snapshot!("tools_builtin_json", text);
    let builtins: Json = serde_json::from_str(&text).expect("JSON");

    std::fs::write(dir.path().join("kinds.yaml"), TOOLS_SPEC).expect("write");
    std::fs::write(
        dir.path().join("sub.yaml"),
        "name: sub\nsteps:\n  - { id: a, tool: echo, with: { text: hi } }\n",
    )
    .expect("write");
    let text = ok(dir.path(), &["tools", "kinds.yaml"]);
    let declared = &text[text.find("tools `kinds.yaml` declares").expect("a section")..];
    insta::assert_snapshot!("tools_declared", declared);
    let all: Json =
        serde_json::from_str(&ok(dir.path(), &["tools", "kinds.yaml", "--json"])).expect("JSON");
    let all = all.as_array().expect("a list");
    assert_eq!(
        all[..builtins.as_array().expect("list").len()],
        builtins.as_array().expect("list")[..]
    );
    insta::assert_snapshot!(
        "tools_declared_json",
        serde_json::to_string_pretty(&all[builtins.as_array().expect("list").len()..])
            .expect("JSON")
    );

    // A spec that does not validate is reported, as `validate` would.
    std::fs::write(dir.path().join("bad.yaml"), "name: bad\nsteps: 3\n").expect("write");
    let out = archon(dir.path(), &["tools", "bad.yaml"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.starts_with("error["), "{}", out.stderr);
}

/// Every subcommand `archon --help` lists.
fn subcommands(dir: &Path) -> Vec<String> {
    let help = ok(dir, &["--help"]);
    let commands = help
        .split("Commands:\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("a Commands section");
    commands
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn completions_cover_every_subcommand() {
    let dir = TempDir::new().expect("tempdir");
    let commands = subcommands(dir.path());
    for expected in [
        "init",
        "tools",
        "prune",
        "completions",
        "version",
        "show",
        "runs",
    ] {
        assert!(commands.iter().any(|c| c == expected), "{commands:?}");
    }
    let bash = ok(dir.path(), &["completions", "bash"]);
    let missing: Vec<&String> = commands
        .iter()
        .filter(|c| {
            !bash.contains(&format!("archon__{c})")) && !bash.contains(&format!("archon,{c})"))
        })
        .collect();
    assert_eq!(
        missing,
        Vec::<&String>::new(),
        "absent from the bash script"
    );
    assert!(
        !bash.contains("__jq") && !bash.contains("__render"),
        "the internal helpers are not offered"
    );
    assert!(
        bash.contains("--color")
            && bash.contains("--older-than")
            && bash.contains("waiting_approval"),
        "options and their values are completed"
    );
    let script = dir.path().join("archon.bash");
    std::fs::write(&script, &bash).expect("write");
    let checked = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("bash runs");
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let script = ok(dir.path(), &["completions", shell]);
        for command in &commands {
            assert!(script.contains(command.as_str()), "{shell}: {command}");
        }
        assert!(!script.contains("__render"), "{shell}");
    }
    let out = archon(dir.path(), &["completions", "tcsh"]);
    assert_eq!(out.code, 2);
}

#[test]
fn version_says_what_a_bug_report_needs() {
    let dir = TempDir::new().expect("tempdir");
    let json: Json = serde_json::from_str(&ok(dir.path(), &["version", "--json"])).expect("JSON");
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        json["store_schema"],
        archon_engine::session::STORE_SCHEMA_VERSION
    );
    assert_eq!(
        json["postgres_store_schema"],
        archon_engine::session::POSTGRES_STORE_SCHEMA_VERSION
    );
    assert_eq!(json["record_format"], archon_engine::record::FORMAT_VERSION);
    assert_eq!(
        json["profile"],
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let target = json["target"].as_str().expect("a target");
    assert!(
        target.split('-').count() >= 3 && target.starts_with(std::env::consts::ARCH),
        "{target}"
    );
    assert!(
        json["rustc"]
            .as_str()
            .expect("rustc")
            .starts_with("rustc 1."),
        "{json}"
    );
    let text = ok(dir.path(), &["version"]);
    insta::with_settings!({ filters => vec![
        (r"(?m)^(target|profile|rustc)( +).*$", "$1$2[..]"),
        (r"archon \d+\.\d+\.\d+", "archon [VERSION]"),
        // Checked above against the engine's own numbers, which a new migration raises.
        (r"(?m)^store schema   \d+ \(SQLite\), \d+ \(PostgreSQL\)$", "store schema   [N] (SQLite), [M] (PostgreSQL)"),
    ]}, {
        insta::assert_snapshot!("version", text);
    });
    assert_eq!(
        ok(dir.path(), &["--version"]),
        format!("archon {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_run_is_named_by_a_unique_prefix_or_last() {
    let dir = fixture_store();
    let dir = dir.path();
    let ids = run_ids(dir);
    let (agent, pay) = (&ids[0], &ids[2]);
    // A prefix only one id starts with names that run.
    assert_eq!(ok(dir, &["show", &agent[..10]]), ok(dir, &["show", agent]));
    assert_eq!(
        ok(dir, &["show", &agent[..10], "--json"]),
        ok(dir, &["show", agent, "--json"])
    );
    assert_eq!(ok(dir, &["show", "--last"]), ok(dir, &["show", agent]));
    assert_eq!(
        ok(dir, &["show", "--last", "--workflow", "pay"]),
        ok(dir, &["show", pay])
    );
    // One the start of several lists a few, with their workflows and start times.
    insta::assert_snapshot!(refused(dir, &["show", "r6b04aac5"]), @r"
    error: `r6b04aac5` is the start of 4 run ids, not one:
      r6b04aac55d5f45ca31  pipeline  started 2026-11-23T21:06:13Z
      r6b04aac55d6214c756  broken    started 2026-11-23T21:06:13Z
      r6b04aac55d6679d79d  pay       started 2026-11-23T21:06:13Z
      r6b04aac55d6864616e  grow      started 2026-11-23T21:06:13Z
      hint: type more of the id; `archon runs` lists the runs it holds
    ");
    insta::assert_snapshot!(refused(dir, &["show", "r6b04aac"]), @r"
    error: `r6b04aac` is the start of 5 run ids, not one:
      r6b04aac55d5f45ca31  pipeline  started 2026-11-23T21:06:13Z
      r6b04aac55d6214c756  broken    started 2026-11-23T21:06:13Z
      r6b04aac55d6679d79d  pay       started 2026-11-23T21:06:13Z
      r6b04aac55d6864616e  grow      started 2026-11-23T21:06:13Z
      r6b04aac65d9e74abff  agent     started 2026-11-23T21:06:14Z
      hint: type more of the id; `archon runs` lists the runs it holds
    ");
    insta::assert_snapshot!(refused(dir, &["show", "r7"]), @r"
    error: no run `r7` in the state directory
      hint: `archon runs` lists the runs it holds
    ");
    insta::assert_snapshot!(refused(dir, &["show", "--last", "--workflow", "deploy"]), @r"
    error: no run of workflow `deploy` in the state directory
      hint: `archon runs` lists the runs it holds
    ");
    insta::assert_snapshot!(refused(dir, &["show", agent, "--last"]), @r"
    error: give a run id or `--last`, not both
      hint: `archon runs` lists the runs, newest first
    ");

    // Every command that takes a RUN takes a prefix and `--last`; those with a STEP after it take the
    // step alone after `--last`.
    let approve = ok(
        dir,
        &["approve", &pay[..15], "--deny", "--reason", "not today"],
    );
    assert_eq!(
        approve.lines().last(),
        Some(format!("  hint: `archon resume {pay}` continues the run").as_str())
    );
    assert!(
        ok(dir, &["cancel", "--last", "--workflow", "pay"])
            .starts_with(&format!("run {pay} is cancelled"))
    );
    let logs = archon(dir, &["logs", "--last", "answer"]);
    assert_eq!(logs.code, 0, "{}", logs.stderr);
    insta::assert_snapshot!(refused(dir, &["resolve", "--last", "--failed"]), @r"
    error: `archon resolve` needs the step in doubt
      hint: `archon resolve RUN STEP --succeeded` (or `--failed`); `archon show RUN` names the steps in doubt
    ");
    for args in [
        &["show", "r7"][..],
        &["logs", "r7"],
        &["resume", "r7"],
        &["retry", "r7", "--failed"],
        &["cancel", "r7"],
        &["approve", "r7"],
        &["resolve", "r7", "step", "--failed"],
    ] {
        assert_eq!(
            refused(dir, args),
            "error: no run `r7` in the state directory\n  hint: `archon runs` lists the runs it holds\n",
            "{args:?}"
        );
    }
    let empty = TempDir::new().expect("tempdir");
    for args in [
        &["show", "--last"][..],
        &["logs", "--last"],
        &["logs", "--last", "step"],
        &["resume", "--last"],
        &["retry", "--last", "--failed"],
        &["cancel", "--last"],
        &["approve", "--last"],
        &["resolve", "--last", "step", "--failed"],
    ] {
        assert_eq!(
            refused(empty.path(), args),
            "error: no runs: there is no run store in `.archon`\n  hint: run the command where the run was started, or point `--state-dir` at its state directory\n",
            "{args:?}"
        );
    }
}

#[test]
fn runs_are_filtered_by_status_workflow_and_start() {
    let dir = fixture_store();
    let dir = dir.path();
    insta::assert_snapshot!(ok(dir, &["runs", "--status", "succeeded"]), @r"
    RUN                  WORKFLOW  STATUS     STARTED               DURATION
    r6b04aac55d6864616e  grow      succeeded  2026-11-23T21:06:13Z  209 ms
    r6b04aac55d5f45ca31  pipeline  succeeded  2026-11-23T21:06:13Z  20 ms
    ");
    insta::assert_snapshot!(ok(dir, &["runs", "--status", "failed", "--status", "waiting_approval"]), @r"
    RUN                  WORKFLOW  STATUS            STARTED               DURATION
    r6b04aac55d6679d79d  pay       waiting_approval  2026-11-23T21:06:13Z  23 ms
    r6b04aac55d6214c756  broken    failed            2026-11-23T21:06:13Z  19 ms
    ");
    insta::assert_snapshot!(ok(dir, &["runs", "--workflow", "grow"]), @r"
    RUN                  WORKFLOW  STATUS     STARTED               DURATION
    r6b04aac55d6864616e  grow      succeeded  2026-11-23T21:06:13Z  209 ms
    ");
    insta::assert_snapshot!(ok(dir, &["runs", "--since", "2026-11-23T21:06:14Z"]), @r"
    RUN                  WORKFLOW  STATUS       STARTED               DURATION
    r6b04aac65d9e74abff  agent     interrupted  2026-11-23T21:06:14Z  -
    ");
    insta::assert_snapshot!(ok(dir, &["runs", "--limit", "2"]), @r"
    RUN                  WORKFLOW  STATUS       STARTED               DURATION
    r6b04aac65d9e74abff  agent     interrupted  2026-11-23T21:06:14Z  -
    r6b04aac55d6864616e  grow      succeeded    2026-11-23T21:06:13Z  209 ms
    ");
    assert_eq!(
        ok(dir, &["runs", "--since", "2h"]),
        "no runs in `.archon` match\n"
    );
    assert_eq!(
        ok(dir, &["runs", "--since", "2026-11-24"]),
        "no runs in `.archon` match\n"
    );
    assert_eq!(run_ids(dir).len(), 5);
    let json: Json = serde_json::from_str(&ok(dir, &["runs", "--json", "--status", "interrupted"]))
        .expect("JSON");
    assert_eq!(json.as_array().map(Vec::len), Some(1));
    insta::assert_snapshot!(refused(dir, &["runs", "--since", "last week"]), @r"
    error: `last week` is not a duration (`2h`), a date (`2026-11-01`) or a time (`2026-11-01T09:30:00Z`)
      hint: `archon runs --help` says what `--since` takes
    ");
}

/// Every table that has a `run_id` column, read from the schema.
fn run_tables(conn: &Connection) -> Vec<String> {
    conn.prepare(
        "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) c
         WHERE m.type = 'table' AND c.name = 'run_id' ORDER BY m.name",
    )
    .expect("prepare")
    .query_map([], |r| r.get(0))
    .expect("query")
    .collect::<Result<_, _>>()
    .expect("rows")
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).expect(sql)
}

#[test]
fn prune_deletes_old_finished_runs_completely_and_nothing_else() {
    let dir = fixture_store();
    let dir = dir.path();
    let old = run_ids(dir);
    std::fs::write(
        dir.join("hello.yaml"),
        "name: hello\nsteps:\n  - { id: a, tool: exec, with: { argv: [echo, hi] } }\n",
    )
    .expect("write");
    ok(dir, &["run", "hello.yaml"]);
    let new = run_ids(dir).remove(0);
    let new_before = ok(dir, &["show", &new, "--json", "--events"]);
    let logs_before = ok(dir, &["logs", &new]);
    assert_eq!(logs_before, "hi\n");

    // A dry run says what it would delete, and deletes nothing.
    let db = std::fs::read(dir.join(".archon/state.db")).expect("read");
    let dry = ok(dir, &["prune", "--older-than", "1d", "--dry-run"]);
    // The records' size: `grow`'s 70 KB output kept apart, its other records and the other runs'.
    let kib: f64 = dry
        .rsplit(": ")
        .next()
        .and_then(|s| s.strip_suffix(" KiB of records\n"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a size: {dry}"));
    assert!((100.0..200.0).contains(&kib), "{dry}");
    let size = |text: &str| text.replace(&format!("{kib:.1} KiB"), "[SIZE]");
    insta::assert_snapshot!(size(&dry), @r"
    RUN                  WORKFLOW  STATUS     FINISHED
    r6b04aac55d5f45ca31  pipeline  succeeded  2026-11-23T21:06:13Z
    r6b04aac55d6214c756  broken    failed     2026-11-23T21:06:13Z
    r6b04aac55d6864616e  grow      succeeded  2026-11-23T21:06:14Z
    would delete 3 runs that ended more than 1d ago: [SIZE] of records
    ");
    assert_eq!(run_ids(dir).len(), 6);
    assert_eq!(
        std::fs::read(dir.join(".archon/state.db")).expect("read"),
        db,
        "a dry run changes nothing"
    );

    let done = ok(dir, &["prune", "--older-than", "1d"]);
    assert!(
        done.contains(&format!(": {kib:.1} KiB of records")),
        "{done}"
    );
    insta::assert_snapshot!(size(&done), @r"
    RUN                  WORKFLOW  STATUS     FINISHED
    r6b04aac55d5f45ca31  pipeline  succeeded  2026-11-23T21:06:13Z
    r6b04aac55d6214c756  broken    failed     2026-11-23T21:06:13Z
    r6b04aac55d6864616e  grow      succeeded  2026-11-23T21:06:14Z
    deleted 3 runs that ended more than 1d ago: [SIZE] of records (the database file keeps its size; new runs reuse the space)
    ");
    let pruned = [&old[1], &old[3], &old[4]];
    // The waiting and the interrupted run stay, and so does the new one, exactly as it was.
    assert_eq!(run_ids(dir), [new.clone(), old[0].clone(), old[2].clone()]);
    assert_eq!(ok(dir, &["show", &new, "--json", "--events"]), new_before);
    assert_eq!(ok(dir, &["logs", &new]), logs_before);
    assert_eq!(
        ok(dir, &["runs", "--check"]),
        "`.archon/state.db`: no damage found\n"
    );
    assert_eq!(
        ok(dir, &["prune", "--older-than", "1d"]),
        "no finished run ended more than 1d ago\n"
    );

    // Nothing of the pruned runs is left in any table, and no row belongs to a run that is gone.
    let conn = Connection::open(dir.join(".archon/state.db")).expect("opens");
    let tables = run_tables(&conn);
    for table in [
        "approvals",
        "attempts",
        "checkpoints",
        "events",
        "files",
        "logs",
        "results",
    ] {
        assert!(tables.iter().any(|t| t == table), "{tables:?}");
    }
    for table in &tables {
        for id in pruned {
            assert_eq!(
                count(
                    &conn,
                    &format!("SELECT COUNT(*) FROM {table} WHERE run_id = '{id}'")
                ),
                0,
                "{table} keeps rows of {id}"
            );
        }
        assert_eq!(
            count(
                &conn,
                &format!("SELECT COUNT(*) FROM {table} WHERE run_id NOT IN (SELECT id FROM runs)")
            ),
            0,
            "{table} has orphan rows"
        );
        assert!(
            count(
                &conn,
                &format!("SELECT COUNT(*) FROM {table} WHERE run_id = '{new}'")
            ) > 0
                || !["attempts", "events", "files", "results", "logs"].contains(&table.as_str()),
            "{table} lost the new run's rows"
        );
    }
    for id in pruned {
        assert_eq!(
            count(
                &conn,
                &format!("SELECT COUNT(*) FROM runs WHERE id = '{id}'")
            ),
            0
        );
    }
    // The 70 KB output `grow` kept apart went with it; no blob is left that no result uses.
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM blobs WHERE hash NOT IN (
                SELECT output_blob FROM results WHERE output_blob IS NOT NULL
                UNION SELECT text_blob FROM results WHERE text_blob IS NOT NULL)"
        ),
        0
    );
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM blobs"), 0);
    drop(conn);

    // Whatever the age, a run that is running, waiting for approval or interrupted is never pruned.
    std::fs::write(
        dir.join("wait.yaml"),
        "name: wait\nsteps:\n  - { id: a, tool: exec, with: { argv: [sh, -c, \"touch started; sleep 30\"] } }\n",
    )
    .expect("write");
    let mut running = spawn_until(dir, &["run", "wait.yaml"], "started");
    let said = ok(dir, &["prune", "--older-than", "0s"]);
    assert!(said.contains(&new) && said.starts_with("RUN"), "{said}");
    let left = ok(dir, &["runs"]);
    let _ = running.kill();
    let _ = running.wait();
    let states: Vec<(&str, &str)> = left
        .lines()
        .skip(1)
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells[1], cells[2])
        })
        .collect();
    assert_eq!(
        states,
        [
            ("wait", "running"),
            ("agent", "interrupted"),
            ("pay", "waiting_approval")
        ]
    );
}
