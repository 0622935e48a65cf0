//! Helpers for the engine's own tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Awaits `work` while another task counts the turns it gets: how often the run's other tasks (another
/// step, a timeout, Ctrl-C) could go on meanwhile. On a current-thread runtime it is none when `work`
/// holds the thread until it ends.
pub(crate) async fn others_ran_during<F: Future>(work: F) -> (F::Output, usize) {
    let turns = Arc::new(AtomicUsize::new(0));
    let other = {
        let turns = turns.clone();
        tokio::spawn(async move {
            loop {
                turns.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        })
    };
    let output = work.await;
    let during = turns.load(Ordering::Relaxed);
    other.abort();
    (output, during)
}
