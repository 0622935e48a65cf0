//! How many tokens a prompt takes, and how many a model can read: exact counts with OpenAI's tokenizers
//! for OpenAI-family models, an approximation for the others, and a table of well-known context windows.
//!
//! Models whose name starts with `gpt-4o`, `gpt-4.1`, `gpt-4.5`, `gpt-5`, `gpt-oss`, `chatgpt-4o`, `o1`,
//! `o3` or `o4` are counted with `o200k_base` (`gpt-oss` really uses `o200k_harmony`, the same vocabulary
//! with more special tokens); `gpt-4` and `gpt-3.5` with `cl100k_base` (tiktoken-rs; each tokenizer is built
//! once per process, on first use, which takes about 0.2 s).
//!
//! Other models (Claude, Gemini, local models) have tokenizers that are not available offline, so their
//! counts are an approximation: ASCII letters, digits and spaces at 4.5 a token, other ASCII characters
//! (punctuation, symbols, line breaks) at 2 a token, and one token for every other character. Against
//! OpenAI's tokenizers it stays within about 20% on prose, Markdown, JSON, YAML, Rust and file listings
//! (bytes / 4 is off by 35% on JSON and code); other tokenizers can differ more, which is what the margin
//! below the context window (`compact_at`) is for.
//!
//! A message costs its text plus [`MESSAGE_OVERHEAD`] tokens for the role and separators, as in OpenAI's
//! chat format; a tool call, a tool result and an offered tool cost their name and JSON as text plus a
//! small overhead of their own.

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

use super::{Message, Part, ToolSpec};

/// Tokens of a message beyond its content: the role and the separators around it.
pub const MESSAGE_OVERHEAD: usize = 4;
/// Tokens of a tool call or tool result beyond its name and content (ids, field names).
const PART_OVERHEAD: usize = 4;
/// Tokens of an offered tool beyond its name, description and schema.
const TOOL_OVERHEAD: usize = 8;
/// The context window of a model this version knows nothing about.
pub const DEFAULT_CONTEXT_WINDOW: u32 = 8192;
/// Text is handed to the tokenizer in pieces of at most this many bytes: its regular expressions backtrack,
/// and a megabyte of one repeated character overflows their stack.
const PIECE_BYTES: usize = 8 * 1024;

/// How a model's tokens are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// OpenAI's `o200k_base`.
    O200k,
    /// OpenAI's `cl100k_base`.
    Cl100k,
    /// The approximation described in the module documentation.
    Approximate,
}

impl Encoding {
    /// The encoding of `model`, by its name (a `vendor/` prefix, as routers write it, is ignored).
    pub fn of(model: &str) -> Encoding {
        let name = model
            .rsplit('/')
            .next()
            .unwrap_or(model)
            .to_ascii_lowercase();
        let family = |prefix: &str| {
            name.strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.', ':']))
        };
        if [
            "gpt-4o",
            "chatgpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "gpt-oss",
            "o1",
            "o3",
            "o4",
        ]
        .iter()
        .any(|p| family(p))
        {
            Encoding::O200k
        } else if family("gpt-4") || family("gpt-3.5") || family("gpt-35") {
            Encoding::Cl100k
        } else {
            Encoding::Approximate
        }
    }

    /// The tokenizer, built on first use; `None` for the approximation (or if the built-in vocabulary
    /// would not load, which would be a bug in the dependency).
    fn bpe(self) -> Option<&'static CoreBPE> {
        static O200K: OnceLock<Option<CoreBPE>> = OnceLock::new();
        static CL100K: OnceLock<Option<CoreBPE>> = OnceLock::new();
        match self {
            Encoding::O200k => O200K
                .get_or_init(|| tiktoken_rs::o200k_base().ok())
                .as_ref(),
            Encoding::Cl100k => CL100K
                .get_or_init(|| tiktoken_rs::cl100k_base().ok())
                .as_ref(),
            Encoding::Approximate => None,
        }
    }
}

/// Counts tokens for one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimator {
    encoding: Encoding,
}

