//! Each failed HTTP attempt of a model call, told to whoever made the call as it happens: a provider's
//! retries (a timeout, a 5xx, a 429) would otherwise be invisible until the call as a whole ends, and the
//! time and requests they spend could not be counted. The caller scopes a call with [`observed`]; the
//! HTTP client reports into that scope. Calls made outside one report nowhere.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

/// One attempt of a call that failed.
#[derive(Clone, Debug, PartialEq)]
pub struct FailedAttempt {
    /// 1 for the first request of the call.
    pub number: u32,
    pub duration: Duration,
    /// Why it failed, as the call's error would say it.
    pub error: String,
    /// Whether another attempt follows.
    pub retrying: bool,
}

tokio::task_local! {
    static OBSERVER: UnboundedSender<FailedAttempt>;
}

/// Runs `call`, sending each failed attempt it makes to `observer`.
pub async fn observed<T>(
    observer: UnboundedSender<FailedAttempt>,
    call: impl Future<Output = T>,
) -> T {
    OBSERVER.scope(observer, call).await
}

/// Tells the caller's scope, if there is one, about a failed attempt.
pub(crate) fn report(attempt: FailedAttempt) {
    let _ = OBSERVER.try_with(|observer| observer.send(attempt));
}
