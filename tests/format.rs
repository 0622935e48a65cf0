//! The format's conveniences at run time (issue 15): `shell_quote`, literal `foreach` lists, `matrix`,
//! a run's `timeout`, outputs over skipped steps.

use tempfile::TempDir;

use crate::support::archon;

/// `| shell_quote` makes a value one shell word whatever it holds: quotes, `$`, backticks and newlines
/// come back exactly, rendered in place and in the helper process (`~` sends a template there).
#[test]
fn shell_quote_passes_any_text_through_a_shell_unchanged() {
    let dir = TempDir::new().expect("tempdir");
    let text = "it's \"quoted\" $HOME `id` $(id) \\ back\nnew line\n\ttab ;| & *";
    std::fs::write(
        dir.path().join("inputs.json"),
        serde_json::json!({ "text": text, "list": ["a b", "it's", 3] }).to_string(),
    )
    .expect("inputs");
    std::fs::write(
        dir.path().join("wf.yaml"),
        r#"name: quote
inputs:
  text: { type: string }
  list: { type: array }
steps:
  - id: here
    tool: shell
    with: { command: "printf %s {{ inputs.text | shell_quote }} > here.txt" }
  - id: helper
    tool: shell
    with: { command: "printf %s {{ (inputs.text ~ '') | shell_quote }} > helper.txt" }
  - id: list
    tool: shell
    with: { command: "printf '<%s>' {{ inputs.list | shell_quote }} > list.txt" }
"#,
    )
    .expect("spec");
    let validate = archon(dir.path(), &["validate", "wf.yaml"]);
    assert_eq!(validate.stdout, "1 file valid\n", "{}", validate.stderr);
    let output = archon(dir.path(), &["run", "wf.yaml", "--inputs", "inputs.json"]);
    assert_eq!(output.code, 0, "{}", output.stderr);
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).expect("written");
    assert_eq!(read("here.txt"), text);
    assert_eq!(read("helper.txt"), text);
    assert_eq!(read("list.txt"), "<a b><it's><3>");
}

/// A `matrix` runs its step once per combination, the first name varying slowest, with lists written out
/// or given by expressions; each combination reads as `matrix.<name>` (and `item`), results keep order.
/// A `foreach` list written out runs too, its strings rendered as templates.
#[test]
fn matrix_and_literal_foreach_run_every_combination_in_order() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("wf.yaml"),
        r#"name: builds
inputs:
  versions: { type: array, default: ["3.11", "3.12"] }
steps:
  - id: build
    matrix:
      os: [linux, mac]
      py: inputs.versions
    max_parallel: 1
    tool: echo
    with: { os: "{{ matrix.os }}", py: "{{ matrix.py }}", index: "{{ index }}", same: "{{ item.os == matrix.os }}" }
  - id: pages
    foreach: [/, "/{{ inputs.versions | length }}"]
    tool: echo
    with: { page: "{{ item }}" }
outputs:
  builds: "{{ steps.build.output | map(attribute='os') | join(',') }}/{{ steps.build.output | map(attribute='py') | join(',') }}"
  pages: "{{ steps.pages.output | map(attribute='page') | join(',') }}"
  combos: "{{ steps.build.output | map(attribute='index') | join(',') }}/{{ steps.build.output | map(attribute='same') | join(',') }}"
"#,
    )
    .expect("spec");
    let output = archon(dir.path(), &["run", "wf.yaml", "--json"]);
    assert_eq!(output.code, 0, "{}", output.stderr);
    let report: serde_json::Value = serde_json::from_str(&output.stdout).expect("json");
    assert_eq!(
        report["outputs"],
        serde_json::json!({
            "builds": "linux,linux,mac,mac/3.11,3.12,3.11,3.12",
            "pages": "/,/2",
            "combos": "0,1,2,3/True,True,True,True",
        })
    );
}

/// An output that reads a step that did not succeed (here skipped by its `if`, so its `output` is null)
/// fails with a hint naming `| default(...)` and `steps.X.status`, for workflow and step outputs alike;
/// with `| default(...)` it renders.
/// A matrix written in TOML varies its lists in the order they are written, as in YAML: the first name
/// slowest, whatever the names' alphabetical order.
#[test]
fn a_toml_matrix_keeps_the_order_its_lists_are_written_in() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("m.toml"),
        "name = \"m\"\n\n[[steps]]\nid = \"b\"\ntool = \"echo\"\nwith = { v = \"{{ matrix.zeta }}{{ matrix.alpha }}\" }\n\n[steps.matrix]\nzeta = [\"l\", \"m\"]\nalpha = [1, 2]\n\n[outputs]\nall = \"{{ steps.b.output | map(attribute='v') | join(',') }}\"\n",
    )
    .expect("write");
    let out = archon(dir.path(), &["run", "m.toml", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("report");
    assert_eq!(report["outputs"]["all"], "l1,l2,m1,m2", "{}", out.stderr);
}

#[test]
fn an_output_over_a_skipped_step_says_how_to_write_it() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("wf.yaml"),
        r#"name: skipping
steps:
  - { id: a, tool: echo, with: { x: 1 }, if: "false" }
  - id: b
    tool: echo
    with: { x: 2 }
    if: "true"
    on_error: continue
    outputs:
      from_a: "{{ steps.a.output.x }}"
  - { id: c, tool: echo, with: { x: 3 } }
outputs:
  kept: "{{ steps.a.output.x | default('none') }}"
  x: "{{ steps.a.output.x }}"
"#,
    )
    .expect("spec");
    let output = archon(dir.path(), &["run", "wf.yaml", "--json"]);
    assert_eq!(output.code, 1, "{}", output.stderr);
    let report: serde_json::Value = serde_json::from_str(&output.stdout).expect("json");
    let hint = "\n  hint: step `a` ended `skipped`, so its `output` is null; give a value for that case with `| default(...)` (`steps.a.output.x | default('')`), or test `steps.a.status`";
    assert_eq!(
        report["steps"]["b"]["error"],
        format!("output `from_a`: `steps.a.output.x` is undefined{hint}")
    );
    assert_eq!(
        report["error"],
        format!("output `x`: `steps.a.output.x` is undefined{hint}")
    );
    assert_eq!(report["outputs"]["kept"], "none");
}

