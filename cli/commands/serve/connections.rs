//! The HTTP side of `archon serve`: accepting connections and serving HTTP/1.1 on each. At most
//! `--max-connections` are open at once (a further one waits in the listen backlog, unanswered, until
//! one closes); a connection that does not send a request's headers in time (from when it opens, or
//! once its previous request is answered) is closed, so that idle and half-sent requests cannot hold
//! file descriptors for ever; when the server stops, each connection ends once its request in flight
//! is answered (live event streams end with the server).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::output;

/// File descriptors kept for everything else the server opens (its stores, the runs' files and
/// processes) when `--max-connections` is checked against the open-file limit.
const OTHER_FDS: u64 = 256;

/// How connections are limited.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long a connection has to send a request's headers.
    pub header_timeout: Duration,
}

impl Limits {
    /// Says on standard error when `max_connections` does not fit under the process's open-file limit
    /// with room for the rest, after raising the soft limit as far as the hard one allows.
    pub fn check_fd_limit(&self) {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let needed = self.max_connections as u64 + OTHER_FDS;
        let limit = getrlimit(Resource::Nofile);
        let Some(soft) = limit.current else {
            return;
        };
        if soft >= needed {
            return;
        }
        let raised = limit.maximum.map_or(needed, |hard| hard.min(needed));
        if raised > soft
            && setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(raised),
                    maximum: limit.maximum,
                },
            )
            .is_ok()
            && raised >= needed
        {
            return;
        }
        let has = getrlimit(Resource::Nofile).current.unwrap_or(soft);
        output::stderr(&format!(
            "warning: `--max-connections {}` needs about {needed} open files, and the limit is {has}\n  hint: lower `--max-connections` or raise the limit (`ulimit -n`)\n",
            self.max_connections
        ));
    }
}

/// Serves `router` on the connections `listener` accepts until `shutdown`, then waits until every
/// connection has ended.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        // A place first: at the limit, the next connection is not even accepted.
        let place = tokio::select! {
            place = slots.clone().acquire_owned() => match place {
                Ok(place) => place,
                Err(_) => break,
            },
            () = shutdown.cancelled() => break,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    if !is_connection_error(&e) {
                        // Out of file descriptors and the like: wait a moment rather than spin.
                        output::stderr(&format!(
                            "warning: cannot accept a connection: {}\n",
                            e.to_string().to_lowercase()
                        ));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let (router, shutdown) = (router.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _place = place;
            serve_connection(stream, remote, router, limits, shutdown).await;
        });
    }
    drop(listener);
    // Every place back: every connection has ended.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
    router: axum::Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
        request.extensions_mut().insert(ConnectInfo(remote));
        tower_service::Service::call(&mut router.clone(), request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        () = shutdown.cancelled() => connection.as_mut().graceful_shutdown(),
    }
    let _ = connection.await;
}

/// An error of one connection (it was reset before it was accepted), not of the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}
