//! A `CallToolResult` as a step's output.
//!
//! - `isError`: the call fails with the server's text.
//! - `structuredContent`, when present, is the output (what the server meant to be read), and its JSON is
//!   the text.
//! - Otherwise the text contents, joined with newlines, are the output, as a string: a text that happens to
//!   parse as JSON stays a string (the server said text; `fromjson` reads it), so that an output's type does
//!   not depend on what a server wrote this time.
//! - Images, audio and resources are not carried: each is summarised as an object with its type, MIME
//!   type and size in bytes (`{"type": "image", "mimeType": "image/png", "bytes": 5120}`), and a result
//!   holding any is an array of its blocks (text blocks as `{"type": "text", "text": ...}`); the text shows
//!   each summary as JSON on its own line.
//!
//! Like a command's output, what is kept is at most [`MAX_CAPTURE_BYTES`] of text, then a note of how
//! many bytes were dropped; secrets are masked.

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::{Value as Json, json};

use crate::redact::Redactor;
use crate::tools::builtin::MAX_CAPTURE_BYTES;
use crate::tools::{ToolError, ToolOutput};

/// Most bytes of a server's error text quoted in the error.
const MAX_ERROR_BYTES: usize = 16 * 1024;

/// The output of a call to `name` (`<server>.<tool>`), or its failure when the server says it failed.
pub(crate) fn output(
    name: &str,
    result: CallToolResult,
    redactor: &Redactor,
) -> Result<ToolOutput, ToolError> {
    if result.is_error == Some(true) {
        let mut budget = Budget::new(MAX_ERROR_BYTES);
        let texts: Vec<String> = result
            .content
            .into_iter()
            .map(|block| match block {
                ContentBlock::Text(text) => budget.take(&text.text, redactor),
                other => budget.take(&summary(&other).to_string(), redactor),
            })
            .collect();
        let mut text = texts.join("\n");
        budget.note(&mut text);
        redactor.string(&mut text);
        let text = if text.trim().is_empty() {
            "no message".to_owned()
        } else {
            text
        };
        return Err(ToolError::new(format!("`{name}` failed: {text}")));
    }
    if let Some(structured) = result.structured_content {
        let text = structured.to_string();
        if text.len() <= MAX_CAPTURE_BYTES {
            let mut output = ToolOutput {
                output: structured,
                text,
                exit_code: None,
            };
            redactor.json(&mut output.output);
            redactor.string(&mut output.text);
            return Ok(output);
        }
        // Too large to keep whole: its text, cut, is what is kept.
        drop(structured);
        let mut budget = Budget::new(MAX_CAPTURE_BYTES);
        let mut text = budget.take(&text, redactor);
        budget.note(&mut text);
        redactor.string(&mut text);
        return Ok(ToolOutput {
            output: Json::String(text.clone()),
            text,
            exit_code: None,
        });
    }
    let mut budget = Budget::new(MAX_CAPTURE_BYTES);
    let mut only_text = true;
    let mut items = Vec::with_capacity(result.content.len());
    let mut lines = Vec::with_capacity(result.content.len());
    for block in result.content {
        match block {
            ContentBlock::Text(text) => {
                let kept = budget.take(&text.text, redactor);
                drop(text);
                items.push(json!({ "type": "text", "text": kept }));
                lines.push(kept);
            }
            other => {
                only_text = false;
                let summary = summary(&other);
                drop(other);
                lines.push(budget.take(&summary.to_string(), redactor));
                items.push(summary);
            }
        }
    }
    let mut text = lines.join("\n");
    drop(lines);
    let note = budget.note(&mut text);
    let mut output = if only_text {
        drop(items);
        Json::String(text.clone())
    } else {
        if let Some(note) = note {
            items.push(json!({ "type": "text", "text": note }));
        }
        Json::Array(items)
    };
    redactor.string(&mut text);
    redactor.json(&mut output);
    Ok(ToolOutput {
        output,
        text,
        exit_code: None,
    })
}

/// What a block that is not text is, without its data.
fn summary(block: &ContentBlock) -> Json {
    match block {
        ContentBlock::Text(text) => json!({ "type": "text", "bytes": text.text.len() }),
        ContentBlock::Image(image) => json!({
            "type": "image",
            "mimeType": image.mime_type,
            "bytes": decoded_len(&image.data),
        }),
        ContentBlock::Audio(audio) => json!({
            "type": "audio",
            "mimeType": audio.mime_type,
            "bytes": decoded_len(&audio.data),
        }),
        ContentBlock::Resource(embedded) => match &embedded.resource {
            ResourceContents::TextResourceContents {
                uri,
                mime_type,
                text,
                ..
            } => json!({
                "type": "resource",
                "uri": uri,
                "mimeType": mime_type,
                "bytes": text.len(),
            }),
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => json!({
                "type": "resource",
                "uri": uri,
                "mimeType": mime_type,
                "bytes": decoded_len(blob),
            }),
            _ => json!({ "type": "resource" }),
        },
        ContentBlock::ResourceLink(link) => {
            let mut summary = json!({
                "type": "resource_link",
                "uri": link.uri,
                "name": link.name,
                "mimeType": link.mime_type,
            });
            if let Some(size) = link.size {
                summary["bytes"] = json!(size);
            }
            summary
        }
        _ => json!({ "type": "unknown" }),
    }
}

