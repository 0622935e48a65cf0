//! The `json` tool: jq filters, evaluated by jaq (a jq implementation in Rust) in a helper process.
//!
//! A filter comes from a spec, a model or text injected into a tool output, and jaq has no limits of its
//! own: `last(range(1e12))` runs for hours and `def f: [f]; f` recurses until the stack overflows, which
//! aborts the process. So a filter never runs on the scheduler's thread or in archon's process: the
//! `archon` executable runs it again as `archon __jq` ([`serve`]), under its own memory, CPU and stack
//! limits, and the step's timeout or Ctrl-C kills that process ([`query`]).

use std::path::Path;

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data, unwrap_valr};
use jaq_json::Val;
use serde_json::Value as Json;

use super::ToolError;
use crate::process;

/// The hidden subcommand of the `archon` executable that evaluates one filter ([`serve`]).
pub const HELPER_COMMAND: &str = "__jq";

/// Most results one filter may produce.
const MAX_RESULTS: usize = 100_000;

/// What a filter's process may use: 1 GiB of memory, and 60 s of CPU time whatever the step's timeout (a
/// step may have none).
pub const LIMITS: process::HelperLimits = process::HelperLimits {
    memory_bytes: 1 << 30,
    cpu_seconds: 60,
};

/// The stack of the thread evaluating a filter: far more than any real filter needs, so that running
/// out means runaway recursion.
const STACK_BYTES: usize = 64 << 20;

/// Most bytes of results read back from the helper.
const MAX_OUTPUT_BYTES: usize = 64 << 20;

/// Runs `filter` on `input`: a plain path ([`is_path`]) here, anything else in the helper process
/// `helper` (the `archon` executable). One result is returned as is; zero or several come back as a list.
///
/// An input or a result larger than [`IN_PLACE`] is written, evaluated or read on a blocking thread, so
/// that a large JSON value does not hold the run's other steps, timeouts and Ctrl-C.
pub async fn query(helper: Option<&Path>, input: Json, filter: &str) -> Result<Json, ToolError> {
    let large = larger_than(&input, IN_PLACE);
    if is_path(filter) {
        let filter = filter.to_owned();
        return off_thread(large, move || {
            let results = evaluate(input.to_string().as_bytes(), &filter)?;
            Ok(collect(results.iter().map(String::as_str)))
        })
        .await
        .map_err(ToolError::new);
    }
    let Some(helper) = helper else {
        return Err(ToolError::new(
            "cannot run a jq filter: no helper executable is configured\n  hint: set `RunOptions::helper` to the `archon` executable",
        ));
    };
    let request = {
        let filter = filter.to_owned();
        off_thread(large, move || {
            let mut request = serde_json::to_string(&filter).unwrap_or_default();
            request.push('\n');
            request.push_str(&input.to_string());
            Ok(request)
        })
        .await
        .map_err(ToolError::new)?
    };
    let output = process::run_helper(
        helper,
        &[HELPER_COMMAND],
        request.into_bytes(),
        MAX_OUTPUT_BYTES,
    )
    .await
    .map_err(|e| ToolError::new(e.to_string()))?;
    if !output.status.success() {
        let why = LIMITS.failure(&output);
        return Err(ToolError::new(format!("jq filter `{filter}` {why}")));
    }
    if output.stdout_truncated {
        return Err(ToolError::new(format!(
            "jq filter `{filter}` produced more than {} MiB of results",
            MAX_OUTPUT_BYTES >> 20
        )));
    }
    let large = output.stdout.len() > IN_PLACE;
    let helper = helper.display().to_string();
    off_thread(large, move || {
        let text = String::from_utf8_lossy(&output.stdout);
        let (kind, rest) = text.split_once('\n').unwrap_or((&text, ""));
        match kind {
            "ok" => Ok(collect(rest.lines())),
            "error" => Err(rest.trim_end_matches('\n').to_owned()),
            _ => Err(format!(
                "the jq helper `{helper}` answered something else than results"
            )),
        }
    })
    .await
    .map_err(ToolError::new)
}

/// JSON up to this size is written and read on the run's thread; larger, on a blocking thread.
pub const IN_PLACE: usize = 64 * 1024;

/// Whether `value` as JSON text would be longer than `most` bytes, found without recursion and without
/// writing it (an estimate: string lengths, numbers and punctuation), stopping once it is.
pub fn larger_than(value: &Json, most: usize) -> bool {
    let mut size = 0usize;
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        size += match value {
            Json::Null | Json::Bool(_) => 5,
            Json::Number(_) => 20,
            Json::String(s) => s.len() + 2,
            Json::Array(items) => {
                pending.extend(items);
                items.len() + 2
            }
            Json::Object(entries) => {
                pending.extend(entries.values());
                entries.keys().map(|k| k.len() + 4).sum::<usize>() + 2
            }
        };
        if size > most {
            return true;
        }
    }
    false
}

/// Runs `work` here, or on a blocking thread when it is `large`.
async fn off_thread<T: Send + 'static>(
    large: bool,
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    if !large {
        return work();
    }
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|_| Err("the JSON could not be processed".to_owned()))
}

/// Results as JSON text made into one value: one result as is, zero or several as a list.
fn collect<'a>(results: impl Iterator<Item = &'a str>) -> Json {
    let mut results: Vec<Json> = results
        .map(|text| serde_json::from_str(text).unwrap_or_else(|_| Json::String(text.to_owned())))
        .collect();
    match results.len() {
        1 => results.remove(0),
        _ => Json::Array(results),
    }
}

