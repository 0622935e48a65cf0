//! The bundled example workflows and the examples in the docs are valid, and each TOML twin validates to
//! the same model as its YAML.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use archon_engine::{Validation, Workflow, validate_file, validate_source};
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
        .map(|d| {
            let at = validation
                .sources
                .get(d.span.file)
                .map_or_else(String::new, |file| {
                    let (line, column) = file.line_col(d.span.start as usize);
                    format!("{}:{line}:{column}: ", file.path.display())
                });
            format!("{at}{} {}: {}", d.severity.as_str(), d.code, d.message)
        })
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

/// Editors find the JSON Schema through the first line of every bundled example.
#[test]
fn every_example_points_editors_at_the_schema() {
    for path in workflows() {
        let text = std::fs::read_to_string(&path).expect("readable");
        let first = text.lines().next().unwrap_or_default();
        let expected = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => "#:schema ../schemas/workflow.schema.json",
            _ => "# yaml-language-server: $schema=../schemas/workflow.schema.json",
        };
        assert_eq!(first, expected, "first line of {}", path.display());
    }
}

/// The first path at which two JSON values differ, for a readable failure: `.steps[2].retry.delay: YAML
/// has "1s", TOML has "2s"`.
fn first_difference(yaml: &Value, toml: &Value, path: &str) -> Option<String> {
    match (yaml, toml) {
        (Value::Object(a), Value::Object(b)) => a
            .keys()
            .chain(b.keys().filter(|k| !a.contains_key(*k)))
            .find_map(|key| {
                let at = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(l), Some(r)) => first_difference(l, r, &at),
                    (Some(l), None) => Some(format!("{at}: only in YAML ({l})")),
                    (None, Some(r)) => Some(format!("{at}: only in TOML ({r})")),
                    (None, None) => None,
                }
            }),
        (Value::Array(a), Value::Array(b)) => {
            let common = a
                .iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (l, r))| first_difference(l, r, &format!("{path}[{i}]")));
            common.or_else(|| match a.len().cmp(&b.len()) {
                std::cmp::Ordering::Greater => Some(format!(
                    "{path}[{}]: only in YAML ({})",
                    b.len(),
                    a[b.len()]
                )),
                std::cmp::Ordering::Less => Some(format!(
                    "{path}[{}]: only in TOML ({})",
                    a.len(),
                    b[a.len()]
                )),
                std::cmp::Ordering::Equal => None,
            })
        }
        _ if yaml == toml => None,
        _ => Some(format!("{path}: YAML has {yaml}, TOML has {toml}")),
    }
}

/// Where two validated twins differ, if they do: the spec (named by its first differing key) or the graph.
fn twin_difference(yaml: &Workflow, toml: &Workflow) -> Option<String> {
    let (a, b) = (
        serde_json::to_value(&*yaml.spec).expect("serializes"),
        serde_json::to_value(&*toml.spec).expect("serializes"),
    );
    if let Some(diff) = first_difference(&a, &b, "") {
        return Some(diff);
    }
    if yaml.spec != toml.spec {
        return Some("the specs differ although their JSON forms agree".to_owned());
    }
    if yaml.dependencies != toml.dependencies {
        return Some(format!(
            "dependency graphs differ: YAML {:?}, TOML {:?}",
            yaml.dependencies, toml.dependencies
        ));
    }
    None
}

#[test]
fn toml_twins_validate_to_the_same_model() {
    let files = workflows();
    let mut pairs = Vec::new();
    for yaml in files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
    {
        let toml = yaml.with_extension("toml");
        if !files.contains(&toml) {
            continue;
        }
        let (a, b) = (valid(yaml), valid(&toml));
        if let Some(diff) = twin_difference(&a, &b) {
            panic!("{} and {} differ at {diff}", yaml.display(), toml.display());
        }
        assert_eq!(a.name, b.name);
        pairs.push(a.name);
    }
    assert!(
        pairs.len() >= 3,
        "expected at least 3 YAML/TOML twins in workflows/, found {pairs:?}"
    );
}

