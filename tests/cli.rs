//! The `archon` binary end to end: exit codes, directory walking, text and JSON output.

use std::path::Path;

use tempfile::TempDir;

use crate::support::archon;

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

const VALID: &str = "name: ok\nsteps:\n  - id: a\n    tool: echo\n    with: { x: 1 }\n";
const INVALID: &str =
    "name: bad\nsteps:\n  - id: a\n    tool: echo\n  - id: b\n    tool: echo\n    needs: [c]\n";

#[test]
fn valid_file_exits_zero() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "ok.yaml", VALID);
    let out = archon(dir.path(), &["validate", "ok.yaml"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(out.stdout, "1 file valid\n");
}

#[test]
fn invalid_file_exits_two_with_snippet_and_caret() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "bad.yaml", INVALID);
    let out = archon(dir.path(), &["validate", "bad.yaml"]);
    assert_eq!(out.code, 2);
    insta::assert_snapshot!(out.stdout, @r"
    error[archon::unknown_step]: `needs` refers to unknown step `c`
     --> bad.yaml:7:13
      |
    7 |     needs: [c]
      |             ^

    1 of 1 file invalid: 1 error
    ");
    assert!(
        !out.stdout.contains('\u{1b}'),
        "NO_COLOR output has escape codes"
    );
}

#[test]
fn directories_are_searched_recursively_and_hidden_entries_skipped() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "specs/a.yaml", VALID);
    write(
        dir.path(),
        "specs/nested/b.toml",
        "name = \"b\"\n[[steps]]\nid = \"x\"\ntool = \"echo\"\n",
    );
    write(dir.path(), "specs/nested/deeper/c.yml", INVALID);
    write(dir.path(), "specs/.hidden/d.yaml", "not: [valid");
    write(dir.path(), "specs/notes.txt", "ignored");
    let out = archon(dir.path(), &["validate", "--format", "json", "specs"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON output");
    let files: Vec<&str> = report["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["path"].as_str().expect("path"))
        .collect();
    assert_eq!(
        files,
        [
            "specs/a.yaml",
            "specs/nested/b.toml",
            "specs/nested/deeper/c.yml"
        ]
    );
    assert_eq!(report["summary"]["errors"], 1);
}

#[test]
fn json_output_has_locations_codes_and_hints() {
    let dir = TempDir::new().expect("tempdir");
    write(
        dir.path(),
        "bad.yaml",
        "name: bad\nsteps:\n  - id: a\n    tool: echo\n    nedds: [b]\n",
    );
    let out = archon(dir.path(), &["validate", "--format", "json", "bad.yaml"]);
    assert_eq!(out.code, 2);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON output");
    assert_eq!(report["version"], 1);
    let d = &report["diagnostics"][0];
    assert_eq!(d["file"], "bad.yaml");
    assert_eq!(d["code"], "archon::unknown_key");
    assert_eq!(d["severity"], "error");
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(5), Some(5))
    );
    assert_eq!(
        (d["end_line"].as_u64(), d["end_column"].as_u64()),
        (Some(5), Some(10))
    );
    assert_eq!(d["hints"][0], "did you mean `needs`?");
    assert_eq!(report["files"][0]["valid"], false);
}

#[test]
fn missing_file_is_a_diagnostic_not_a_crash() {
    let dir = TempDir::new().expect("tempdir");
    let out = archon(dir.path(), &["validate", "nope.yaml"]);
    assert_eq!(out.code, 2);
    assert!(
        out.stdout
            .contains("error[archon::unreadable_file]: cannot read `nope.yaml`: no such file"),
        "{}",
        out.stdout
    );
}

#[test]
fn color_is_used_only_when_asked() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "bad.yaml", INVALID);
    let plain = archon(dir.path(), &["validate", "bad.yaml"]);
    let colored = archon(dir.path(), &["validate", "--color", "always", "bad.yaml"]);
    assert!(!plain.stdout.contains('\u{1b}'));
    assert!(colored.stdout.contains('\u{1b}'));
}

