//! Hostile input: alias bombs, deep nesting, huge files, garbage. Every case ends in a clean diagnostic,
//! never a panic, a stack overflow or runaway memory. (Time and memory figures are measured by
//! `scripts/bench-validate.sh`; these tests check behaviour with generous bounds.)

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use archon_engine::validate_source;
use tempfile::TempDir;

/// Runs `archon validate --format json` on `text` written to `name`; returns exit code, codes and time.
fn validate_with_binary(name: &str, text: &[u8]) -> (i32, Vec<String>, Duration) {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["validate", "--format", "json"])
        .arg(&path)
        .output()
        .expect("archon runs");
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "{name}: output is not JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let codes = report["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .map(|d| d["code"].as_str().unwrap_or_default().to_owned())
        .collect();
    (output.status.code().unwrap_or(-1), codes, elapsed)
}

/// The code and message of each diagnostic of `text`, validated in this process.
fn codes_and_messages(name: &str, text: String) -> Vec<(&'static str, String)> {
    validate_source(Path::new(name), text)
        .diagnostics
        .into_iter()
        .map(|d| (d.code, d.message))
        .collect()
}

fn codes_in_process(name: &str, text: String) -> Vec<&'static str> {
    validate_source(Path::new(name), text)
        .diagnostics
        .iter()
        .map(|d| d.code)
        .collect()
}

/// The classic "billion laughs": each level repeats the previous one ten times, 30 levels deep.
fn alias_bomb(levels: usize) -> String {
    let mut text =
        String::from("name: laughs\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..levels {
        let refs = vec![format!("*l{}", i - 1); 10].join(", ");
        text.push_str(&format!("l{i}: &l{i} [{refs}]\n"));
    }
    text.push_str("steps:\n  - id: a\n    tool: echo\n    with: { x: *l29 }\n");
    text
}

#[test]
fn alias_bomb_is_rejected_quickly() {
    let (code, codes, elapsed) = validate_with_binary("bomb.yaml", alias_bomb(30).as_bytes());
    assert_eq!(code, 2);
    assert_eq!(codes, ["archon::alias_budget"]);
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert_eq!(
        codes_in_process("bomb.yaml", alias_bomb(30)),
        ["archon::alias_budget"]
    );
}

#[test]
fn hundred_thousand_nested_brackets_give_a_clean_error() {
    let yaml = format!(
        "name: deep\nsteps: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let toml = format!(
        "name = \"deep\"\nx = {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    for (name, text) in [("deep.yaml", yaml), ("deep.toml", toml)] {
        let (code, codes, _) = validate_with_binary(name, text.as_bytes());
        assert_eq!(
            (code, codes),
            (2, vec!["archon::nesting_too_deep".to_owned()]),
            "{name}"
        );
        assert_eq!(
            codes_in_process(name, text),
            ["archon::nesting_too_deep"],
            "{name}"
        );
    }
}

#[test]
fn deep_block_nesting_gives_a_clean_error() {
    // Block sequences nest two characters at a time on one line; mappings one indentation level per line.
    let sequences = format!(
        "name: deep\nsteps:\n  - id: a\n    tool: echo\n    with: {{ x: 1 }}\nextra:\n  {}x\n",
        "- ".repeat(100_000)
    );
    let mut mappings = String::from("name: deep\nsteps: []\nextra:\n");
    for depth in 1..200 {
        mappings.push_str(&" ".repeat(depth));
        mappings.push_str("a:\n");
    }
    for (name, text) in [("seq.yaml", sequences), ("map.yaml", mappings)] {
        let (code, codes, _) = validate_with_binary(name, text.as_bytes());
        assert_eq!(code, 2, "{name}: {codes:?}");
        assert!(
            codes.contains(&"archon::nesting_too_deep".to_owned()),
            "{name}: {codes:?}"
        );
    }
}

#[test]
fn ten_megabyte_file_gives_a_size_error() {
    let mut text = String::from("name: huge\nsteps:\n  - id: a\n    tool: echo\n    with: { x: \"");
    text.push_str(&"x".repeat(10 * 1024 * 1024));
    text.push_str("\" }\n");
    let (code, codes, _) = validate_with_binary("huge.yaml", text.as_bytes());
    assert_eq!(
        (code, codes),
        (2, vec!["archon::file_too_large".to_owned()])
    );
    assert_eq!(
        codes_in_process("huge.yaml", text),
        ["archon::file_too_large"]
    );
}

#[test]
fn too_many_steps_is_reported_before_anything_else() {
    let mut text = String::from("name: many\nsteps:\n");
    for i in 0..25_000 {
        text.push_str(&format!("  - {{ id: s{i}, tool: echo }}\n"));
    }
    let (code, codes, _) = validate_with_binary("many.yaml", text.as_bytes());
    assert_eq!(
        (code, codes),
        (2, vec!["archon::too_many_steps".to_owned()])
    );
}