/// The twin check names the first key that differs, so a failing pair says what to fix.
#[test]
fn a_twin_mismatch_names_the_first_differing_key() {
    let yaml = "name: t\nsecrets: [A, B]\nsteps:\n  - id: a\n    tool: echo\n    retry: { attempts: 3, delay: 1s }\n";
    let cases = [
        (
            "name = \"t\"\nsecrets = [\"A\", \"B\"]\n[[steps]]\nid = \"a\"\ntool = \"echo\"\nretry = { attempts = 3, delay = \"2s\" }\n",
            r#".steps[0].retry.delay: YAML has "1s", TOML has "2s""#,
        ),
        (
            "name = \"t\"\nsecrets = [\"A\", \"B\"]\n[[steps]]\nid = \"a\"\ntool = \"echo\"\ntimeout = \"5s\"\nretry = { attempts = 3, delay = \"1s\" }\n",
            r#".steps[0].timeout: only in TOML ("5s")"#,
        ),
        (
            "name = \"t\"\nsecrets = [\"A\"]\n[[steps]]\nid = \"a\"\ntool = \"echo\"\nretry = { attempts = 3, delay = \"1s\" }\n",
            r#".secrets[1]: only in YAML ("B")"#,
        ),
    ];
    let a = clean(validate_source("t.yaml", yaml), "the YAML side");
    for (toml, expected) in cases {
        let b = clean(validate_source("t.toml", toml), "the TOML side");
        assert_eq!(twin_difference(&a, &b).as_deref(), Some(expected));
    }
    let same = "name = \"t\"\nsecrets = [\"A\", \"B\"]\n[[steps]]\nid = \"a\"\ntool = \"echo\"\nretry = { attempts = 3, delay = \"1s\" }\n";
    let b = clean(validate_source("t.toml", same), "the TOML side");
    assert_eq!(twin_difference(&a, &b), None);
}

/// One complete example in a doc: a yaml or toml block whose first line after leading comments starts
/// with `name`.
struct DocExample {
    line: usize,
    lang: &'static str,
    workflow: Workflow,
}

/// Validates every complete example in a doc; each must have no diagnostics.
fn doc_examples(doc_path: &str) -> Vec<DocExample> {
    let doc = std::fs::read_to_string(root().join(doc_path)).expect("doc exists");
    let mut examples = Vec::new();
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
        let complete = block
            .iter()
            .find(|l| !l.starts_with('#'))
            .is_some_and(|l| l.starts_with("name"));
        if !complete {
            continue;
        }
        // Named as if it sat in the doc's folder, so that relative sub-workflow paths resolve.
        let validation =
            validate_source(format!("{doc_path}:{}.{lang}", line + 1), block.join("\n"));
        let workflow = clean(
            validation,
            &format!("the example at {doc_path} line {}", line + 1),
        );
        examples.push(DocExample {
            line: line + 1,
            lang,
            workflow,
        });
    }
    examples
}

/// The examples in the docs are valid as written.
#[test]
fn examples_in_the_docs_are_valid() {
    let in_spec = doc_examples("docs/spec.md").len();
    assert!(
        in_spec >= 10,
        "only {in_spec} complete examples found in docs/spec.md"
    );
    assert!(
        !doc_examples("docs/tools.md").is_empty(),
        "docs/tools.md has no complete example"
    );
}

/// A YAML example in docs/spec.md and a TOML example with the same workflow name say the same thing.
#[test]
fn yaml_and_toml_examples_in_the_docs_agree() {
    let mut by_name: BTreeMap<String, (Option<DocExample>, Option<DocExample>)> = BTreeMap::new();
    for example in doc_examples("docs/spec.md") {
        let entry = by_name.entry(example.workflow.name.clone()).or_default();
        let slot = if example.lang == "yaml" {
            &mut entry.0
        } else {
            &mut entry.1
        };
        if let Some(earlier) = slot {
            panic!(
                "docs/spec.md has two {} examples named `{}` (lines {} and {})",
                example.lang, example.workflow.name, earlier.line, example.line
            );
        }
        *slot = Some(example);
    }
    let mut pairs = 0;
    for (name, pair) in &by_name {
        if let (Some(yaml), Some(toml)) = pair {
            if let Some(diff) = twin_difference(&yaml.workflow, &toml.workflow) {
                panic!(
                    "docs/spec.md: the `{name}` examples at lines {} (YAML) and {} (TOML) differ at {diff}",
                    yaml.line, toml.line
                );
            }
            pairs += 1;
        }
    }
    assert!(
        pairs >= 10,
        "expected YAML and TOML versions of at least 10 examples in docs/spec.md, found {pairs}"
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