/// Whether `filter` is a plain path (`.`, `.a.b`, `.[0]`, `.["key"]`, `.items[]`, each step optionally
/// `?`): its cost is bounded by the input's size and it cannot recurse, so it is evaluated in archon's
/// own process, sparing the most common filters a helper process (about a millisecond each).
pub fn is_path(filter: &str) -> bool {
    static PATH: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let path = PATH.get_or_init(|| {
        regex::Regex::new(
            r#"^\.(?:[A-Za-z_][A-Za-z0-9_]*\??)?(?:(?:\.[A-Za-z_][A-Za-z0-9_]*|\.?\[(?:-?[0-9]{1,9}|"[^"\\]*")?\])\??)*$"#,
        )
        .expect("the path pattern is valid")
    });
    filter.len() <= 256 && path.is_match(filter)
}

/// The helper's side (`archon __jq`): limits this process, evaluates the filter on the first line of
/// `request` (a JSON string) against the input after it, and returns the answer to write to standard
/// output: `ok` and one result per line, or `error` and the message.
///
/// A filter that recurses without end, allocates without end or spins ends this process (a stack
/// overflow, an allocation failure or `SIGXCPU`), which the caller reports ([`query`]).
pub fn serve(request: &[u8]) -> String {
    LIMITS.apply();
    let (filter, input) = match request.iter().position(|b| *b == b'\n') {
        Some(at) => (&request[..at], &request[at + 1..]),
        None => (request, &b""[..]),
    };
    let Ok(filter) = serde_json::from_slice::<String>(filter) else {
        return "error\nthe jq helper received a malformed request".to_owned();
    };
    let input = input.to_vec();
    let evaluated = std::thread::Builder::new()
        .name("jq".into())
        .stack_size(STACK_BYTES)
        .spawn(move || evaluate(&input, &filter))
        .map_err(|e| format!("cannot start the jq evaluation: {e}"))
        .and_then(|thread| {
            thread
                .join()
                .map_err(|_| "the jq evaluation panicked".to_owned())?
        });
    match evaluated {
        Ok(results) => {
            let mut answer = String::from("ok\n");
            for result in results {
                answer.push_str(&result);
                answer.push('\n');
            }
            answer
        }
        Err(message) => format!("error\n{message}"),
    }
}

/// Runs `filter` on the JSON text `input`; each result as compact JSON text.
fn evaluate(input: &[u8], filter: &str) -> Result<Vec<String>, String> {
    let program = File {
        code: filter,
        path: (),
    };
    let defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs());
    let funs = jaq_core::funs()
        .chain(jaq_std::funs())
        .chain(jaq_json::funs());
    let loader = Loader::new(defs);
    let arena = Arena::default();
    let invalid = || format!("invalid jq filter `{filter}`");
    let modules = loader.load(&arena, program).map_err(|_| invalid())?;
    let compiled = Compiler::default()
        .with_funs(funs)
        .compile(modules)
        .map_err(|_| invalid())?;
    let input = jaq_json::read::parse_single(input)
        .map_err(|e| format!("cannot read the input of `json`: {e}"))?;
    let ctx = Ctx::<data::JustLut<Val>>::new(&compiled.lut, Vars::new([]));
    let mut results = Vec::new();
    for output in compiled.id.run((ctx, input)).map(unwrap_valr) {
        let value = output.map_err(|e| format!("jq filter `{filter}` failed: {e}"))?;
        if results.len() == MAX_RESULTS {
            return Err(format!(
                "jq filter `{filter}` produced more than {MAX_RESULTS} results"
            ));
        }
        results.push(value.to_string());
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::{IN_PLACE, Json, is_path, larger_than, query};

    #[test]
    fn only_plain_paths_are_evaluated_in_place() {
        for path in [
            ".",
            ".a",
            ".a.b_2[0]",
            ".[0]",
            ".[-1]?",
            ".items[].tag",
            ".[\"a key\"].x?",
            ".a[][]",
        ] {
            assert!(is_path(path), "{path}");
        }
        for filter in [
            "last(range(1e12))",
            "def f: [f]; f",
            "..",
            ".a | .b",
            ".a[1:2]",
            "[.a]",
            ".[\"a\\\"\"]",
            "",
            ".a.",
        ] {
            assert!(!is_path(filter), "{filter}");
        }
        assert!(!is_path(&".a".repeat(200)));
    }

    /// A large input is written and queried on a blocking thread: done in place, on the run's one thread,
    /// no other task (another step, a timeout, Ctrl-C) could run until it ended.
    #[tokio::test]
    async fn a_large_input_is_queried_while_the_run_goes_on() {
        let input = serde_json::json!({ "items": vec!["x".repeat(1000); 20_000] });
        let (first, during) =
            crate::testing::others_ran_during(query(None, input.clone(), ".items[0]")).await;
        let first = first.expect("queried");
        assert_eq!(first, Json::String("x".repeat(1000)));
        assert!(during > 0, "no other task ran while the input was queried");
        assert!(larger_than(&input, IN_PLACE));
        assert!(!larger_than(
            &serde_json::json!({ "a": [1, 2, "three"] }),
            IN_PLACE
        ));
    }
}
