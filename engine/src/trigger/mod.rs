//! Triggers: what starts a workflow under `archon serve` (docs/spec.md#triggers). Pure logic over a clock
//! the caller passes in; the server owns the timer and the HTTP side.
//!
//! - [`CronSchedule`]: a cron expression in an IANA time zone, and its next instant after another
//!   (a wall-clock time a spring-forward gap skips fires once, at the first instant after the gap; one a
//!   fall-back fold repeats fires once, at its first occurrence).
//! - [`decide`]: what a firing does while the trigger's previous run is still going ([`Decision`]).
//! - [`Scheduler`]: the cron triggers of the loaded workflows; given `now` it records and returns the
//!   firings due (catching up missed slots within `catch_up` the first time it sees a trigger) and says
//!   when to wake next.
//! - [`Webhook`]: a workflow's webhook with its secrets' values; [`Webhook::verify`] checks a
//!   [`Delivery`] (size, HMAC signature or bearer token in constant time, delivery id, body against the
//!   input's schema) and [`receive`] records it.
//!
//! Every firing is recorded in the run store before its run starts (`RunStore::record_firing`, unique per
//! workflow, trigger and slot), so a restart never fires a slot twice and finds a firing whose run was
//! never created (`RunStore::unstarted_firings`).

mod cron;
mod overlap;
mod scheduler;
mod webhook;

pub use crate::spec::Overlap;
pub use crate::store::{Firing, FiringKind, FiringOutcome};
pub use cron::CronSchedule;
pub use jiff::Timestamp;
pub use overlap::{Decision, decide};
pub use scheduler::{Due, GRACE, MAX_QUEUED, Scheduler};
pub use webhook::{
    DELIVERY_HEADERS, Delivery, MAX_BODY_BYTES, MAX_DELIVERY_ID_BYTES, ReceiveError, Received,
    SIGNATURE_HEADERS, Verified, Webhook, WebhookError, receive, sign,
};

/// A trigger that cannot be set up from its workflow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TriggerError {
    /// The trigger's input values do not make the run's inputs (validation checks them, so only a
    /// workflow that was not validated gets here).
    #[error("trigger `{trigger}` of workflow `{workflow}`: {message}")]
    Inputs {
        workflow: String,
        trigger: String,
        message: String,
    },
    /// A secret the webhook names has no value.
    #[error("the webhook of workflow `{workflow}`: {message}")]
    Secret { workflow: String, message: String },
}

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn millis(at: Timestamp) -> u64 {
    u64::try_from(at.as_millisecond()).unwrap_or(0)
}
