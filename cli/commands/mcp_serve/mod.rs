//! `archon mcp serve [PATH...]`: the workflows under PATH as MCP tools, over stdio (standard output
//! carries nothing but the protocol) or streamable HTTP (`--http ADDR`). Each call is a durable run in the
//! state directory. SIGTERM, Ctrl-C or the client closing stdio stops the server: the runs going on are
//! interrupted, recorded and resumable.

mod catalog;
mod handler;
mod http;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use archon_engine::session::Session;
use rmcp::ServiceExt as _;
use tokio_util::sync::CancellationToken;

use super::Status;
use crate::args::McpServeArgs;
use crate::output;
use handler::{Handler, Shared};

/// How long the HTTP server waits, once every call is answered, for the answers to reach their clients and
/// the connections to close, then for the connections to end once it has closed the sessions.
const CLOSE_LIMIT: Duration = Duration::from_secs(2);

pub fn serve(args: &McpServeArgs) -> anyhow::Result<Status> {
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.paths.clone()
    };
    let token = match args.http {
        Some(address) => match bearer_token(args) {
            Ok(token) => {
                if token.is_none() && !address.ip().is_loopback() {
                    return Ok(refuse(
                        &format!(
                            "serving on `{address}` needs a bearer token: it is not a loopback address"
                        ),
                        "set `ARCHON_MCP_TOKEN` or pass `--token-file FILE`; clients send `Authorization: Bearer TOKEN`",
                    ));
                }
                token
            }
            Err(status) => return Ok(status),
        },
        None => None,
    };
    let catalog = match catalog::load(&paths)? {
        Ok(catalog) => catalog,
        Err(refusal) => {
            let hint = refusal.hint.unwrap_or_default();
            return Ok(refuse(&refusal.message, &hint));
        }
    };
    let state_dir = std::path::absolute(args.state.dir())?;
    let store = archon_engine::session::StoreAt {
        state_dir: state_dir.clone(),
        ..args.state.at()
    };
    // Opened once here so that a store that cannot be used stops the server at once.
    if let Err(e) = Session::open_at(&store) {
        return Ok(super::run::store_error(&e));
    }
    // This process runs many runs: `archon cancel` must ask through the store, not signal it.
    let _serving = archon_engine::session::ServingMark::new(&state_dir)?;
    let stopping = CancellationToken::new();
    let (running, mut watching) = tokio::sync::watch::channel(0_usize);
    let (answering, mut answered) = tokio::sync::watch::channel(0_usize);
    let shared = Arc::new(Shared {
        catalog,
        store,
        stopping: stopping.clone(),
        running,
        answering,
        slots: Arc::new(tokio::sync::Semaphore::new(args.max_runs as usize)),
        helper: std::env::current_exe().ok(),
        labels: args.labels.iter().cloned().collect(),
    });
    let signal_handle = super::run::cancel_on_signals(stopping.clone())?;
    // One thread serves the protocol; each run has a thread of its own.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let served = runtime.block_on(async {
        match args.http {
            None => {
                let starting = Handler::new(shared.clone()).serve(rmcp::transport::stdio());
                let service = tokio::select! {
                    started = starting => match started {
                        Ok(service) => Some(service),
                        // The client went away before it began: nothing to serve.
                        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => None,
                        Err(e) => anyhow::bail!("cannot start the MCP session: {e}"),
                    },
                    () = stopping.cancelled() => None,
                };
                if let Some(service) = service {
                    let cancel = service.cancellation_token();
                    let mut waiting = std::pin::pin!(service.waiting());
                    tokio::select! {
                        _ = &mut waiting => {}
                        () = stopping.cancelled() => {
                            // The calls answer as their runs end; then the session closes, sending
                            // what is left to send.
                            let _ = watching.wait_for(|n| *n == 0).await;
                            cancel.cancel();
                            let _ = waiting.await;
                        }
                    }
                }
            }
            Some(address) => {
                let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| {
                    anyhow::anyhow!(
                        "cannot listen on `{address}`: {}",
                        e.to_string().to_lowercase()
                    )
                })?;
                let bound = listener.local_addr()?;
                output::stderr(&format!("listening on http://{bound}/mcp\n"));
                let (draining, closing) = (CancellationToken::new(), CancellationToken::new());
                let mut server = tokio::spawn(http::serve(
                    listener,
                    address,
                    token,
                    shared.clone(),
                    draining.clone(),
                    closing.clone(),
                ));
                tokio::select! {
                    ended = &mut server => {
                        ended?.map_err(|e| anyhow::anyhow!("the HTTP server stopped: {e}"))?;
                    }
                    () = stopping.cancelled() => {
                        // The runs are interrupted and recorded, their calls answered; then no
                        // connection is taken, and the sessions close once the answers are out.
                        let _ = watching.wait_for(|n| *n == 0).await;
                        let _ = answered.wait_for(|n| *n == 0).await;
                        draining.cancel();
                        if tokio::time::timeout(CLOSE_LIMIT, &mut server).await.is_err() {
                            closing.cancel();
                            let _ = tokio::time::timeout(CLOSE_LIMIT, server).await;
                        }
                    }
                }
            }
        }
        Ok::<_, anyhow::Error>(())
    });
    // However the serving ended, the runs going on are interrupted and recorded before the exit.
    stopping.cancel();
    runtime.block_on(async {
        let _ = watching.wait_for(|n| *n == 0).await;
    });
    runtime.shutdown_background();
    signal_handle.close();
    served?;
    Ok(Status::Success)
}

/// The bearer token HTTP clients must send: the first line of `--token-file`, else `ARCHON_MCP_TOKEN`.
fn bearer_token(args: &McpServeArgs) -> Result<Option<String>, Status> {
    let token = match &args.token_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => Some(text.lines().next().unwrap_or_default().trim().to_owned()),
            Err(e) => {
                return Err(refuse(
                    &format!(
                        "cannot read token file `{}`: {}",
                        path.display(),
                        e.to_string().to_lowercase()
                    ),
                    "the file holds the bearer token on its first line",
                ));
            }
        },
        None => std::env::var("ARCHON_MCP_TOKEN").ok(),
    };
    match token {
        Some(token) if token.is_empty() => Err(refuse(
            "the bearer token is empty",
            "set `ARCHON_MCP_TOKEN` or put the token on the first line of `--token-file`",
        )),
        other => Ok(other),
    }
}

/// A usage problem that stops the server before it starts.
fn refuse(message: &str, hint: &str) -> Status {
    let mut text = format!("error: {message}\n");
    if !hint.is_empty() {
        text.push_str(&format!("  hint: {hint}\n"));
    }
    output::stderr(&output::printable(&text));
    Status::Invalid
}
