//! Where a run's secret values come from: the environment variable of the same name, else a `.env` file
//! beside the spec that declares the secret. Only declared names are read from the file; nothing else in
//! it reaches the run.
//!
//! The `.env` format: `NAME=value` lines, with blank lines and `#` comments; an optional `export ` before the
//! name; spaces around the name and the `=`; values unquoted (trimmed, a ` #` starts a comment), in single
//! quotes (taken literally) or in double quotes (`\n`, `\r`, `\t`, `\"`, `\\` and `\$` escapes); quoted
//! values may span lines. `${VAR}` is not expanded. A later line for the same name wins.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value as Json};

/// The file read beside a spec.
pub const FILE_NAME: &str = ".env";
/// Largest `.env` file read.
const MAX_BYTES: u64 = 1024 * 1024;

/// A line of a `.env` file that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct DotenvError {
    pub line: usize,
    pub message: String,
}

/// The value of each secret in `names`: from `env` when it has one, else from the `.env` file in `dir`
/// (read only when some secret is missing from `env`). The error names the secret or the file's problem.
pub fn values<'a>(
    names: impl IntoIterator<Item = &'a str>,
    env: &BTreeMap<String, String>,
    dir: &Path,
) -> Result<Map<String, Json>, String> {
    let path = dir.join(FILE_NAME);
    // Absolute in messages, so that the user sees which file was meant.
    let path = std::path::absolute(&path).unwrap_or(path);
    let mut file: Option<BTreeMap<String, String>> = None;
    let mut values = Map::new();
    for name in names {
        let value = match env.get(name) {
            Some(value) => value.clone(),
            None => {
                if file.is_none() {
                    file = Some(read(&path)?);
                }
                file.as_ref()
                    .and_then(|f| f.get(name))
                    .cloned()
                    .ok_or_else(|| {
                        format!(
                            "secret `{name}` is not set: export it as an environment variable or add it to `{}`",
                            path.display()
                        )
                    })?
            }
        };
        values.insert(name.to_owned(), Json::String(value));
    }
    Ok(values)
}

/// The variables of the `.env` file at `path`; none when there is no such file.
pub fn read(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(unreadable(path, &e)),
    };
    // A FIFO would block the run and a device would never end: only a regular file is read, and never
    // more than the limit, whatever its size says.
    if !metadata.is_file() {
        return Err(format!("`{}` is not a regular file", path.display()));
    }
    if metadata.len() > MAX_BYTES {
        return Err(format!(
            "`{}` is larger than {MAX_BYTES} bytes",
            path.display()
        ));
    }
    let mut text = String::new();
    {
        use std::io::Read as _;
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_BYTES + 1).read_to_string(&mut text))
            .map_err(|e| unreadable(path, &e))?;
    }
    if text.len() as u64 > MAX_BYTES {
        return Err(format!(
            "`{}` is larger than {MAX_BYTES} bytes",
            path.display()
        ));
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    // The message names the line, never its text: it may hold a value.
    parse(text).map_err(|e| format!("`{}` {e}", path.display()))
}

fn unreadable(path: &Path, err: &std::io::Error) -> String {
    format!(
        "cannot read `{}`: {}",
        path.display(),
        err.to_string().to_lowercase()
    )
}

/// Parses the text of a `.env` file.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, DotenvError> {
    let mut vars = BTreeMap::new();
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    while let Some((number, line)) = lines.next() {
        let error = |message: &str| DotenvError {
            line: number,
            message: message.to_owned(),
        };
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line
            .strip_prefix("export")
            .filter(|rest| rest.starts_with([' ', '\t']))
            .map_or(line, str::trim_start);
        let Some((name, rest)) = line.split_once('=') else {
            return Err(error("expected `NAME=value`"));
        };
        let name = name.trim();
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(error(
                "a name is letters, digits and `_`, not starting with a digit",
            ));
        }
        let rest = rest.trim_start();
        let value = match rest.chars().next() {
            Some(quote @ ('"' | '\'')) => {
                // The value runs to the closing quote, over as many lines as it takes.
                let mut raw = rest[1..].to_owned();
                let (value, after) = loop {
                    if let Some(found) = closing(&raw, quote) {
                        break found;
                    }
                    match lines.next() {
                        Some((_, next)) => {
                            raw.push('\n');
                            raw.push_str(next);
                        }
                        None => return Err(error("the quoted value is not closed")),
                    }
                };
                let after = after.trim_start();
                if !after.is_empty() && !after.starts_with('#') {
                    return Err(error("unexpected text after the closing quote"));
                }
                value
            }
            _ => {
                // An unquoted value ends at a `#` that starts it or follows a space.
                let end = rest
                    .char_indices()
                    .find(|&(i, c)| c == '#' && (i == 0 || rest[..i].ends_with([' ', '\t'])))
                    .map_or(rest.len(), |(i, _)| i);
                rest[..end].trim_end().to_owned()
            }
        };
        vars.insert(name.to_owned(), value);
    }
    Ok(vars)
}