/// A run's `timeout` bounds the whole run: when it passes, the running command is killed, the run fails
/// with `run timed out after 3s` (in the summary and in its durable record), and `retry --failed` runs
/// the unfinished steps again, reusing the finished ones.
#[test]
fn a_run_timeout_stops_the_run_and_retry_failed_finishes_it() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("wf.yaml"),
        r#"name: slow
timeout: 3s
steps:
  - { id: quick, tool: shell, with: { command: "echo once >> quick.log" } }
  - id: slow
    needs: [quick]
    tool: shell
    with: { command: "if [ -f go ]; then exit 0; fi; echo $$ > slow.pid; exec sleep 60" }
  - { id: after, tool: echo, with: { x: 1 }, needs: [slow] }
"#,
    )
    .expect("spec");
    let output = archon(dir.path(), &["run", "wf.yaml"]);
    assert_eq!(output.code, 1, "{}", output.stderr);
    let lines: Vec<&str> = output.stdout.lines().collect();
    let id = lines[0].split(' ').nth(1).expect("a run id").to_owned();
    assert_eq!(
        lines[1..],
        ["error: run timed out after 3s"],
        "{}",
        output.stdout
    );
    assert!(
        lines[0].starts_with(&format!("run {id} of `slow` failed in ")),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].ends_with(": 1 succeeded, 2 cancelled"),
        "{}",
        lines[0]
    );
    // The command was killed with the run, not left to sleep.
    let pid = std::fs::read_to_string(dir.path().join("slow.pid")).expect("slow started");
    // Gone, or a zombie its new parent has not reaped yet.
    let state = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ")?.1.chars().next());
    assert!(
        matches!(state, None | Some('Z' | 'X')),
        "the command outlived the run: {state:?}"
    );
    let show = archon(dir.path(), &["show", &id]);
    let recorded: Vec<&str> = show
        .stdout
        .lines()
        .filter(|l| l.starts_with("status") || l.starts_with("error"))
        .collect();
    assert_eq!(
        recorded,
        ["status    failed", "error     run timed out after 3s"]
    );
    // A run that failed by its own limit is not resumed, but its unfinished steps can be retried.
    let resume = archon(dir.path(), &["resume", &id]);
    assert_eq!(resume.code, 2, "{}", resume.stderr);
    std::fs::write(dir.path().join("go"), "").expect("go");
    let retry = archon(dir.path(), &["retry", &id, "--failed"]);
    assert_eq!(retry.code, 0, "{}", retry.stderr);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("quick.log")).expect("ran"),
        "once\n"
    );
}

/// A sub-workflow's `timeout` bounds its call: the calling step times out, and the run goes on as that
/// step's `on_error` says.
#[test]
fn a_sub_workflow_timeout_times_out_its_call() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("sub.yaml"),
        "name: sub\ntimeout: 1s\nsteps:\n  - { id: wait, tool: exec, with: { argv: [sleep, \"60\"] } }\n",
    )
    .expect("sub");
    std::fs::write(
        dir.path().join("wf.yaml"),
        "name: caller\nsteps:\n  - { id: call, workflow: sub.yaml, on_error: continue }\n  - { id: next, tool: echo, with: { x: 1 }, if: \"steps.call.status == 'timed_out'\" }\n",
    )
    .expect("spec");
    let output = archon(dir.path(), &["run", "wf.yaml", "--json"]);
    assert_eq!(output.code, 0, "{}", output.stderr);
    let report: serde_json::Value = serde_json::from_str(&output.stdout).expect("json");
    assert_eq!(report["steps"]["call"]["status"], "timed_out");
    assert_eq!(
        report["steps"]["call"]["error"],
        "sub-workflow `sub.yaml` timed out after 1s"
    );
    assert_eq!(report["steps"]["next"]["status"], "succeeded");
}

/// A `matrix` step's `max_parallel` bounds its combinations running at once, as for `foreach` items: each
/// command counts the commands running as it starts.
#[test]
fn a_matrix_runs_at_most_max_parallel_combinations_at_once() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::create_dir(dir.path().join("slots")).expect("mkdir");
    std::fs::write(
        dir.path().join("wf.yaml"),
        r#"name: grid
steps:
  - id: cell
    matrix: { x: [1, 2, 3], y: [a, b] }
    max_parallel: 2
    tool: shell
    with: { command: "touch slots/$$; ls slots | wc -l >> counts; echo {{ matrix.x | shell_quote }}{{ matrix.y | shell_quote }} >> cells; sleep 0.2; rm slots/$$" }
"#,
    )
    .expect("spec");
    let output = archon(dir.path(), &["run", "wf.yaml", "--max-parallel", "8"]);
    assert_eq!(output.code, 0, "{}", output.stderr);
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).expect("written");
    let counts: Vec<usize> = read("counts")
        .lines()
        .map(|l| l.trim().parse().expect("a count"))
        .collect();
    assert_eq!(counts.len(), 6);
    let most = counts.iter().copied().max().unwrap_or(0);
    assert!((1..=2).contains(&most), "{most} combinations ran at once");
    let mut cells: Vec<String> = read("cells").lines().map(str::to_owned).collect();
    cells.sort();
    assert_eq!(cells, ["1a", "1b", "2a", "2b", "3a", "3b"]);
}
