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
