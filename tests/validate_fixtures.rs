//! One fixture per diagnostic code in `tests/fixtures/validate/`, run through the real binary and
//! snapshotted (carets included). A fixture is named after the code it shows: `unknown_step.yaml` shows
//! `archon::unknown_step`; `unknown_step.needs.yaml` or `unknown_step.toml` show it another way. Valid
//! fixtures (`valid_*`) snapshot "no diagnostics". Helper files for sub-workflows live in `sub/`, which is
//! not validated on its own.

use std::path::{Path, PathBuf};

use crate::support::{archon, root, spec_files};

/// Codes a small fixture file cannot show; `tests/hostile.rs` (or the test named) covers each of them.
const COVERED_BY_HOSTILE_TESTS: &[&str] = &[
    // only a plan written by the LLM planner can break these rules: `tests/planner.rs`
    "archon::plan_not_allowed",
    // needs a file over the 8 MiB limit (512 KiB for TOML)
    "archon::file_too_large",
    // needs more than 20,000 steps
    "archon::too_many_steps",
    // needs more than 1,000 problems in one file
    "archon::too_many_problems",
    // needs a missing, unreadable or non-UTF-8 file, which a checked-in fixture cannot be
    "archon::unreadable_file",
    // needs a broken user config file: `tests/skills.rs` (a_broken_config_trusts_nothing_and_says_so)
    "archon::invalid_config",
];

fn fixtures() -> Vec<PathBuf> {
    spec_files(&root().join("tests/fixtures/validate"))
}

/// The path as a user in the repository root would type it, so that snapshots do not hold temp paths.
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

/// The code a fixture shows: its file name up to the first dot, after `archon::`.
fn code_of(path: &Path) -> String {
    let stem = stem(path);
    format!("archon::{}", stem.split('.').next().unwrap_or(&stem))
}

fn is_valid_fixture(path: &Path) -> bool {
    stem(path).starts_with("valid_")
}

/// The `file:line:column` after the first ` --> ` that follows `error[code]` or `warning[code]`.
fn text_location(text: &str, code: &str) -> Option<String> {
    let header = text.find(&format!("[{code}]:"))?;
    let arrow = text[header..].find("--> ")? + header + 4;
    let end = text[arrow..].find('\n')? + arrow;
    Some(text[arrow..end].trim().to_owned())
}

#[test]
fn fixtures_render_as_snapshotted() {
    let fixtures = fixtures();
    assert!(!fixtures.is_empty(), "no fixtures found");
    for path in fixtures {
        let name = path
            .file_name()
            .expect("has a name")
            .to_string_lossy()
            .replace('.', "_");
        insta::assert_snapshot!(name, check(&path));
    }
}

#[test]
fn valid_fixtures_have_no_diagnostics() {
    let valid: Vec<PathBuf> = fixtures()
        .into_iter()
        .filter(|p| is_valid_fixture(p))
        .collect();
    assert!(valid.len() >= 3, "only {} valid fixtures", valid.len());
    for path in valid {
        let (code, stdout) = run(&["validate", "--format", "json", &relative(&path)]);
        let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON output parses");
        assert_eq!(code, 0, "{}: {stdout}", relative(&path));
        assert_eq!(
            report["diagnostics"].as_array().map(Vec::len),
            Some(0),
            "{} should have no diagnostics: {stdout}",
            relative(&path)
        );
    }
}

