//! Checked-in artifacts stay true: the JSON Schema matches the spec types, the examples satisfy it, and every
//! diagnostic code is documented.

use std::path::Path;

use archon_engine::source::Sources;
use archon_engine::spec::schema::workflow_schema_text;
use archon_engine::spec::{self, Limits};

use crate::support::spec_files;

const REGENERATE: &str = "cargo run -- schema > schemas/workflow.schema.json";

#[test]
fn checked_in_schema_matches_the_spec_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/workflow.schema.json");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = workflow_schema_text();
    assert!(
        checked_in == generated,
        "schemas/workflow.schema.json is out of date with the spec types\nregenerate it with: {REGENERATE}"
    );
}

#[test]
fn schema_command_prints_the_checked_in_schema() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_archon"))
        .arg("schema")
        .output()
        .expect("archon runs");
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        workflow_schema_text()
    );
}

/// Editors check specs against the published schema; every example must pass it as well as `validate`.
#[test]
fn example_workflows_satisfy_the_published_schema() {
    let schema: serde_json::Value =
        serde_json::from_str(&workflow_schema_text()).expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workflows");
    let mut checked = 0;
    for path in spec_files(&dir) {
        let mut sources = Sources::default();
        let text = std::fs::read_to_string(&path).expect("readable");
        let file = sources.add(path.clone(), text);
        let (node, diagnostics) = spec::parse(&file, &Limits::default());
        assert!(
            diagnostics.is_empty(),
            "{}: {diagnostics:?}",
            path.display()
        );
        let instance = node.expect("parsed").to_json();
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{} does not satisfy the schema:\n{}",
            path.display(),
            errors.join("\n")
        );
        checked += 1;
    }
    assert!(checked > 0, "no workflows found in {}", dir.display());
}

/// Every code the validator can emit is explained in docs/diagnostics.md, and nothing else is.
#[test]
fn every_diagnostic_code_is_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(root.join("engine/src/diagnostic.rs")).expect("readable");
    let docs = std::fs::read_to_string(root.join("docs/diagnostics.md")).expect("readable");
    let codes = |text: &str, quote: char| -> std::collections::BTreeSet<String> {
        text.split(quote)
            .filter(|s| s.starts_with("archon::") && s.len() > 8 && !s.contains(' '))
            .map(str::to_owned)
            .collect()
    };
    let in_code = codes(&source, '"');
    let in_docs = codes(&docs, '`');
    assert!(!in_code.is_empty());
    let undocumented: Vec<_> = in_code.difference(&in_docs).collect();
    let stale: Vec<_> = in_docs.difference(&in_code).collect();
    assert!(
        undocumented.is_empty(),
        "codes missing from docs/diagnostics.md: {undocumented:?}"
    );
    assert!(
        stale.is_empty(),
        "docs/diagnostics.md lists codes the validator does not have: {stale:?}"
    );
}

/// `429` in `retry.on` may be written unquoted: `validate` accepts it, and so must an editor checking the
/// published schema.
#[test]
fn an_unquoted_status_in_retry_on_satisfies_the_published_schema() {
    let schema: serde_json::Value =
        serde_json::from_str(&workflow_schema_text()).expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let text = "name: r\nsteps:\n  - id: a\n    tool: echo\n    with: { message: hi }\n    retry: { attempts: 2, on: [429, \"429\", 5xx] }\n";
    let validation = archon_engine::validate_source(Path::new("r.yaml"), text.to_owned());
    assert_eq!(validation.diagnostics, vec![]);
    let mut sources = Sources::default();
    let file = sources.add("r.yaml".into(), text.to_owned());
    let (node, _) = spec::parse(&file, &Limits::default());
    let instance = node.expect("parsed").to_json();
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert_eq!(errors, Vec::<String>::new());
}
