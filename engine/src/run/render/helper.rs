//! Templates that are not plain (`super::plain`) render in a helper process: the `archon` executable run
//! again as `archon __render` ([`serve`]), under [`LIMITS`] and on a thread with a stack of its own, so
//! that a template doubling a string in a loop, or nesting a list 100,000 deep, ends that process (an
//! allocation refused, a stack overflow) and fails the render with a message, never archon itself.
//!
//! The request carries the template and its context: the run's inputs and environment, the results of the
//! step's dependencies (the scheduler gives a step no others) and its own variables. (minijinja's list of a
//! template's undeclared variables would let it send less, but it misses those read through a slice.) The
//! answer is `ok` and the value as JSON, or `error` and the message.

use minijinja::Value;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::{RenderError, Renderer};
use crate::process::HelperLimits;

/// The hidden subcommand of the `archon` executable that renders one template ([`serve`]).
pub const HELPER_COMMAND: &str = "__render";

/// What a template's process may use: the memory budget of one render (documented in docs/run.md),
/// and CPU time that fuel alone cannot bound (one operation on a large string).
pub const LIMITS: HelperLimits = HelperLimits {
    memory_bytes: 256 << 20,
    cpu_seconds: 30,
};

/// The stack of the thread that renders, on top of [`LIMITS`]: deep enough to drop the deepest list
/// a template's fuel lets it build (about 200,000 levels), so that such a list ends with the depth
/// check's message; deeper recursion ends the process ("recursed too deeply").
const STACK_BYTES: usize = 128 << 20;

/// Most bytes of answer read back: a rendered text at the output limit, escaped as JSON.
pub(super) const MAX_ANSWER_BYTES: usize = 6 * super::limits::MAX_OUTPUT_BYTES + 64;

/// What is rendered.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Mode {
    /// A template, rendered to text.
    Template,
    /// An expression, evaluated to a value.
    Expression,
    /// An expression, evaluated to its truth.
    Condition,
}

impl Mode {
    pub(super) fn what(self) -> &'static str {
        match self {
            Mode::Template => "template",
            Mode::Expression => "expression",
            Mode::Condition => "condition",
        }
    }
}

/// One render, as sent to the helper.
#[derive(Serialize)]
pub(super) struct Request<'a> {
    pub mode: Mode,
    pub text: &'a str,
    pub context: &'a Value,
}

#[derive(Deserialize)]
struct Received {
    mode: Mode,
    text: String,
    context: Value,
}

/// The helper's side (`archon __render`): limits this process, renders the request on a thread of its
/// own and returns the answer to write to standard output.
pub fn serve(request: &[u8]) -> String {
    HelperLimits {
        memory_bytes: LIMITS.memory_bytes + STACK_BYTES as u64,
        ..LIMITS
    }
    .apply();
    let request: Received = match serde_json::from_slice(request) {
        Ok(request) => request,
        Err(e) => return format!("error\ncannot read the data the template reads: {e}"),
    };
    let rendered = std::thread::Builder::new()
        .name("render".into())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            let renderer = Renderer::default();
            let (text, ctx) = (request.text.as_str(), &request.context);
            let answer = match request.mode {
                Mode::Template => renderer.template_here(text, ctx),
                Mode::Expression => renderer.expression_here(text, ctx),
                Mode::Condition => renderer.condition_here(text, ctx).map(Json::Bool),
            };
            answer.map(|json| json.to_string())
        })
        .map_err(|e| RenderError {
            message: format!("cannot start the render: {e}"),
        })
        .and_then(|thread| {
            thread.join().map_err(|_| RenderError {
                message: "the render panicked".to_owned(),
            })?
        });
    match rendered {
        Ok(json) => format!("ok\n{json}"),
        Err(e) => format!("error\n{}", e.message),
    }
}