#[test]
fn each_invalid_fixture_exits_two_with_its_code_and_location() {
    let mut invalid = 0;
    for path in fixtures().into_iter().filter(|p| !is_valid_fixture(p)) {
        invalid += 1;
        let name = relative(&path);
        let expected = code_of(&path);

        let (code, stdout) = run(&["validate", "--format", "json", &name]);
        let report: serde_json::Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{name}: JSON output does not parse ({e}):\n{stdout}"));
        let diagnostics = report["diagnostics"].as_array().expect("diagnostics array");
        let found = diagnostics
            .iter()
            .find(|d| d["code"] == expected.as_str())
            .unwrap_or_else(|| panic!("{name}: no `{expected}` diagnostic in {stdout}"));
        let line = found["line"].as_u64().filter(|&l| l >= 1);
        let column = found["column"].as_u64().filter(|&c| c >= 1);
        let (Some(line), Some(column)) = (line, column) else {
            panic!("{name}: `{expected}` has no line and column: {found}");
        };

        // Warning codes may be shown by a file that is otherwise valid; any error means exit 2.
        let has_error = diagnostics.iter().any(|d| d["severity"] == "error");
        if found["severity"] == "error" || has_error {
            assert_eq!(code, 2, "{name}: an invalid spec exits 2");
        } else {
            assert_eq!(found["severity"], "warning", "{name}: {found}");
            assert_eq!(code, 0, "{name}: warnings alone do not fail validation");
        }

        // The text output names the same code at the same place.
        let (text_code, text) = run(&["validate", "--color", "never", &name]);
        assert_eq!(text_code, code, "{name}: text and JSON exit codes differ");
        let file = found["file"].as_str().expect("file");
        assert_eq!(
            text_location(&text, &expected),
            Some(format!("{file}:{line}:{column}")),
            "{name}: text output does not show `[{expected}]` where the JSON says:\n{text}"
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
    assert!(codes.len() >= 40, "found only {} codes", codes.len());
    let shown: Vec<String> = fixtures()
        .iter()
        .filter(|p| !is_valid_fixture(p))
        .map(|p| code_of(p))
        .collect();
    let missing: Vec<&&str> = codes
        .iter()
        .filter(|c| !shown.iter().any(|s| s == *c) && !COVERED_BY_HOSTILE_TESTS.contains(c))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a fixture in tests/fixtures/validate/: {missing:?}"
    );
    let unknown: Vec<&String> = shown
        .iter()
        .filter(|s| !codes.contains(&s.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "fixtures named after codes that do not exist: {unknown:?}"
    );
    for code in COVERED_BY_HOSTILE_TESTS {
        assert!(codes.contains(code), "skip-list names unknown code {code}");
    }
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

/// Keeps `tests/fixtures/validate/mcp/github_tools.json` in `state` as the tool list of the `github` server
/// the `mcp/listed*.yaml` fixtures declare, as `archon mcp list` would (at a fixed time).
fn keep_github_tools(state: &Path) {
    keep_github_tools_for(state, &["get_*", "list_*"]);
}

/// [`keep_github_tools`] for a `github` server whose `tools` globs are `globs`.
fn keep_github_tools_for(state: &Path, globs: &[&str]) {
    use archon_engine::spec::Pattern;
    use archon_engine::tools::mcp::{DefValue, TransportDef, cache};
    let transport = TransportDef::Stdio {
        argv: vec![
            DefValue::Template("github-mcp-server".into()),
            DefValue::Template("stdio".into()),
        ],
        env: Vec::new(),
        cwd: None,
    };
    let globs: Vec<Pattern> = globs.iter().map(|g| Pattern::new(*g)).collect();
    let key = cache::key(&transport, Some(&globs));
    let tools: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/validate/mcp/github_tools.json"))
            .expect("readable"),
    )
    .expect("JSON");
    let kept = serde_json::json!({ "server": "github", "listed_at": 1_764_180_000_000_u64, "tools": tools });
    std::fs::create_dir_all(state.join("mcp")).expect("mcp dir");
    std::fs::write(state.join(format!("mcp/{key}.json")), kept.to_string()).expect("written");
}

/// The codes of `validate --format json`'s diagnostics.
fn codes_of(stdout: &str) -> Vec<String> {
    let report: serde_json::Value = serde_json::from_str(stdout).expect("JSON output parses");
    report["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .filter_map(|d| d["code"].as_str())
        .map(str::to_owned)
        .collect()
}

#[test]
fn calls_to_mcp_tools_are_checked_against_the_kept_tool_list() {
    let state = tempfile::tempdir().expect("temp dir");
    keep_github_tools(state.path());
    let state_dir = state.path().to_str().expect("UTF-8 path");
    let (code, stdout) = run(&[
        "validate",
        "--color",
        "never",
        "--state-dir",
        state_dir,
        "tests/fixtures/validate/mcp/listed.yaml",
    ]);
    insta::assert_snapshot!(format!("exit: {code}\n{stdout}"));

    // A spec whose calls are all in the list: no diagnostics, and no `archon::mcp_not_listed`.
    let (code, stdout) = run(&[
        "validate",
        "--format",
        "json",
        "--state-dir",
        state_dir,
        "tests/fixtures/validate/mcp/listed_valid.yaml",
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(codes_of(&stdout), Vec::<String>::new(), "{stdout}");

    // Without the list the same spec is valid too, with one warning that its calls are not checked.
    let empty = tempfile::tempdir().expect("temp dir");
    let (code, stdout) = run(&[
        "validate",
        "--format",
        "json",
        "--state-dir",
        empty.path().to_str().expect("UTF-8 path"),
        "tests/fixtures/validate/mcp/listed_valid.yaml",
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(codes_of(&stdout), ["archon::mcp_not_listed"], "{stdout}");
}

#[test]
fn a_tools_glob_that_matches_none_of_the_listed_tools_warns() {
    let state = tempfile::tempdir().expect("temp dir");
    keep_github_tools_for(state.path(), &["get_*", "lsit_*"]);
    let spec = state.path().join("typo.yaml");
    std::fs::write(
        &spec,
        "name: typo\ntools:\n  github:\n    mcp:\n      command: [github-mcp-server, stdio]\n      tools: [\"get_*\", \"lsit_*\"]\nsteps:\n  - { id: issue, tool: github.get_issue, with: { owner: a, repo: b, issue_number: 1 } }\n",
    )
    .expect("written");
    let output = archon(
        state.path(),
        &[
            "validate",
            "--color",
            "never",
            "--state-dir",
            ".",
            "typo.yaml",
        ],
    );
    assert_eq!(output.code, 0, "{}", output.stdout);
    assert_eq!(
        output.stdout,
        "warning[archon::pattern_matches_nothing]: `lsit_*` matches none of the tools MCP server `github` listed\n --> typo.yaml:6:24\n  |\n6 |       tools: [\"get_*\", \"lsit_*\"]\n  |                        ^^^^^^^^\n  |\n  = hint: the tools its `tools` keep: `get_issue` and `list_issues`\n\n1 file valid, 1 warning\n"
    );
}

#[test]
fn a_corrupt_tool_list_is_no_list() {
    let state = tempfile::tempdir().expect("temp dir");
    keep_github_tools(state.path());
    let kept = std::fs::read_dir(state.path().join("mcp"))
        .expect("mcp dir")
        .next()
        .expect("one list")
        .expect("entry")
        .path();
    std::fs::write(&kept, "{\"server\": \"github\", \"tools\": [").expect("written");
    let (code, stdout) = run(&[
        "validate",
        "--format",
        "json",
        "--state-dir",
        state.path().to_str().expect("UTF-8 path"),
        "tests/fixtures/validate/mcp/listed_valid.yaml",
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(codes_of(&stdout), ["archon::mcp_not_listed"], "{stdout}");
}
