//! Text mode, for models without native tool calling: the tools described in the system prompt, and the
//! `Action:` / `Final Answer:` lines the model writes read back (and repaired where weak models break them).
//! Also JSON in a final answer, wherever the model put it.

use serde_json::Value as Json;

use crate::llm::ToolSpec;

/// JSON in an answer: the whole text, or inside a fenced block, or the outermost object or list in prose.
pub(in crate::run::scheduler) fn parse_json(text: &str) -> Option<Json> {
    let trimmed = text.trim();
    if let Ok(value) = serde_json::from_str(trimmed) {
        return Some(value);
    }
    let unfenced = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|t| t.strip_suffix("```"))
        .map(str::trim);
    if let Some(value) = unfenced.and_then(|t| serde_json::from_str(t).ok()) {
        return Some(value);
    }
    for (open, close) in [('{', '}'), ('[', ']')] {
        if let (Some(start), Some(end)) = (trimmed.find(open), trimmed.rfind(close))
            && start < end
            && let Ok(value) = serde_json::from_str(&trimmed[start..=end])
        {
            return Some(value);
        }
    }
    None
}

/// An action a model offered native tools wrote as text instead: only when the answer is nothing but
/// (optional `Thought:` lines and) an `Action:` or `<tool_call>` line, naming one of the offered tools.
pub(super) fn written_action(
    text: &str,
    iteration: u32,
    tools: &[ToolSpec],
) -> Option<crate::llm::ToolCall> {
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("Thought:"))?;
    if !(first.starts_with("Action:") || first.starts_with("<tool_call>"))
        || text.contains("Final Answer:")
    {
        return None;
    }
    match read_text_action(text, iteration) {
        TextTurn::Action(call) if tools.iter().any(|t| t.name == call.name) => Some(call),
        _ => None,
    }
}

/// How to call tools in text mode, appended to the system prompt.
pub(super) fn text_mode_instructions(tools: &[ToolSpec]) -> String {
    let mut text = String::from(
        "\n\nYou can use these tools. To call one, write a line `Action:` followed by one JSON object \
         {\"tool\": name, \"arguments\": {...}} and stop; the result comes back as `Observation:`. You may \
         think first on a line starting `Thought:`. When you are done, write `Final Answer:` followed by the \
         answer.\n\nTools:",
    );
    text.push_str(&crate::run::scheduler::prompt::tool_lines(
        tools,
        "Arguments",
    ));
    text
}

/// What a text-mode turn says.
pub(super) enum TextTurn {
    Final(String),
    Action(crate::llm::ToolCall),
    /// Neither a readable action nor a final answer: what to tell the model.
    Unreadable(String),
}

/// Reads a text-mode turn: `Final Answer: ...`, or `Action: {json}` (also a `<tool_call>` block), with the
/// JSON repaired where weak models break it (code fences, trailing commas, single quotes).
pub(super) fn read_text_action(text: &str, iteration: u32) -> TextTurn {
    let action_at = text
        .find("Action:")
        .map(|i| i + "Action:".len())
        .or_else(|| text.find("<tool_call>").map(|i| i + "<tool_call>".len()));
    let final_at = text.find("Final Answer:");
    match (action_at, final_at) {
        (Some(a), Some(f)) if f < a => {
            TextTurn::Final(text[f + "Final Answer:".len()..].trim().to_owned())
        }
        (None, Some(f)) => TextTurn::Final(text[f + "Final Answer:".len()..].trim().to_owned()),
        (Some(a), _) => {
            let rest = text[a..].replace("</tool_call>", "");
            let Some(value) = repair_json(&rest) else {
                return TextTurn::Unreadable(
                    "your action is not a JSON object; write `Action: {\"tool\": \"name\", \"arguments\": {...}}`"
                        .to_owned(),
                );
            };
            let name = ["tool", "name", "action"]
                .iter()
                .find_map(|k| value.get(*k).and_then(Json::as_str));
            let Some(name) = name else {
                return TextTurn::Unreadable(
                    "your action names no tool; write `Action: {\"tool\": \"name\", \"arguments\": {...}}`".to_owned(),
                );
            };
            let arguments = ["arguments", "args", "input", "parameters"]
                .iter()
                .find_map(|k| value.get(*k).cloned())
                .unwrap_or_else(|| Json::Object(serde_json::Map::new()));
            TextTurn::Action(crate::llm::ToolCall {
                id: format!("text_{iteration}"),
                name: name.to_owned(),
                arguments,
                signature: None,
            })
        }
        // No marker at all: the whole text is the answer.
        (None, None) => TextTurn::Final(text.trim().to_owned()),
    }
}

/// The first JSON object in `text`, repaired if needed: code fences dropped, the outermost braces taken,
/// trailing commas removed, single quotes turned into double quotes.
fn repair_json(text: &str) -> Option<Json> {
    let start = text.find('{')?;
    let mut depth = 0usize;
    let mut end = None;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text[start..].char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    end = Some(start + i);
                    break;
                }
            }
            _ => {}
        }
    }
    let candidate = &text[start..=end?];
    if let Ok(value) = serde_json::from_str::<Json>(candidate) {
        return value.is_object().then_some(value);
    }
    let mut fixed = String::with_capacity(candidate.len());
    let mut in_double = false;
    let mut chars = candidate.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_double = !in_double;
                fixed.push(c);
            }
            '\'' if !in_double => fixed.push('"'),
            ',' if !in_double => {
                // A trailing comma before a closing bracket.
                let mut lookahead = chars.clone();
                while lookahead.peek().is_some_and(|c| c.is_whitespace()) {
                    lookahead.next();
                }
                if !matches!(lookahead.peek(), Some('}' | ']')) {
                    fixed.push(c);
                }
            }
            _ => fixed.push(c),
        }
    }
    serde_json::from_str::<Json>(&fixed)
        .ok()
        .filter(Json::is_object)
}
