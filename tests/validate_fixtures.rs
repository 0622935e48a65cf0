//! One fixture per diagnostic code in `tests/fixtures/validate/`, run through the real binary and
//! snapshotted (carets included). Valid fixtures (`valid_*`) snapshot "no diagnostics".

use std::path::{Path, PathBuf};

use crate::support::{archon, root, spec_files};

/// Codes a small fixture file cannot show; `tests/hostile.rs` covers each of them.
const COVERED_BY_HOSTILE_TESTS: &[&str] = &[
    "archon::file_too_large",
    "archon::too_many_steps",
    "archon::unreadable_file",
];

fn fixtures() -> Vec<PathBuf> {
    spec_files(&root().join("tests/fixtures/validate"))
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .expect("inside the repository")
        .display()
        .to_string()
}

fn run(args: &[&str]) -> (i32, String) {
    let output = archon(root(), args);
    (output.code, output.stdout)
}

/// What a fixture looks like to a user: the exit code and the rendered diagnostics.
fn check(path: &Path) -> String {
    let (code, stdout) = run(&["validate", "--color", "never", &relative(path)]);
    format!("exit: {code}\n{stdout}")
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .expect("has a name")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn fixtures_render_as_snapshotted() {
    for path in fixtures() {
        let name = format!(
            "{}_{}",
            stem(&path),
            path.extension().and_then(|e| e.to_str()).unwrap_or("")
        );
        insta::assert_snapshot!(name, check(&path));
    }
}

#[test]
fn each_invalid_fixture_exits_two_with_its_code_and_location() {
    let mut invalid = 0;
    for path in fixtures() {
        let stem = stem(&path);
        let (code, stdout) = run(&["validate", "--format", "json", &relative(&path)]);
        let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON output parses");
        let diagnostics = report["diagnostics"].as_array().expect("diagnostics array");
        if stem.starts_with("valid_") {
            assert_eq!(code, 0, "{stem} should be valid: {stdout}");
            assert!(
                diagnostics.is_empty(),
                "{stem} should have no diagnostics: {stdout}"
            );
            continue;
        }
        invalid += 1;
        let expected = format!("archon::{stem}");
        let found = diagnostics.iter().find(|d| d["code"] == expected.as_str());
        let found =
            found.unwrap_or_else(|| panic!("{stem}: no `{expected}` diagnostic in {stdout}"));
        assert!(
            found["line"].as_u64().is_some_and(|l| l >= 1)
                && found["column"].as_u64().is_some_and(|c| c >= 1)
        );
        let is_warning = found["severity"] == "warning";
        assert_eq!(
            code,
            if is_warning { 0 } else { 2 },
            "{stem}: wrong exit code"
        );
        let (_, text) = run(&["validate", &relative(&path)]);
        assert!(
            text.contains(&format!("[{expected}]")),
            "{stem}: text output lacks the code:\n{text}"
        );
    }
    assert!(invalid >= 30, "only {invalid} invalid fixtures");
}

#[test]
fn every_code_has_a_fixture() {
    let source =
        std::fs::read_to_string(root().join("engine/src/diagnostic.rs")).expect("readable");
    let codes: Vec<&str> = source
        .split('"')
        .filter(|s| s.starts_with("archon::"))
        .collect();
    let stems: Vec<String> = fixtures()
        .iter()
        .map(|p| format!("archon::{}", stem(p)))
        .collect();
    let missing: Vec<&&str> = codes
        .iter()
        .filter(|c| !stems.iter().any(|s| s == *c) && !COVERED_BY_HOSTILE_TESTS.contains(c))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a fixture in tests/fixtures/validate/: {missing:?}"
    );
}

/// Regression: `on:` in rules is YAML 1.1's boolean `true`; with YAML 1.2 booleans it stays a key.
#[test]
fn rule_key_on_is_not_a_boolean() {
    let validation = archon_engine::validate_source(
        "rules.yaml",
        "name: r\nsteps:\n  - id: a\n    tool: echo\nrules:\n  - on: before_tool\n    action: log\n",
    );
    assert!(
        validation.diagnostics.is_empty(),
        "{:?}",
        validation.diagnostics
    );
}