impl Estimator {
    pub fn for_model(model: &str) -> Self {
        Estimator {
            encoding: Encoding::of(model),
        }
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// The tokens of `text`.
    pub fn text(&self, text: &str) -> usize {
        match self.encoding.bpe() {
            Some(bpe) => pieces(text).map(|p| bpe.encode_ordinary(p).len()).sum(),
            None => approximate(text),
        }
    }

    /// The tokens of a message, overhead included.
    pub fn message(&self, message: &Message) -> usize {
        message_with(message, |t| self.text(t))
    }

    /// The tokens of the tool definitions offered with a request.
    pub fn tools(&self, tools: &[ToolSpec]) -> usize {
        tools_with(tools, |t| self.text(t))
    }

    /// The longest start of `text` within `max_tokens` tokens (at a character boundary).
    pub fn prefix<'t>(&self, text: &'t str, max_tokens: usize) -> &'t str {
        // No count exceeds the bytes (see `message_bound`): a short text fits whole, and the tokenizer is not
        // even built for it.
        if text.len() <= max_tokens {
            return text;
        }
        let Some(bpe) = self.encoding.bpe() else {
            return approximate_prefix(text, max_tokens);
        };
        // A longer one is cut within the first bytes that can hold `max_tokens` tokens (16 bytes a token is
        // far beyond any real average).
        let window = &text[..floor_boundary(text, max_tokens.saturating_mul(16).min(PIECE_BYTES))];
        let tokens = bpe.encode_ordinary(window);
        if tokens.len() <= max_tokens {
            return window;
        }
        let bytes = bpe
            .decode_bytes(&tokens[..max_tokens])
            .map_or(0, |b| b.len());
        &text[..floor_boundary(text, bytes)]
    }
}

/// Most tokens a message can take, whatever the model: a tokenizer's token covers at least one byte, and
/// the approximation counts at most one token a character. The agent loop uses it to skip exact counts while
/// a prompt is far from its limit.
pub fn message_bound(message: &Message) -> usize {
    message_with(message, str::len)
}

/// Most tokens the tool definitions can take (see [`message_bound`]).
pub fn tools_bound(tools: &[ToolSpec]) -> usize {
    tools_with(tools, str::len)
}

fn message_with(message: &Message, count: impl Fn(&str) -> usize) -> usize {
    let part = |part: &Part| match part {
        Part::Text(text) | Part::Reasoning { text, .. } => count(text),
        Part::ToolCall(call) => {
            PART_OVERHEAD + count(&call.name) + count(&super::arguments_to_text(&call.arguments))
        }
        Part::ToolResult(result) => PART_OVERHEAD + count(&result.name) + count(&result.content),
    };
    MESSAGE_OVERHEAD + message.parts.iter().map(part).sum::<usize>()
}

fn tools_with(tools: &[ToolSpec], count: impl Fn(&str) -> usize) -> usize {
    tools
        .iter()
        .map(|t| {
            TOOL_OVERHEAD
                + count(&t.name)
                + count(&t.description)
                + count(&t.parameters.to_string())
        })
        .sum()
}