#[test]
fn usage_errors_exit_two() {
    let dir = TempDir::new().expect("tempdir");
    let out = archon(dir.path(), &["validate"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("PATH"), "{}", out.stderr);
}

/// `archon validate DIR` checks the workflow specs in it, not every YAML or TOML file: `Cargo.toml` and a
/// CI file have no `steps` and are left alone (issue 15, item 7); a file named on the command line is
/// always checked.
#[test]
fn validate_of_a_directory_skips_files_that_are_not_workflows() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[package]\nname = \"x\"\nversion = \"0.1.0\"\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("ci.yaml"),
        "name: ci\non: push\nstages: [test]\njobs:\n  test: { runs-on: ubuntu-latest }\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("hello.yaml"),
        "name: hello\nsteps:\n  - { id: a, tool: echo, with: { text: hi } }\n",
    )
    .expect("write");
    let out = archon(dir.path(), &["validate", "."]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "1 file valid, 2 skipped (no top-level `steps` key)\n")
    );
    let named = archon(dir.path(), &["validate", "Cargo.toml"]);
    assert_eq!(named.code, 2, "{}", named.stdout);
}

/// A workflow whose `steps` key is misspelled (`stpes:`, TOML's `[[step]]`), or that has a `name` and only
/// workflow keys, is checked in a directory rather than skipped as "not a workflow" (review, item 1).
#[test]
fn validate_of_a_directory_checks_a_workflow_with_a_misspelled_steps_key() {
    let dir = TempDir::new().expect("tempdir");
    write(
        dir.path(),
        "typo.yaml",
        "name: typo\nstpes:\n  - { id: a, tool: echo, with: { text: hi } }\n",
    );
    write(
        dir.path(),
        "typo.toml",
        "name = \"typo\"\n\n[[step]]\nid = \"a\"\ntool = \"echo\"\n",
    );
    write(
        dir.path(),
        "nosteps.yaml",
        "name: nosteps\ninputs:\n  x: { type: string }\n",
    );
    let out = archon(dir.path(), &["validate", "."]);
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    // The headline of each diagnostic, and the summary line.
    let lines: Vec<&str> = out.stdout.lines().collect();
    let mut headlines: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("error["))
        .collect();
    headlines.extend(lines.last());
    insta::assert_snapshot!(headlines.join("\n"), @r"
    error[archon::missing_key]: a workflow is missing the required key `steps`
    error[archon::missing_key]: a workflow is missing the required key `steps`
    error[archon::unknown_key]: unknown key `step` in a workflow
    error[archon::missing_key]: a workflow is missing the required key `steps`
    error[archon::unknown_key]: unknown key `stpes` in a workflow
    3 of 3 files invalid: 5 errors
    ");
}

/// `validate DIR` never calls zero files valid: a directory without a workflow is an error naming the
/// skip rule (review, item 1).
#[test]
fn validate_of_a_directory_without_workflows_says_none_was_found() {
    let dir = TempDir::new().expect("tempdir");
    write(
        dir.path(),
        "ci.yaml",
        "on: push\njobs:\n  test: { runs-on: ubuntu-latest }\n",
    );
    let out = archon(dir.path(), &["validate", "."]);
    assert_eq!((out.code, out.stdout.as_str()), (2, ""));
    insta::assert_snapshot!(out.stderr, @r"
    error: no workflow files found in `.`
      hint: a `.yaml`, `.yml` or `.toml` file whose top level has no `steps` key is skipped (1 here); name a file to check it anyway
    ");
    let empty = TempDir::new().expect("tempdir");
    let out = archon(empty.path(), &["validate", "."]);
    assert_eq!(out.code, 2, "{}", out.stderr);
}

/// The template traps of issue 15, item 5 each get a hint that says what to write.
#[test]
fn template_traps_say_what_to_write() {
    let dir = TempDir::new().expect("tempdir");
    let hints = |spec: &str| -> Vec<String> {
        std::fs::write(dir.path().join("t.yaml"), spec).expect("write");
        archon(dir.path(), &["validate", "t.yaml"])
            .stdout
            .lines()
            .filter(|l| l.contains("hint:"))
            .map(|l| l.trim().to_owned())
            .collect()
    };
    assert_eq!(
        hints(
            "name: t\nsteps:\n  - { id: a, tool: shell, with: { command: \"X=abc; echo ${#X}\" } }\n"
        ),
        [
            "= hint: `{#` starts a template comment: to write it as text (such as `${#VAR}` in a shell command), wrap the text in `{% raw %}...{% endraw %}`"
        ]
    );
    assert_eq!(
        hints("name: t\nsteps:\n  - id: a\n    tool: echo\n    with: { text: {{ run.id }} }\n"),
        ["= hint: a value that starts with a template is quoted in YAML: `text: \"{{ x }}\"`"]
    );
    assert_eq!(
        hints(
            "name: t\ninputs:\n  x: { type: integer, default: 1 }\nsteps:\n  - { id: a, tool: echo, with: { text: hi }, if: \"${{ inputs.x == 1 }}\" }\n"
        ),
        ["= hint: write `inputs.x == 1`"]
    );
}
