//! `archon plan`: waves, step kinds, the four output formats, and inputs checked before anything runs.

use tempfile::TempDir;

use crate::support::{Output, archon, root, spec_files};

const DIAMOND: &str = r#"name: diamond
inputs:
  n: { type: integer, minimum: 1, default: 2 }
  verbose: { type: boolean, default: false }
  tags: { type: array, items: { type: string }, default: [] }
  label: { type: string }
steps:
  - id: start
    tool: echo
    with: { x: "{{ inputs.n }}" }
  - id: left
    goal: "Think about {{ steps.start.output }}"
  - id: right
    foreach: steps.start.output
    tool: echo
    with: { y: "{{ item }}" }
  - id: join
    if: steps.left.status == 'succeeded'
    description: Combine the two
    needs: [right]
  - id: nested
    workflow: sub.yaml
    needs: [join]
"#;

fn diamond() -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("diamond.yaml"), DIAMOND).expect("write");
    std::fs::write(
        dir.path().join("sub.yaml"),
        "name: sub\nsteps:\n  - id: a\n    tool: echo\n",
    )
    .expect("write");
    dir
}

#[test]
fn text_plan_shows_waves_kinds_and_dependencies() {
    let dir = diamond();
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["plan", "diamond.yaml", "--input", "label=x"]);
    assert_eq!(code, 0, "{stderr}");
    insta::assert_snapshot!(stdout, @r"
    plan for `diamond`: 5 steps in 4 waves

    wave 1
      start   tool echo

    wave 2
      left    LLM agent  (after start)
      right   tool echo, for each item  (after start)

    wave 3
      join    LLM agent (unspecified step), conditional  (after left, right)

    wave 4
      nested  workflow sub.yaml  (after join)
    ");
}

#[test]
fn json_plan_has_inputs_coerced_and_one_based_waves() {
    let dir = diamond();
    let Output {
        code,
        stdout,
        stderr,
    } = archon(
        dir.path(),
        &[
            "plan",
            "diamond.yaml",
            "--format",
            "json",
            "--input",
            "label=x",
            "--input",
            "n=5",
            "--input",
            "verbose=true",
            "--input",
            r#"tags=["a","b"]"#,
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let value: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(
        value["inputs"],
        serde_json::json!({ "n": 5, "verbose": true, "tags": ["a", "b"], "label": "x" })
    );
    let steps = value["plan"]["steps"].as_array().expect("steps");
    let waves: Vec<u64> = steps
        .iter()
        .map(|s| s["wave"].as_u64().expect("wave"))
        .collect();
    assert_eq!(waves, [1, 2, 2, 3, 4]);
    assert_eq!(steps[1]["kind"], "agent");
    assert_eq!(steps[3]["kind"], "agent");
    assert_eq!(steps[3]["unspecified"], true);
    assert_eq!(steps[4]["kind"], "workflow");
    assert_eq!(
        value["plan"]["waves"],
        serde_json::json!([[0], [1, 2], [3], [4]])
    );
}

#[test]
fn dot_and_mermaid_have_a_node_per_step_and_an_edge_per_dependency() {
    let dir = diamond();
    let dot = archon(
        dir.path(),
        &[
            "plan",
            "diamond.yaml",
            "--input",
            "label=x",
            "--format",
            "dot",
        ],
    )
    .stdout;
    assert!(dot.starts_with("digraph \"diamond\" {"), "{dot}");
    assert!(
        dot.contains("\"start\" [label=\"start\\ntool echo\", shape=box];"),
        "{dot}"
    );
    assert_eq!(dot.matches(" -> ").count(), 5, "{dot}");
    let mermaid = archon(
        dir.path(),
        &[
            "plan",
            "diamond.yaml",
            "--input",
            "label=x",
            "--format",
            "mermaid",
        ],
    )
    .stdout;
    assert!(mermaid.starts_with("flowchart LR\n"));
    assert!(
        mermaid.contains("  left([\"left<br/>LLM agent\"])"),
        "{mermaid}"
    );
    assert_eq!(mermaid.matches(" --> ").count(), 5, "{mermaid}");
}

#[test]
fn every_input_problem_is_reported_and_exits_two() {
    let dir = diamond();
    let Output {
        code,
        stdout,
        stderr,
    } = archon(
        dir.path(),
        &[
            "plan",
            "diamond.yaml",
            "--input",
            "n=0",
            "--input",
            "verbose=yes",
            "--input",
            "colour=red",
            "--input",
            "oops",
        ],
    );
    assert_eq!(code, 2);
    assert!(stdout.is_empty());
    insta::assert_snapshot!(stderr, @r"
    error: input `verbose` must be `true` or `false`, got `yes`
      hint: for example `--input verbose=true`
    error: unknown input `colour`
      hint: its inputs are `n`, `verbose`, `tags` and `label`
    error: `--input` takes `name=value`, got `oops`
    error: input `n` is invalid: 0 is less than the minimum of 1
    error: missing required input `label`
      hint: pass it with `--input label=...`
    ");
}

#[test]
fn inputs_files_are_read_and_command_line_values_win() {
    let dir = diamond();
    std::fs::write(dir.path().join("in.yaml"), "label: from-file\nn: 7\n").expect("write");
    std::fs::write(dir.path().join("in.json"), r#"{"label": "json", "n": 3}"#).expect("write");
    for (file, expected_label) in [("in.yaml", "from-file"), ("in.json", "json")] {
        let Output {
            code,
            stdout,
            stderr,
        } = archon(
            dir.path(),
            &[
                "plan",
                "diamond.yaml",
                "--format",
                "json",
                "--inputs",
                file,
                "--input",
                "n=9",
            ],
        );
        assert_eq!(code, 0, "{stderr}");
        let value: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
        assert_eq!(value["inputs"]["label"], expected_label);
        assert_eq!(value["inputs"]["n"], 9);
    }
}

#[test]
fn an_invalid_spec_is_reported_like_validate_and_exits_two() {
    let Output {
        code,
        stdout,
        stderr,
    } = archon(root(), &["plan", "tests/fixtures/validate/cycle.yaml"]);
    assert_eq!(code, 2);
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("error[archon::cycle]: dependency cycle"),
        "{stderr}"
    );
}

#[test]
fn every_bundled_workflow_plans() {
    for path in spec_files(&root().join("workflows")) {
        let needs_repo = std::fs::read_to_string(&path)
            .expect("readable")
            .contains("repo_dir");
        let mut args = vec![
            "plan",
            path.to_str().expect("utf-8 path"),
            "--format",
            "json",
        ];
        if needs_repo {
            args.extend(["--input", "repo_dir=."]);
        }
        let Output {
            code,
            stdout,
            stderr,
        } = archon(root(), &args);
        assert_eq!(code, 0, "{}: {stderr}", path.display());
        let value: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
        assert!(!value["plan"]["steps"].as_array().expect("steps").is_empty());
    }
}
