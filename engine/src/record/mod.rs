//! What the run store persists: record types of their own, with a format version, independent of the
//! runtime types they are made from (conversions live on the store's side, in `store/convert.rs`).
//!
//! Every row that holds a record carries the format it was written in (a `format` column). Rows written
//! before records had a version are format [`LEGACY_FORMAT`]; their JSON has the shape of format 1, so
//! they decode with the same types. A row whose text does not decode, or whose format is newer than
//! [`FORMAT_VERSION`], is a [`RecordError`]: the store reports it and never shows something else instead.

use indexmap::IndexMap;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// The format this version writes.
pub const FORMAT_VERSION: u32 = 1;
/// The format of rows written before records had a version (schema versions 1 to 3).
pub const LEGACY_FORMAT: u32 = 0;

/// A row that cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("run `{run}`: {table} row `{row}` does not decode: {source}")]
    Decode {
        run: String,
        table: &'static str,
        row: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "run `{run}`: {table} row `{row}` has format `{format}`, newer than this archon reads (`{FORMAT_VERSION}`)"
    )]
    Newer {
        run: String,
        table: &'static str,
        row: String,
        format: i64,
    },
    #[error("run `{run}`: {table} row `{row}` {problem}")]
    Text {
        run: String,
        table: &'static str,
        row: String,
        problem: &'static str,
    },
}

/// Where a record was read from, for its error.
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    pub run: &'a str,
    pub table: &'static str,
    pub row: &'a str,
}

/// Decodes the record `text` (JSON) written in `format`.
pub fn decode<T: DeserializeOwned>(
    at: Row<'_>,
    format: i64,
    text: impl AsRef<[u8]>,
) -> Result<T, RecordError> {
    known(at, format)?;
    serde_json::from_slice(text.as_ref()).map_err(|source| at.error(source))
}

/// Decodes a record held as a plain column value (a run's status) written in `format`.
pub fn decode_value<T: DeserializeOwned>(
    at: Row<'_>,
    format: i64,
    value: Json,
) -> Result<T, RecordError> {
    known(at, format)?;
    serde_json::from_value(value).map_err(|source| at.error(source))
}

/// Decodes a record (this format's JSON) as it is read from `reader`, without holding its text whole.
pub fn decode_from<T: DeserializeOwned>(
    at: Row<'_>,
    reader: impl std::io::Read,
) -> Result<T, RecordError> {
    serde_json::from_reader(reader).map_err(|source| at.error(source))
}

/// A text kept apart as raw UTF-8 (a step's large text, in `blobs`), as it was read; `None` when the row
/// it should be in is missing.
pub fn text(at: Row<'_>, read: Option<std::io::Result<String>>) -> Result<String, RecordError> {
    let problem = match read {
        Some(Ok(text)) => return Ok(text),
        Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => "is not UTF-8 text",
        Some(Err(_)) => "cannot be read",
        None => "is missing",
    };
    Err(RecordError::Text {
        run: at.run.to_owned(),
        table: at.table,
        row: at.row.to_owned(),
        problem,
    })
}

fn known(at: Row<'_>, format: i64) -> Result<(), RecordError> {
    match u32::try_from(format) {
        Ok(LEGACY_FORMAT..=FORMAT_VERSION) => Ok(()),
        _ => Err(RecordError::Newer {
            run: at.run.to_owned(),
            table: at.table,
            row: at.row.to_owned(),
            format,
        }),
    }
}

impl Row<'_> {
    fn error(self, source: serde_json::Error) -> RecordError {
        RecordError::Decode {
            run: self.run.to_owned(),
            table: self.table,
            row: self.row.to_owned(),
            source,
        }
    }
}

/// Encodes a record in [`FORMAT_VERSION`].
pub fn encode<T: Serialize>(record: &T) -> String {
    // Records are plain data (strings, numbers, JSON values with string keys): serializing cannot fail.
    serde_json::to_string(record).unwrap_or_else(|_| "null".to_owned())
}

/// Where a run stands (the `status` column of `runs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Running,
    Succeeded,
    Failed,
    Cancelled,
    Interrupted,
    WaitingApproval,
}

/// A JSON object: a run's inputs or outputs.
pub type Object = Map<String, Json>;

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Succeeded,
    Failed,
    TimedOut,
    Skipped,
    Cancelled,
    Stuck,
    Incomplete,
    WaitingApproval,
}

/// What a step's LLM calls used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub calls: u64,
    /// Added in this format without a version change: a record without it had none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    pub cost_usd: f64,
    pub unpriced_calls: u64,
    /// Added in this format without a version change: a record without it had none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub largest_prompt: u64,
    /// Added in this format without a version change: a record without it had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextUse>,
}

/// An agent step's working memory: context window, compaction threshold (tokens), compactions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextUse {
    pub window: u64,
    pub compact_at: u64,
    pub compactions: u32,
}

/// A step's final result (a row of `results`; its output may live in `blobs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    pub status: StepStatus,
    pub output: Json,
    pub text: String,
    pub outputs: Map<String, Json>,
    pub error: Option<String>,
    pub attempts: u32,
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
    pub fallback: bool,
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub steps: IndexMap<String, StepResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Box<Json>>,
    /// Added in this format without a version change: a record without it was not reused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<CachedFrom>,
    /// Added in this format without a version change: a delegation recorded without it shows no task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

/// Where a reused result came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedFrom {
    pub run: String,
    pub step: String,
    pub at_ms: u64,
}

/// A call that asked for a person's approval (a row of `approvals`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub key: String,
    pub step: String,
    pub tool: Option<String>,
    pub arguments: Json,
    pub reason: String,
    pub timeout_ms: Option<u64>,
    pub approve_on_timeout: bool,
}

/// The decision on such a call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    pub approved: bool,
    pub by: String,
    pub reason: Option<String>,
}

/// One event of a run's log (a row of `events`): its kind and its fields. The log is read as it was
/// written (`archon show --events`), so the record keeps each event's fields as they are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub event: String,
    #[serde(flatten)]
    pub fields: Map<String, Json>,
}

/// Where an LLM step stood after an iteration (a row of `checkpoints`); the step reads it back.
pub type Checkpoint = Json;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: Row<'static> = Row {
        run: "r1",
        table: "results",
        row: "a",
    };

    #[test]
    fn a_row_that_does_not_decode_names_its_run_table_and_row() {
        let error = decode::<StepResult>(AT, 1, "{}").expect_err("no status");
        assert_eq!(
            error.to_string(),
            "run `r1`: results row `a` does not decode: missing field `status` at line 1 column 2"
        );
        let error = decode::<StepResult>(AT, 2, "{}").expect_err("newer");
        assert_eq!(
            error.to_string(),
            "run `r1`: results row `a` has format `2`, newer than this archon reads (`1`)"
        );
        let error = decode::<Event>(AT, 0, "[1]").expect_err("not an object");
        assert_eq!(
            error.to_string(),
            "run `r1`: results row `a` does not decode: invalid type: sequence, expected struct Event at line 1 column 0"
        );
    }

    #[test]
    fn records_read_back_what_they_wrote_in_both_formats() {
        let event: Event = decode(
            AT,
            0,
            r#"{"event":"step_started","step":"a","extra":[1,{"b":null}]}"#,
        )
        .expect("legacy event");
        let text = encode(&event);
        assert_eq!(
            text,
            r#"{"event":"step_started","step":"a","extra":[1,{"b":null}]}"#
        );
        assert_eq!(decode::<Event>(AT, 1, &text).expect("event"), event);
    }
}