#[test]
fn unreadable_and_odd_files_give_diagnostics() {
    let cases: [(&str, &[u8], &str); 6] = [
        (
            "latin1.yaml",
            b"name: caf\xe9\nsteps: []\n",
            "archon::unreadable_file",
        ),
        ("empty.yaml", b"", "archon::missing_key"),
        ("scalar.yaml", b"just a string\n", "archon::wrong_type"),
        (
            "list.yaml",
            b"- id: a\n  tool: echo\n",
            "archon::wrong_type",
        ),
        (
            "garbage.yaml",
            b"\x01\x02\x03: [\x04 {{{ \x7f",
            "archon::yaml_syntax",
        ),
        ("garbage.toml", b"= = = [[[ \"\n", "archon::toml_syntax"),
    ];
    for (name, bytes, expected) in cases {
        let (code, codes, _) = validate_with_binary(name, bytes);
        assert_eq!(code, 2, "{name}: {codes:?}");
        assert!(
            codes.iter().any(|c| c == expected),
            "{name}: expected {expected}, got {codes:?}"
        );
    }
}

#[test]
fn a_missing_file_is_unreadable() {
    let dir = TempDir::new().expect("tempdir");
    let validation = archon_engine::validate_file(&dir.path().join("absent.yaml"));
    let codes: Vec<&str> = validation.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, ["archon::unreadable_file"]);
}

/// The alias budget stops bombs, not ordinary reuse: 500 steps sharing anchored settings validate.
#[test]
fn ordinary_anchor_reuse_is_within_the_budget() {
    let mut text = String::from("name: shared\nsteps:\n");
    for i in 0..500 {
        if i == 0 {
            text.push_str("  - id: s0\n    tool: echo\n    retry: &retry { attempts: 3, backoff: exponential, delay: 1s, on: [error, timeout] }\n");
        } else {
            text.push_str(&format!(
                "  - id: s{i}\n    tool: echo\n    retry: *retry\n"
            ));
        }
    }
    let validation = validate_source(Path::new("shared.yaml"), text);
    assert!(
        validation.diagnostics.is_empty(),
        "{:?}",
        validation.diagnostics
    );
}

/// Regression: a template syntax error next to a multi-byte character made the caret position fall inside
/// the character and panicked (found by mutating fixtures).
#[test]
fn template_errors_next_to_multibyte_characters_do_not_panic() {
    let text = "name: t\nsteps:\n  - id: a\n    tool: echo\n    with: { x: \"{{ row.fiéle }}: {{ 'a' if x == 'é' els }}\" }\n";
    let codes = codes_in_process("t.yaml", text.to_owned());
    assert_eq!(codes, ["archon::template_syntax"]);
    let block = "name: t\nsteps:\n  - id: a\n    tool: echo\n    with:\n      x: |\n        {% for r in x %}{{ r.fiéle }}: {{ 'é' if r els 'b' }}\n        {% endfor %}\n";
    assert_eq!(
        codes_in_process("t.yaml", block.to_owned()),
        ["archon::template_syntax"]
    );
}

/// A TOML spec past the step limit is refused from its text, before the TOML parser builds a document of
/// several hundred bytes a value (100,000 steps used 452 MB before being refused); one past its size
/// limit is refused before anything is read of it.
#[test]
fn a_toml_spec_with_too_many_steps_is_refused_before_it_is_parsed() {
    let mut text = String::from("name = \"many\"\n");
    for _ in 0..25_000 {
        text.push_str("[[steps]]\n");
    }
    let diagnostics = validate_source(Path::new("many.toml"), text.clone()).diagnostics;
    let shown: Vec<(&str, String, usize)> = diagnostics
        .iter()
        .map(|d| (d.code, d.message.clone(), d.span.start as usize))
        .collect();
    let at = text
        .match_indices("[[steps]]")
        .nth(20_000)
        .map(|(i, _)| i)
        .expect("a 20,001st step");
    assert_eq!(
        shown,
        [(
            "archon::too_many_steps",
            "workflow has more than 20000 steps, the limit".to_owned(),
            at
        )]
    );
    let large = format!("name = \"many\"\nsteps = []\n{}", "\n".repeat(512 * 1024));
    assert_eq!(
        codes_and_messages("large.toml", large),
        [(
            "archon::file_too_large",
            "TOML spec file is 524313 bytes, more than the limit of 524288 bytes for TOML"
                .to_owned()
        )]
    );
}

/// A million-element YAML list is refused at the value limit while it is read, and so is a TOML list of
/// more separators than that limit, from its text. (Eight megabytes of empty TOML tables, 675 MB before,
/// are now refused by the TOML size limit.)
#[test]
fn too_many_values_are_refused_in_both_formats() {
    let tables = format!("name = \"b\"\nx = [{}]\n", ",".repeat(510_000));
    let list = format!("name: b\nx: [{}]\n", vec!["1"; 1_000_000].join(","));
    for (name, text) in [("tables.toml", tables), ("list.yaml", list)] {
        assert_eq!(
            codes_and_messages(name, text),
            [(
                "archon::file_too_large",
                "spec file holds more than 500000 values, the limit".to_owned()
            )],
            "{name}"
        );
    }
}

