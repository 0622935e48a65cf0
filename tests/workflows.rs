//! The bundled example workflows are valid, and each TOML twin validates to the same model as its YAML.

use std::path::{Path, PathBuf};

use archon_engine::{Validation, Workflow, validate_file};
use serde_json::Value;

use crate::support::{root, spec_files};

fn workflows() -> Vec<PathBuf> {
    spec_files(&root().join("workflows"))
}

fn valid(path: &Path) -> Workflow {
    clean(validate_file(path), &path.display().to_string())
}

/// The workflow of a validation that must have no diagnostics at all; `what` names it in the failure.
fn clean(validation: Validation, what: &str) -> Workflow {
    let messages: Vec<String> = validation
        .diagnostics
        .iter()
        .map(|d| format!("{}: {}", d.code, d.message))
        .collect();
    assert!(
        messages.is_empty(),
        "{what} has diagnostics:\n{}",
        messages.join("\n")
    );
    validation.workflow.expect("a valid spec yields a workflow")
}

#[test]
fn every_example_is_valid_without_warnings() {
    let files = workflows();
    assert!(
        files.len() >= 8,
        "expected at least 8 example workflows, found {}",
        files.len()
    );
    for path in files {
        valid(&path);
    }
}

/// The first path at which two JSON values differ, for a readable failure.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys()) {
                let (l, r) = (
                    x.get(key).unwrap_or(&Value::Null),
                    y.get(key).unwrap_or(&Value::Null),
                );
                if let Some(diff) = first_difference(l, r, &format!("{path}.{key}")) {
                    return Some(diff);
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (l, r))| first_difference(l, r, &format!("{path}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{path}: YAML has {a}, TOML has {b}")),
    }
}

#[test]
fn toml_twins_validate_to_the_same_model() {
    let files = workflows();
    let mut pairs = 0;
    for yaml in files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
    {
        let toml = yaml.with_extension("toml");
        if !files.contains(&toml) {
            continue;
        }
        pairs += 1;
        let (a, b) = (valid(yaml), valid(&toml));
        let (ja, jb) = (
            serde_json::to_value(&*a.spec).expect("serializes"),
            serde_json::to_value(&*b.spec).expect("serializes"),
        );
        if let Some(diff) = first_difference(&ja, &jb, "") {
            panic!("{} and its TOML twin differ at {diff}", yaml.display());
        }
        assert!(
            a.spec == b.spec,
            "{}: specs differ although their JSON forms agree",
            yaml.display()
        );
        assert_eq!(
            a.dependencies,
            b.dependencies,
            "{}: dependency graphs differ",
            yaml.display()
        );
        assert_eq!(a.name, b.name);
    }
    assert!(
        pairs >= 3,
        "expected at least 3 YAML/TOML twins, found {pairs}"
    );
}

/// Validates every complete example (a yaml or toml block starting with `name`) in a doc; returns how many.
fn check_doc_examples(doc_path: &str) -> usize {
    let doc = std::fs::read_to_string(root().join(doc_path)).expect("doc exists");
    let mut checked = 0;
    let mut lines = doc.lines().enumerate();
    while let Some((line, text)) = lines.next() {
        let lang = match text.trim() {
            "```yaml" => "yaml",
            "```toml" => "toml",
            _ => continue,
        };
        let block: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| l.trim() != "```")
            .collect();
        if !block.first().is_some_and(|l| l.starts_with("name")) {
            continue;
        }
        let validation = archon_engine::validate_source(
            format!("{doc_path}:{}.{lang}", line + 1),
            block.join("\n"),
        );
        clean(
            validation,
            &format!("the example at {doc_path} line {}", line + 1),
        );
        checked += 1;
    }
    checked
}

/// The examples in the docs are valid as written.
#[test]
fn examples_in_the_docs_are_valid() {
    let in_spec = check_doc_examples("docs/spec.md");
    assert!(
        in_spec >= 10,
        "only {in_spec} complete examples found in docs/spec.md"
    );
    assert!(
        check_doc_examples("docs/tools.md") >= 1,
        "docs/tools.md has no complete example"
    );
}

/// docs/tools.md describes every built-in tool and every one of its arguments.
#[test]
fn every_builtin_tool_and_argument_is_documented() {
    let doc = std::fs::read_to_string(root().join("docs/tools.md")).expect("docs/tools.md exists");
    for tool in archon_engine::tools::builtin::all() {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", tool.name)))
            .unwrap_or_else(|| panic!("docs/tools.md has no table row for `{}`", tool.name));
        let properties = tool.parameters["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for name in properties.keys() {
            assert!(
                row.contains(&format!("`{name}`")),
                "docs/tools.md does not mention `{}` argument `{name}`",
                tool.name
            );
        }
    }
}
