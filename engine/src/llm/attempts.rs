//! Each HTTP request of a model call, told to whoever made the call as it ends: a provider's retries (a
//! timeout, a 5xx, a 429) would otherwise be invisible until the call as a whole ends, and the time and
//! requests they spend could not be counted; and the request that answered is the one a call's time is
//! taken from. The caller scopes a call with [`observed`]; the HTTP client reports into that scope. Calls
//! made outside one report nowhere.

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc::UnboundedSender;

/// One request of a call, as it ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    /// When it started.
    pub started: SystemTime,
    pub duration: Duration,
    /// Why it failed, as the call's error would say it; `None` when it was answered.
    pub error: Option<String>,
    /// Whether another request of the call follows (a retry, or the adapter sending it again changed).
    pub retrying: bool,
}

/// What the caller of a call is told.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// A request was sent (a wait between retries is not one).
    Started,
    Ended(Attempt),
}

tokio::task_local! {
    static OBSERVER: UnboundedSender<Report>;
}

/// Runs `call`, sending each request it makes, as it starts and ends, to `observer`.
pub async fn observed<T>(observer: UnboundedSender<Report>, call: impl Future<Output = T>) -> T {
    OBSERVER.scope(observer, call).await
}

/// Tells the caller's scope, if there is one, about a request.
pub(crate) fn report(report: Report) {
    let _ = OBSERVER.try_with(|observer| observer.send(report));
}
