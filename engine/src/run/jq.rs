//! The `json` tool: jq filters, evaluated by jaq (a jq implementation in Rust).

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data, unwrap_valr};
use jaq_json::Val;
use serde_json::Value as Json;

use super::tools::ToolError;

/// Most results one filter may produce.
const MAX_RESULTS: usize = 100_000;

/// Runs `filter` on `input`. One result is returned as is; zero or several come back as a list.
pub fn query(input: &Json, filter: &str) -> Result<Json, ToolError> {
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
    let invalid = || ToolError::new(format!("invalid jq filter `{filter}`"));
    let modules = loader.load(&arena, program).map_err(|_| invalid())?;
    let compiled = Compiler::default()
        .with_funs(funs)
        .compile(modules)
        .map_err(|_| invalid())?;
    let input = jaq_json::read::parse_single(input.to_string().as_bytes())
        .map_err(|e| ToolError::new(format!("cannot read the input of `json`: {e}")))?;
    let ctx = Ctx::<data::JustLut<Val>>::new(&compiled.lut, Vars::new([]));
    let mut results = Vec::new();
    for output in compiled.id.run((ctx, input)).map(unwrap_valr) {
        let value =
            output.map_err(|e| ToolError::new(format!("jq filter `{filter}` failed: {e}")))?;
        if results.len() == MAX_RESULTS {
            return Err(ToolError::new(format!(
                "jq filter `{filter}` produced more than {MAX_RESULTS} results"
            )));
        }
        let text = value.to_string();
        results.push(serde_json::from_str(&text).unwrap_or(Json::String(text)));
    }
    Ok(match results.len() {
        1 => results.remove(0),
        _ => Json::Array(results),
    })
}