/// The quoted value at the start of `text` (after its opening quote) and what follows its closing quote,
/// or `None` when the quote is not closed. Single quotes take everything literally; double quotes read
/// escapes.
fn closing(text: &str, quote: char) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        if c == quote {
            return Some((value, &text[i + 1..]));
        }
        if c == '\\' && quote == '"' {
            let (_, next) = chars.next()?;
            match next {
                'n' => value.push('\n'),
                'r' => value.push('\r'),
                't' => value.push('\t'),
                '"' | '\\' | '$' => value.push(next),
                other => {
                    value.push('\\');
                    value.push(other);
                }
            }
        } else {
            value.push(c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dotenv_format() {
        let text = r#"
# a comment
export API_TOKEN=abc123   # a comment after a value
PLAIN = spaced value
HASH=a#b
SINGLE='literal \n $HOME # not a comment'
DOUBLE="line one\nline \"two\"" # comment
EMPTY=
MULTI="-----BEGIN KEY-----
abc
-----END KEY-----"
exported_name=1
PLAIN=later wins
"#;
        let vars = parse(text).expect("parses");
        let expected: BTreeMap<String, String> = [
            ("API_TOKEN", "abc123"),
            ("PLAIN", "later wins"),
            ("HASH", "a#b"),
            ("SINGLE", "literal \\n $HOME # not a comment"),
            ("DOUBLE", "line one\nline \"two\""),
            ("EMPTY", ""),
            ("MULTI", "-----BEGIN KEY-----\nabc\n-----END KEY-----"),
            ("exported_name", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(vars, expected);
    }

    #[test]
    fn an_empty_value_with_a_comment_and_a_byte_order_mark() {
        let vars = parse("EMPTY= # none\nSET=x # note\n").expect("parses");
        assert_eq!(vars["EMPTY"], "");
        assert_eq!(vars["SET"], "x");
        let dir = std::env::temp_dir().join(format!("archon-dotenv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(".env");
        std::fs::write(&path, "\u{feff}TOKEN=abc\n").expect("write");
        assert_eq!(read(&path).expect("reads")["TOKEN"], "abc");
        assert!(
            read(&dir)
                .expect_err("a directory is refused")
                .ends_with("is not a regular file")
        );
        std::fs::remove_dir_all(&dir).expect("clean");
    }

    #[test]
    fn problems_name_the_line_but_not_its_text() {
        for (text, line, message) in [
            ("A=1\nno equals sign\n", 2, "expected `NAME=value`"),
            (
                "1ABC=x",
                1,
                "a name is letters, digits and `_`, not starting with a digit",
            ),
            (
                "\nA=\"open\nstill open\n",
                2,
                "the quoted value is not closed",
            ),
            ("A='x' y", 1, "unexpected text after the closing quote"),
        ] {
            assert_eq!(
                parse(text),
                Err(DotenvError {
                    line,
                    message: message.to_owned()
                }),
                "{text}"
            );
        }
    }

    #[test]
    fn the_environment_wins_and_only_declared_names_are_read() {
        let dir = std::env::temp_dir().join(format!("archon-dotenv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join(FILE_NAME), "A=from-file\nB=from-file\nC=other\n").expect("write");
        let env = BTreeMap::from([("A".to_owned(), "from-env".to_owned())]);
        let values = values(["A", "B"], &env, &dir).expect("values");
        assert_eq!(
            values,
            serde_json::json!({ "A": "from-env", "B": "from-file" })
                .as_object()
                .cloned()
                .expect("object")
        );
        let missing = super::values(["D"], &env, &dir).expect_err("missing");
        assert!(
            missing.starts_with(
                "secret `D` is not set: export it as an environment variable or add it to `"
            ),
            "{missing}"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
