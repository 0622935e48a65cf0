//! The names models see. Providers accept tool names matching `^[A-Za-z0-9_-]{1,64}$`; MCP tools are
//! `<server>.<tool>` and a server may name its tools with any characters. A name that is already valid is
//! offered as it is; another has each dot written `__` and every other character outside the set written
//! `_`; one longer than 64 characters keeps its first 55 and ends with `_` and 8 hex digits of its digest,
//! so the same name always maps the same way. Two tools that would reach a model under one name are an
//! error, never a silent drop.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

/// Most characters of a name a provider accepts.
pub const MAX_LEN: usize = 64;

/// Whether providers accept `name` as it is.
pub fn accepted(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The name a model sees for tool `name`.
pub fn model_name(name: &str) -> String {
    if accepted(name) {
        return name.to_owned();
    }
    let mut escaped = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        match c {
            '.' => escaped.push_str("__"),
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => escaped.push(c),
            _ => escaped.push('_'),
        }
    }
    if escaped.is_empty() {
        escaped.push('_');
    }
    if escaped.len() <= MAX_LEN {
        return escaped;
    }
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}_{hex}", &escaped[..MAX_LEN - 9])
}

/// The names models see for `names`, in order, and the map back from each one that differs; or the error
/// naming two tools that would reach a model under one name.
pub fn model_names<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Result<(Vec<String>, HashMap<String, String>), String> {
    let mut offered = Vec::new();
    let mut owner: HashMap<String, &str> = HashMap::new();
    let mut back = HashMap::new();
    for name in names {
        let mapped = model_name(name);
        if let Some(first) = owner.insert(mapped.clone(), name) {
            return Err(format!(
                "tools `{first}` and `{name}` would both reach the model as `{mapped}`"
            ));
        }
        if mapped != name {
            back.insert(mapped.clone(), name.to_owned());
        }
        offered.push(mapped);
    }
    Ok((offered, back))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_are_kept_and_others_escaped() {
        assert_eq!(model_name("read_file"), "read_file");
        assert_eq!(model_name("github.list_issues"), "github__list_issues");
        assert_eq!(model_name("fs.read file/x"), "fs__read_file_x");
        assert_eq!(model_name("é"), "_");
    }

    #[test]
    fn long_names_are_shortened_stably_and_stay_apart() {
        let a = format!("server.{}", "a".repeat(80));
        let b = format!("server.{}b", "a".repeat(79));
        let (ma, mb) = (model_name(&a), model_name(&b));
        assert_eq!(ma.len(), MAX_LEN);
        assert!(accepted(&ma));
        assert_eq!(ma, model_name(&a));
        assert_ne!(ma, mb);
        assert_eq!(&ma[..MAX_LEN - 9], &mb[..MAX_LEN - 9]);
    }

    #[test]
    fn a_collision_is_an_error_naming_both_tools() {
        let error = model_names(["github__list", "github.list"]).unwrap_err();
        assert_eq!(
            error,
            "tools `github__list` and `github.list` would both reach the model as `github__list`"
        );
        let (offered, back) = model_names(["echo", "everything.echo"]).unwrap();
        assert_eq!(offered, ["echo", "everything__echo"]);
        assert_eq!(back["everything__echo"], "everything.echo");
    }
}
