//! Persistence before effects, in one place: every caller that is about to start a side effect after
//! recording something (an attempt, an approval, an agent's or a planner's checkpoint) waits here until the
//! journal says it is durable, and a record that cannot be made durable stops the whole run.

use super::context::{Failure, Shared};
use crate::store::{Ack, StoreError};

/// A record that had to be durable before a side effect, and was not. The run stops with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum PersistError {
    #[error("the attempt did not start because it could not be recorded: {source}")]
    Attempt {
        #[source]
        source: StoreError,
    },
    #[error("the approval request could not be recorded: {source}")]
    ApprovalRequest {
        #[source]
        source: StoreError,
    },
    #[error("the call did not start because its approval could not be recorded: {source}")]
    ApprovalDecision {
        #[source]
        source: StoreError,
    },
    #[error(
        "the agent's next tool calls did not start because its checkpoint could not be recorded: {source}"
    )]
    AgentCheckpoint {
        #[source]
        source: StoreError,
    },
    #[error("the plan did not run because it could not be recorded: {source}")]
    Plan {
        #[source]
        source: StoreError,
    },
}

/// What a caller made durable before its side effect.
#[derive(Clone, Copy, Debug)]
pub(super) enum Record {
    Attempt,
    ApprovalRequest,
    ApprovalDecision,
    AgentCheckpoint,
    Plan,
}

impl Record {
    fn failed(self, source: StoreError) -> PersistError {
        match self {
            Record::Attempt => PersistError::Attempt { source },
            Record::ApprovalRequest => PersistError::ApprovalRequest { source },
            Record::ApprovalDecision => PersistError::ApprovalDecision { source },
            Record::AgentCheckpoint => PersistError::AgentCheckpoint { source },
            Record::Plan => PersistError::Plan { source },
        }
    }
}

/// Waits for `ack` (a flush of the run's journal, taken after `record` was recorded). When it fails, the run
/// is stopped with the error before the caller can start anything: without its record, a crash could
/// repeat the side effect unnoticed, or lose a decision a person made.
pub(super) async fn durable(shared: &Shared, ack: Ack, record: Record) -> Result<(), PersistError> {
    match ack.wait().await {
        Ok(()) => Ok(()),
        Err(source) => {
            let error = record.failed(source);
            shared
                .halt
                .stop(shared.redactor.text(&error.to_string()).into_owned());
            Err(error)
        }
    }
}

/// Flushes the run's journal, then [`durable`].
pub(super) async fn persist(shared: &Shared, record: Record) -> Result<(), PersistError> {
    durable(shared, shared.options.journal.flush(), record).await
}

impl From<PersistError> for Failure {
    fn from(error: PersistError) -> Self {
        Failure::fixed(error.to_string())
    }
}