/// The context window of well-known models, in tokens, by the longest matching name prefix (after any
/// `vendor/` prefix), as their providers publish them.
const WINDOWS: &[(&str, u32)] = &[
    ("gpt-3.5-turbo", 16_385),
    ("gpt-4", 8_192),
    ("gpt-4-32k", 32_768),
    ("gpt-4-turbo", 128_000),
    ("gpt-4o", 128_000),
    ("chatgpt-4o", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4.5", 128_000),
    ("gpt-5", 400_000),
    ("gpt-oss", 131_072),
    ("o1", 200_000),
    ("o1-mini", 128_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude", 200_000),
    ("gemini-1.5-flash", 1_048_576),
    ("gemini-1.5-pro", 2_097_152),
    ("gemini-2.0-flash", 1_048_576),
    ("gemini-2.5", 1_048_576),
];

/// The context window of `model` from the built-in table, if it is there.
pub fn known_context_window(model: &str) -> Option<u32> {
    let name = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    WINDOWS
        .iter()
        .filter(|(prefix, _)| name.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|&(_, window)| window)
}

/// The approximation: see the module documentation.
fn approximate(text: &str) -> usize {
    let (mut plain, mut symbols, mut other) = (0usize, 0usize, 0usize);
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == ' ' {
            plain += 1;
        } else if c.is_ascii() {
            symbols += 1;
        } else {
            other += 1;
        }
    }
    (plain * 2).div_ceil(9) + symbols.div_ceil(2) + other
}

/// The longest start of `text` the approximation counts at `max_tokens` or fewer.
fn approximate_prefix(text: &str, max_tokens: usize) -> &str {
    // In eighteenths of a token: a plain character costs 4, a symbol 9, any other 18.
    let budget = max_tokens.saturating_mul(18);
    let mut spent = 0usize;
    for (i, c) in text.char_indices() {
        spent += if c.is_ascii_alphanumeric() || c == ' ' {
            4
        } else if c.is_ascii() {
            9
        } else {
            18
        };
        if spent > budget {
            return &text[..i];
        }
    }
    text
}

/// `text` in pieces of at most [`PIECE_BYTES`], cut after a line break or a space where there is one.
fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = floor_boundary(rest, PIECE_BYTES);
        if end < rest.len() {
            if let Some(at) = rest[..end].rfind(['\n', ' ']).filter(|&at| at > 0) {
                end = at + 1;
            } else if end == 0 {
                end = rest.chars().next().map_or(rest.len(), char::len_utf8);
            }
        }
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

/// The largest character boundary of `text` at or below `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    if at >= text.len() {
        return text.len();
    }
    (0..=at)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_get_their_family_encoding() {
        for model in [
            "gpt-4o-mini",
            "gpt-4.1",
            "gpt-5-nano",
            "o3-mini",
            "o1",
            "openai/gpt-4o",
        ] {
            assert_eq!(Encoding::of(model), Encoding::O200k, "{model}");
        }
        for model in ["gpt-4", "gpt-4-turbo", "gpt-3.5-turbo"] {
            assert_eq!(Encoding::of(model), Encoding::Cl100k, "{model}");
        }
        for model in [
            "claude-sonnet-4-5",
            "gemini-2.5-flash",
            "qwen2.5-7b-instruct",
            "o1x",
            "mock",
        ] {
            assert_eq!(Encoding::of(model), Encoding::Approximate, "{model}");
        }
    }

    #[test]
    fn pieces_cover_the_text_and_stay_small() {
        let text = format!("{} {}", "é".repeat(10_000), "word ".repeat(5_000));
        let parts: Vec<&str> = pieces(&text).collect();
        assert_eq!(parts.concat(), text);
        assert!(
            parts
                .iter()
                .all(|p| p.len() <= PIECE_BYTES && !p.is_empty())
        );
    }

    /// Regression: a megabyte of spaces overflowed the tokenizer's regular expression stack, and
    /// tiktoken-rs panics on that error.
    #[test]
    fn a_megabyte_of_one_character_is_counted_without_a_panic() {
        let estimator = Estimator::for_model("gpt-4o");
        let spaces = " ".repeat(1 << 20);
        let tokens = estimator.text(&spaces);
        assert!(tokens > 0 && tokens < spaces.len() / 8, "{tokens}");
    }

    #[test]
    fn the_approximate_prefix_fits_and_cannot_grow() {
        let estimator = Estimator::for_model("claude-sonnet-4-5");
        let text = "{\"name\": \"item\"} ünïcode ".repeat(100);
        let kept = estimator.prefix(&text, 50);
        assert!(estimator.text(kept) <= 50);
        let longer =
            &text[..kept.len() + text[kept.len()..].chars().next().map_or(0, char::len_utf8)];
        assert!(estimator.text(longer) >= 50);
    }

    #[test]
    fn the_window_table_takes_the_longest_prefix() {
        assert_eq!(known_context_window("gpt-4o-mini"), Some(128_000));
        assert_eq!(known_context_window("gpt-4"), Some(8_192));
        assert_eq!(
            known_context_window("gpt-4-turbo-2024-04-09"),
            Some(128_000)
        );
        assert_eq!(known_context_window("o1-mini"), Some(128_000));
        assert_eq!(
            known_context_window("anthropic/claude-sonnet-4-5"),
            Some(200_000)
        );
        assert_eq!(known_context_window("llama-3.1-8b"), None);
    }
}
