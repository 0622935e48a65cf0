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

/// A dry run prints tool arguments, so a template that changes a secret (`upper`, `reverse`, a slice, a
/// spec `env` entry built from it) must not show any of it: the dry run renders with every secret, and every
/// environment variable that holds one, already masked, so what it prints derives from `***` and never from
/// the value.
#[test]
fn a_dry_run_never_shows_a_secret_a_template_transformed() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::write(
        dir.path().join("leak.yaml"),
        r#"name: leak
secrets: [TOKEN]
env:
  AUTH: "Bearer {{ secrets.TOKEN | upper }}"
steps:
  - id: call
    tool: echo
    with:
      nested: { deep: ["{{ secrets.TOKEN }}"] }
      upper: "{{ secrets.TOKEN | upper }}"
      reversed: "{{ secrets.TOKEN | reverse }}"
      halves: "{{ secrets.TOKEN[:6] }} {{ secrets.TOKEN[6:] }}"
      auth: "{{ env.AUTH }}"
      raw_env: "{{ env.TOKEN | title }}"
  - id: think
    goal: "use {{ env.AUTH | lower }} and {{ env.TOKEN | reverse }}"
"#,
    )
    .expect("spec");
    let env = [("TOKEN", "s3cr3t-value-xyz")];
    let text = crate::support::archon_with(dir.path(), &["run", "--dry-run", "leak.yaml"], &env);
    assert_eq!(text.code, 0, "{}", text.stderr);
    insta::assert_snapshot!(text.stdout, @r#"
    dry run of `leak`: 2 steps in 1 wave; nothing is run

    wave 1
      call  tool echo
        with: {"nested":{"deep":["***"]},"upper":"***","reversed":"***","halves":"*** ","auth":"Bearer ***","raw_env":"***"}
      think  LLM agent
        goal: use bearer *** and ***
    "#);
    let json = crate::support::archon_with(
        dir.path(),
        &["run", "--dry-run", "leak.yaml", "--json"],
        &env,
    );
    assert_eq!(json.code, 0, "{}", json.stderr);
    let lower = json.stdout.to_lowercase();
    for piece in ["s3cr3t", "value-xyz", "zyx-eulav", "t3rc3s"] {
        assert!(!lower.contains(piece), "`{piece}` in {}", json.stdout);
    }
}

/// In a `matrix` step, `{{ matrix.os }}` is known once the step runs, as `{{ item }}` is: the dry run marks
/// it so, where it said `matrix` was undefined and the step would fail.
#[test]
fn a_dry_run_marks_matrix_values_as_known_at_run_time() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::write(
        dir.path().join("grid.yaml"),
        r#"name: grid
steps:
  - id: build
    tool: echo
    matrix: { os: [linux, mac], py: "[3, 4]" }
    with: { target: "{{ matrix.os }}-py{{ matrix.py }}" }
"#,
    )
    .expect("spec");
    let out = crate::support::archon(dir.path(), &["run", "--dry-run", "grid.yaml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let dry: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(
        dry["waves"][0][0]["arguments"],
        serde_json::json!({ "target": "<known at run time: {{ matrix.os }}-py{{ matrix.py }}>" })
    );
}

