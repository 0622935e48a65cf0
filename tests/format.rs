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