/// The size of what base64 `data` encodes.
fn decoded_len(data: &str) -> usize {
    let data = data.trim_end();
    let padding = data.bytes().rev().take_while(|b| *b == b'=').count();
    (data.len() / 4 * 3 + (data.len() % 4).saturating_sub(1)).saturating_sub(padding)
}

/// The bytes of text still kept, and how many were dropped.
struct Budget {
    left: usize,
    dropped: usize,
}

impl Budget {
    fn new(bytes: usize) -> Self {
        Budget {
            left: bytes,
            dropped: 0,
        }
    }

    /// What is kept of `text`: all of it while the budget lasts, then a head cut where it splits no
    /// secret (whose head would otherwise stay visible once masking no longer recognises it).
    fn take(&mut self, text: &str, redactor: &Redactor) -> String {
        if text.len() <= self.left {
            self.left -= text.len();
            return text.to_owned();
        }
        let mut cut = redactor.cut_before(text, self.left);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        self.dropped += text.len() - cut;
        self.left = 0;
        text[..cut].to_owned()
    }

    /// Appends the note that bytes were dropped, if any were, and returns it.
    fn note(&self, text: &mut String) -> Option<String> {
        (self.dropped > 0).then(|| {
            let note = format!("[archon: output truncated, {} more bytes]", self.dropped);
            text.push('\n');
            text.push_str(&note);
            note
        })
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{CallToolResult, ContentBlock};
    use serde_json::json;

    use super::*;

    fn ok(result: CallToolResult) -> ToolOutput {
        output("s.t", result, &Redactor::default()).expect("a result")
    }

    #[test]
    fn text_stays_a_string_even_when_it_is_json() {
        let out = ok(CallToolResult::success(vec![ContentBlock::text(
            "{\"a\":1}",
        )]));
        assert_eq!(out.output, json!("{\"a\":1}"));
        assert_eq!(out.text, "{\"a\":1}");
    }

    #[test]
    fn structured_content_is_preferred() {
        let mut result = CallToolResult::success(vec![ContentBlock::text("three")]);
        result.structured_content = Some(json!({ "sum": 3 }));
        let out = ok(result);
        assert_eq!(out.output, json!({ "sum": 3 }));
        assert_eq!(out.text, r#"{"sum":3}"#);
    }

    #[test]
    fn images_are_summarised() {
        let out = ok(CallToolResult::success(vec![
            ContentBlock::text("see"),
            ContentBlock::image("aGVsbG8=", "image/png"),
        ]));
        assert_eq!(
            out.output,
            json!([
                { "type": "text", "text": "see" },
                { "type": "image", "mimeType": "image/png", "bytes": 5 },
            ])
        );
        assert_eq!(
            out.text,
            "see\n{\"type\":\"image\",\"mimeType\":\"image/png\",\"bytes\":5}"
        );
    }

    #[test]
    fn an_error_result_fails_the_call_with_its_text() {
        let error = output(
            "s.t",
            CallToolResult::error(vec![ContentBlock::text("no such file")]),
            &Redactor::default(),
        )
        .expect_err("an error");
        assert_eq!(error.message, "`s.t` failed: no such file");
    }

    #[test]
    fn long_text_is_cut_with_a_note() {
        let out = ok(CallToolResult::success(vec![ContentBlock::text(
            "x".repeat(MAX_CAPTURE_BYTES + 10),
        )]));
        let note = "\n[archon: output truncated, 10 more bytes]";
        assert_eq!(out.text.len(), MAX_CAPTURE_BYTES + note.len());
        assert!(out.text.ends_with(note));
        assert_eq!(out.output, json!(out.text));
    }

    #[test]
    fn secrets_are_masked() {
        let redactor = Redactor::new(["hunter2-secret".to_owned()]);
        let out = output(
            "s.t",
            CallToolResult::success(vec![ContentBlock::text("pw=hunter2-secret")]),
            &redactor,
        )
        .expect("a result");
        assert!(!out.text.contains("hunter2-secret"), "{}", out.text);
        assert!(!out.output.to_string().contains("hunter2-secret"));
    }

    #[test]
    fn base64_sizes() {
        assert_eq!(decoded_len(""), 0);
        assert_eq!(decoded_len("aGVsbG8="), 5);
        assert_eq!(decoded_len("aGVsbG8h"), 6);
        assert_eq!(decoded_len("aGk="), 2);
    }
}