/// The text of a dry run shows a `matrix` step's lists, as its JSON does and as it shows a `foreach`
/// list; it left them out, so a step that runs once per combination read as a step that runs once.
#[test]
fn a_dry_run_in_text_shows_a_matrix_steps_lists() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::write(
        dir.path().join("grid.yaml"),
        r#"name: grid
steps:
  - id: build
    tool: echo
    matrix: { os: [linux, mac], py: "[3, 4, 5]", tag: "steps.first.output" }
    with: { os: "{{ matrix.os }}" }
    needs: [first]
  - id: first
    tool: echo
    with: {}
"#,
    )
    .expect("spec");
    let out = crate::support::archon(dir.path(), &["run", "--dry-run", "grid.yaml"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    insta::assert_snapshot!(out.stdout, @r#"
    dry run of `grid`: 2 steps in 2 waves; nothing is run

    wave 1
      first  tool echo
        with: {}

    wave 2
      build  tool echo  (after first)
        matrix.os: `["linux","mac"]`: 2 items
        matrix.py: `[3, 4, 5]`: 3 items
        matrix.tag: `steps.first.output`: decided at run time (reads `steps.first.output`)
        with: {"os":"<known at run time: {{ matrix.os }}>"}
    "#);
}

/// `archon logs RUN STEP` for a step that has no attempt lists the steps that have, each once: a `foreach`
/// step whose items were retried named its items once per attempt.
#[test]
fn logs_of_an_unknown_step_list_each_step_once() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::write(
        dir.path().join("items.yaml"),
        r#"name: items
steps:
  - id: each
    tool: exec
    foreach: "[0, 1, 2]"
    with: { argv: [sh, -c, "test {{ item }} -ne 1"] }
    retry: { attempts: 3, delay: 1ms }
  - id: after
    tool: echo
    needs: [each]
    if: "steps.each.status == 'failed'"
    with: {}
"#,
    )
    .expect("spec");
    let run = crate::support::archon(dir.path(), &["run", "items.yaml"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let out = crate::support::archon(dir.path(), &["logs", "--last", "nope"]);
    assert_eq!(out.code, 2);
    let id = out.stderr.split('`').nth(1).expect("the run id").to_owned();
    insta::assert_snapshot!(out.stderr.replace(&id, "RUN"), @r"
    error: run `RUN` has no attempt of a step `nope`
      hint: its steps with attempts: `after`, `each[0]`, `each[1]`, `each[2]`
    ");
}

/// A value an option does not take is refused as every error of archon is: lowercase, the value and the
/// option in backticks, and what it takes on a hint line (where clap wrote `invalid value 'bogus' for
/// '--status <STATE>'` and a list in brackets).
#[test]
fn a_bad_option_value_is_an_error_with_a_hint() {
    let dir = TempDir::new().expect("temp dir");
    let refused = |args: &[&str]| {
        let out = crate::support::archon(dir.path(), args);
        assert_eq!((out.code, out.stdout.as_str()), (2, ""), "{args:?}");
        out.stderr
    };
    insta::assert_snapshot!(refused(&["runs", "--status", "Failed"]), @r"
    error: `Failed` is not a value of `--status`
      hint: did you mean `failed`?
      hint: `--status` takes `running`, `waiting_approval`, `interrupted`, `succeeded`, `failed`, `cancelled`
    ");
    insta::assert_snapshot!(refused(&["runs", "--status", "bogus"]), @r"
    error: `bogus` is not a value of `--status`
      hint: `--status` takes `running`, `waiting_approval`, `interrupted`, `succeeded`, `failed`, `cancelled`
    ");
    insta::assert_snapshot!(refused(&["runs", "--limit", "ten"]), @r"
    error: `ten` is not a number of runs
      hint: `archon runs --help` says what `--limit` takes
    ");
    // `--limit 0` would list nothing and say that no run matches.
    insta::assert_snapshot!(refused(&["runs", "--limit", "0"]), @r"
    error: `0` would list no run: give 1 or more
      hint: `archon runs --help` says what `--limit` takes
    ");
    insta::assert_snapshot!(refused(&["prune", "--older-than", "soon"]), @r"
    error: `soon` is not an age such as `30d`, `12h` or `2w`
      hint: `archon prune --help` says what `--older-than` takes
    ");
    insta::assert_snapshot!(refused(&["completions", "tcsh"]), @r"
    error: `tcsh` is not a value of `SHELL`
      hint: did you mean `zsh`?
      hint: `SHELL` takes `bash`, `elvish`, `fish`, `powershell`, `zsh`
    ");
    // An option given no value at all is clap's usage error, as before.
    assert!(
        refused(&["validate", "--format"]).starts_with(
            "error: a value is required for '--format <FORMAT>' but none was supplied"
        )
    );
    assert!(
        refused(&["llm", "ping", "--spec"])
            .starts_with("error: a value is required for '--spec <FILE>' but none was supplied")
    );
    insta::assert_snapshot!(refused(&["--color", "sometimes", "runs"]), @r"
    error: `sometimes` is not a value of `--color`
      hint: `--color` takes `auto`, `always`, `never`
    ");
}

/// `archon init ""` and `archon init notes/` name no file: the error says so and hints a name that works,
/// where it said `` `.yaml` cannot name a workflow `` and hinted `archon init yaml`. `archon init notes.yaml
/// --toml` asks for two formats, where it was told `notes.yaml` is not a name and hinted `notes-yaml`.
#[test]
fn init_without_a_file_name_or_with_two_formats_says_so() {
    let dir = TempDir::new().expect("temp dir");
    let refused = |args: &[&str]| {
        let out = crate::support::archon(dir.path(), args);
        assert_eq!((out.code, out.stdout.as_str()), (2, ""), "{args:?}");
        out.stderr
    };
    insta::assert_snapshot!(refused(&["init", ""]), @r"
    error: an empty NAME names no workflow
      hint: `archon init workflow`
    ");
    insta::assert_snapshot!(refused(&["init", "notes/"]), @r"
    error: `notes/` holds no workflow name
      hint: `archon init notes/workflow`
    ");
    insta::assert_snapshot!(refused(&["init", "notes.yaml", "--toml"]), @r"
    error: `notes.yaml` is a YAML file, and `--toml` asks for TOML
      hint: `archon init notes.toml`, or `archon init notes.yaml` without `--toml`
    ");
    insta::assert_snapshot!(refused(&["init", "notes/.yaml"]), @r"
    error: `notes/.yaml` holds no workflow name
      hint: `archon init notes/workflow`
    ");
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        0,
        "nothing written"
    );
}

/// An `if:` over an `env` entry made from a secret is decided as the run would decide it (masking the
/// secret for what a dry run prints must not turn a step that runs into one shown as skipped); only its truth
/// is shown, and the expression itself is shown with the secret masked.
#[test]
fn a_dry_run_decides_a_condition_on_a_secret_as_the_run_would() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::write(
        dir.path().join("gate.yaml"),
        r#"name: gate
secrets: [TOKEN]
env:
  AUTH: "Bearer {{ secrets.TOKEN }}"
steps:
  - id: call
    tool: echo
    if: "env.AUTH == 'Bearer s3cr3t-value-xyz' and env.TOKEN | length == 16"
    with: { auth: "{{ env.AUTH | upper }}" }
"#,
    )
    .expect("spec");
    let out = crate::support::archon_with(
        dir.path(),
        &["run", "--dry-run", "gate.yaml"],
        &[("TOKEN", "s3cr3t-value-xyz")],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    insta::assert_snapshot!(out.stdout, @r#"
    dry run of `gate`: 1 step in 1 wave; nothing is run

    wave 1
      call  tool echo
        if: `env.AUTH == 'Bearer ***' and env.TOKEN | length == 16` is true: it runs
        with: {"auth":"BEARER ***"}
    "#);
}

/// A dry run says how many combinations a `matrix` step runs when its lists are known, and that the step
/// fails when they are more than a run takes (each list alone looked fine: 1000 items).
#[test]
fn a_dry_run_counts_a_matrixs_combinations_and_says_when_they_are_too_many() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::write(
        dir.path().join("grid.yaml"),
        r#"name: grid
steps:
  - id: small
    tool: echo
    matrix: { os: [linux, mac], py: "[3, 4, 5]" }
    with: {}
  - id: huge
    tool: echo
    matrix: { a: "range(1000)", b: "range(1000)" }
    with: {}
"#,
    )
    .expect("spec");
    let out = crate::support::archon(dir.path(), &["run", "--dry-run", "grid.yaml"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    insta::assert_snapshot!(out.stdout, @r#"
    dry run of `grid`: 2 steps in 1 wave; nothing is run

    wave 1
      small  tool echo
        matrix.os: `["linux","mac"]`: 2 items
        matrix.py: `[3, 4, 5]`: 3 items
        matrix: 6 combinations
        with: {}
      huge  tool echo
        matrix.a: `range(1000)`: 1000 items
        matrix.b: `range(1000)`: 1000 items
        matrix: 1000000 combinations, more than 10000: the step fails
        with: {}
    "#);
}

/// Completion scripts offer the commands a person types, not archon's internal helpers (`__jq`,
/// `__render`, hidden from `--help`), which every shell's script offered after `archon <TAB>`.
#[test]
fn completions_leave_out_the_internal_helpers() {
    let dir = TempDir::new().expect("temp dir");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = crate::support::archon(dir.path(), &["completions", shell]);
        assert_eq!(out.code, 0, "{shell}: {}", out.stderr);
        assert!(out.stdout.contains("completions"), "{shell}");
        for helper in ["__jq", "__render"] {
            assert!(!out.stdout.contains(helper), "{shell} offers {helper}");
        }
    }
}

/// An error of one very long line (a command that wrote 5,000 characters to stderr without a newline) is cut
/// in progress, events and `archon show` as an error of many lines is, with a note naming `archon logs`,
/// which prints it whole: progress printed all of it on one line.
#[test]
fn an_error_of_one_long_line_is_cut_in_progress_and_show() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::write(
        dir.path().join("long.yaml"),
        r#"name: long
steps:
  - id: loud
    tool: exec
    with: { argv: [sh, -c, "printf '%05000d' 0 >&2; exit 1"] }
"#,
    )
    .expect("spec");
    let run = crate::support::archon(dir.path(), &["run", "long.yaml"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let runs: serde_json::Value =
        serde_json::from_str(&crate::support::archon(dir.path(), &["runs", "--json"]).stdout)
            .expect("runs");
    let id = runs[0]["id"].as_str().expect("id").to_owned();
    // `` `sh` exited with code 1: `` is 25 characters; the line keeps 300.
    let kept = format!("`sh` exited with code 1: {}", "0".repeat(275));
    let cut = format!("{kept} (...+4725 characters, see `archon logs {id} loud`)");
    let failed = run
        .stderr
        .lines()
        .find(|l| l.starts_with("failed "))
        .expect("a failed line");
    assert_eq!(failed.split_once("): ").map(|(_, e)| e), Some(cut.as_str()));
    let show = crate::support::archon(dir.path(), &["show", &id]);
    let row = show
        .stdout
        .lines()
        .find(|l| l.starts_with("loud "))
        .expect("the step's row");
    assert!(row.ends_with(&format!("  {cut}")), "{row}");
    // `archon logs` prints the whole error.
    let logs = crate::support::archon(dir.path(), &["logs", &id, "loud"]);
    let whole = format!("`sh` exited with code 1: {}", "0".repeat(5000));
    assert!(
        logs.stderr
            .ends_with(&format!("archon: attempt 1 of `loud` failed: {whole}\n")),
        "{}",
        logs.stderr
    );
}

/// A spec file whose name holds an escape sequence (a hostile repository's file, found by `validate DIR`)
/// is named in a diagnostic's location made printable, as every text a run produced is, where the name
/// reached the terminal raw and its codes drove it.
#[test]
fn a_file_name_with_escape_codes_is_shown_printable_in_diagnostics() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::create_dir(dir.path().join("specs")).expect("dir");
    std::fs::write(
        dir.path().join("specs").join("bad\u{1b}]0;owned\u{7}.yaml"),
        "name: x\nsteps: 3\n",
    )
    .expect("spec");
    let out = crate::support::archon(dir.path(), &["validate", "specs"]);
    assert_eq!(out.code, 2);
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert_eq!(
        text.lines().find(|l| l.contains("-->")),
        Some(" --> specs/bad\\u{001b}]0;owned\\u{0007}.yaml:2:8")
    );
}

/// An events file that cannot be created is refused as archon's errors are: lowercase, and the path it was
/// given made printable (it held an escape code), where the system's message came capitalised and the path
/// raw.
#[test]
fn an_events_file_that_cannot_be_created_is_a_plain_lowercase_error() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::write(
        dir.path().join("one.yaml"),
        "name: one\nsteps:\n  - { id: a, tool: echo, with: {} }\n",
    )
    .expect("spec");
    let out = crate::support::archon(
        dir.path(),
        &["run", "one.yaml", "--events", "missing/\u{1b}[31mev.jsonl"],
    );
    assert_eq!(
        (out.code, out.stderr.as_str()),
        (
            1,
            "error: cannot open events file `missing/\\u{001b}[31mev.jsonl`: no such file or directory (os error 2)\n"
        )
    );
}

/// Run ids are lowercase: an id or prefix typed in capitals (copied from a case-folding tool) names the
/// same run, where it was no run at all.
#[test]
fn a_run_id_in_capitals_names_the_same_run() {
    let dir = TempDir::new().expect("temp dir");
    std::fs::write(
        dir.path().join("one.yaml"),
        "name: one\nsteps:\n  - { id: a, tool: echo, with: {} }\n",
    )
    .expect("spec");
    assert_eq!(
        crate::support::archon(dir.path(), &["run", "one.yaml"]).code,
        0
    );
    let runs: serde_json::Value =
        serde_json::from_str(&crate::support::archon(dir.path(), &["runs", "--json"]).stdout)
            .expect("runs");
    let id = runs[0]["id"].as_str().expect("id").to_owned();
    let upper = id.to_uppercase();
    let shown = crate::support::archon(dir.path(), &["show", &upper[..8]]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert_eq!(
        shown.stdout.lines().next(),
        Some(format!("run       {id}").as_str())
    );
    let none = crate::support::archon(dir.path(), &["show", "RX"]);
    assert_eq!(
        (none.code, none.stderr.as_str()),
        (
            2,
            "error: no run `RX` in the state directory\n  hint: `archon runs` lists the runs it holds\n"
        )
    );
}