/// A file of many problems of one kind (240,000 unknown keys took 266 MB to validate, and as many
/// diagnostics in JSON 550 MB) shows the first thousand of each pass over it and says how many more there
/// are; what later passes find is still reported.
#[test]
fn a_file_of_many_problems_shows_a_thousand_and_counts_the_rest() {
    let unknown: String = (0..2_500).map(|i| format!("x{i}: 1\n")).collect();
    let duplicated = "a: 1\n".repeat(1_500);
    let text = format!("name: many\nsteps: []\n{unknown}{duplicated}");
    let found = codes_and_messages("many.yaml", text);
    let counted = |code: &str| found.iter().filter(|(c, _)| *c == code).count();
    // The parse keeps 1,000 duplicate keys of 1,499; the structure check, which reads what the parse
    // kept, 1,000 unknown keys of 2,501 (`a` once, the 2,500 others).
    assert_eq!(
        (
            counted("archon::duplicate_key"),
            counted("archon::unknown_key"),
            found.len()
        ),
        (1_000, 1_000, 2_003),
        "{:?}",
        &found[found.len() - 3..]
    );
    let summaries: Vec<_> = found
        .iter()
        .filter(|(code, _)| *code == "archon::too_many_problems")
        .map(|(_, message)| message.as_str())
        .collect();
    assert_eq!(
        summaries,
        [
            "499 more problems like those above are not shown",
            "1501 more problems like those above are not shown",
        ]
    );
    assert_eq!(
        found.last().map(|(c, _)| *c),
        Some("archon::empty_workflow")
    );
}

/// One template string of 550,000 tags (8 MB of `{{ inputs.x }}`) took 240 MB to validate, as many in a
/// loop 365 MB: minijinja holds the whole syntax tree. A template is refused past 10,000 tags, at the
/// first one past them; 10,000 are read.
#[test]
fn a_template_of_too_many_tags_is_refused_before_it_is_parsed() {
    let spec = |tags: usize| {
        format!(
            "name: t\ninputs:\n  x: {{ type: string }}\nsteps:\n  - id: a\n    tool: echo\n    with:\n      text: \"{{% for i in [1] %}}{}{{% endfor %}}\"\n",
            "{{ inputs.x }}".repeat(tags)
        )
    };
    assert_eq!(codes_and_messages("within.yaml", spec(9_998)), []);
    let text = spec(550_000);
    let at = text.find("{{ inputs.x }}").expect("a tag") + 9_999 * "{{ inputs.x }}".len() + 2;
    let found = validate_source(Path::new("many.yaml"), text).diagnostics;
    assert_eq!(
        found
            .iter()
            .map(|d| (d.code, d.message.as_str(), d.span.start as usize))
            .collect::<Vec<_>>(),
        [(
            "archon::template_syntax",
            "template has more than 10000 tags (`{{ }}` and `{% %}`)",
            at
        )]
    );
}

/// A template or expression chaining 100,000 operators (`x.a.a…`, `1+1+…`, `x[0][0]…`, `1|string|…`) made
/// minijinja overflow the stack and abort archon (exit 134), from a spec, from `resume` of its run and from
/// a plan a model wrote, which goes through the same validator. It is refused, named, before minijinja
/// reads it; a long flat list or a long string in a tag is not a chain.
#[test]
fn templates_that_chain_without_end_are_refused_not_fatal() {
    let chain = |link: &str| format!("x{}", link.repeat(100_000));
    let cases = [
        ("dots.yaml", format!("{{{{ {} }}}}", chain(".a"))),
        ("plus.yaml", format!("{{{{ 1{} }}}}", "+1".repeat(100_000))),
        ("index.yaml", format!("{{{{ {} }}}}", chain("[0]"))),
        (
            "filters.yaml",
            format!("{{{{ x{} }}}}", "|string".repeat(100_000)),
        ),
    ];
    for (name, template) in cases {
        let text = format!(
            "name: deep\ninputs:\n  x: {{ type: string, default: a }}\nsteps:\n  - id: a\n    tool: echo\n    with: {{ v: \"{template}\" }}\n"
        );
        let (code, codes, _) = validate_with_binary(name, text.as_bytes());
        assert_eq!(
            (code, codes),
            (2, vec!["archon::template_syntax".to_owned()]),
            "{name}"
        );
    }
    let condition = format!(
        "name: deep\nsteps:\n  - id: a\n    tool: echo\n    if: \"true{}\"\n",
        " and true".repeat(100_000)
    );
    assert_eq!(
        codes_and_messages("if.yaml", condition),
        [(
            "archon::expression_syntax",
            "expression chains more than 256 operators in one tag".to_owned()
        )]
    );
    let flat = format!(
        "name: flat\nsteps:\n  - id: a\n    tool: echo\n    with: {{ v: \"{{{{ [{}] | length }}}} {{{{ '{}' }}}}\" }}\n",
        vec!["1"; 5_000].join(", "),
        ".".repeat(5_000)
    );
    assert_eq!(codes_and_messages("flat.yaml", flat), []);
}
