//! `archon serve [DIR]`: the dashboard and the JSON API over the workflows under DIR and the runs of the
//! state directory. It is a front end over [`archon_engine::session::Session`], as the CLI is: it adds no
//! run lifecycle of its own, and `archon` commands can be used on the same state directory meanwhile.
//!
//! # Layout
//!
//! - `mod.rs` (this file): the command: tokens, the catalog, the listener, the shutdown.
//! - `connections.rs`: accepting connections (at most `--max-connections` open) and serving HTTP/1.1 on
//!   each, with a timeout for a request's headers.
//! - `app.rs`: [`app::App`], the state every handler shares ([`app::AppState`] is `Arc<App>`): the served
//!   workflows, the state directory, a small pool of read sessions (`App::read`), the executor, the live
//!   event hub and the authentication state. Also [`app::ApiError`], the JSON error every API handler
//!   returns (`{error, hint}` with a status code), and the router ([`app::router`]).
//! - `workflows.rs`: the served workflows ([`workflows::Catalog`]): each spec under DIR, its validation
//!   diagnostics as `archon validate` renders them, and its inputs as a JSON Schema.
//! - `auth.rs`: tokens and roles, the login form and its cookie, CSRF and cross-site checks; the
//!   [`auth::Caller`] extractor.
//! - `api.rs`: the JSON API under `/api/v1`, each handler annotated for the OpenAPI document.
//! - `events.rs`: live events: one watcher polls the store for changes (any process's), in-process runs
//!   publish their events the moment they are recorded; server-sent event streams per run and for the
//!   run list.
//! - `executor.rs`: runs started, continued, approved or cancelled from the server, each executed on a
//!   thread of its own; `--max-runs` and the queue; what is resumed after a restart.
//! - `triggers.rs`: triggers: the cron loop (unstarted firings, catch-up, each slot as it comes, the
//!   overlap policies), the webhook endpoint `POST /hooks/{workflow}` (outside the authentication
//!   middleware: the webhook's signature or token authenticates it) and the API's triggers and firings.
//! - `openapi.rs`: the OpenAPI document (`archon serve --openapi`, `schemas/openapi.json`).
//! - `pages/`: the dashboard's HTML pages, mounted at `/`.
//!
//! # The contract for pages
//!
//! Pages live in `pages/` and are mounted at `/` by [`pages::router`], a `Router<AppState>`; everything
//! under `/api/` and the routes `/login` and `/logout` belong to the API and `auth.rs`.
//!
//! - **State.** A handler takes `State(app): State<AppState>` and shows what the same functions as the
//!   API's handlers return, never the store directly: `api::workflows(&app)`, `api::workflow(&app, id)`,
//!   `api::list_runs(&app, RunsParams)` (a page of runs with its total and the queue),
//!   `api::run_detail(&app, id)`, `api::approvals(&app)`, `triggers::triggers(&app, id)` (a workflow's
//!   triggers, each cron one with its next fire time), `triggers::firings(&app, FiringsParams)`; each returns the API's own types (what the
//!   OpenAPI document describes) or an [`app::ApiError`]. Other reads of the store go through
//!   `app.read(|session| ...)`, which runs on the blocking pool.
//! - **Who is asking.** Every request has passed the authentication middleware before a page handler
//!   runs; a page takes [`auth::Caller`] as an extractor: `caller.role` ([`auth::Role::Viewer`] or
//!   [`auth::Role::Operator`]), `caller.can_operate()` (whether to show the action buttons), `caller.by`
//!   (the name decisions are recorded as), `caller.via` (`Cookie` when a logout button makes sense). A
//!   request without valid credentials never reaches a page: the middleware redirects it to
//!   `/login?next=PATH` (an API request gets `401` instead).
//! - **Forms.** Every state-changing form POSTs (a GET never changes anything) and carries the CSRF
//!   token as a hidden field named `csrf`: [`auth::csrf_field`] writes it (`caller.csrf` is the token of
//!   a browser, `None` for a bearer-token client, which needs none). Scripts send it as the
//!   `X-CSRF-Token` header instead. Before any handler runs, the middleware refuses cross-site POSTs
//!   (`Origin`, `Sec-Fetch-Site`), POSTs without the token (it reads a form body's `csrf` field and puts
//!   the body back) and any POST from a viewer (`403`).
//! - **Actions.** A form handler calls what the API's handlers call, on `app.executor`:
//!   `start_run(&app, workflow_id, inputs, None)`, `continue_run(&app, run_id, How, Options)` (resume,
//!   retry from a step, retry the failed steps), `decide(&app, run_id, key, ApprovalDecision)` (by the
//!   approval's `key`, the hash of its arguments) and `cancel(&app, run_id)`, then redirects (303) to the
//!   page to show. Triggers call `start_run` with `Some(TriggerInfo)`.
//! - **Live updates.** `GET /api/v1/runs/{id}/stream` and `GET /api/v1/runs/stream` are server-sent
//!   events (`events.rs` names their events and data); a page subscribes with `EventSource`, which sends
//!   the session cookie.
//! - **Secrets.** Run data from the store is masked already, and the readers a page calls
//!   (`api::run_detail`, `api::approvals`, `pages::data`, `triggers::firings`) mask the secret values of
//!   the served workflows out of the run data they return (`App::mask_event`, `App::mask_log`, the
//!   engine's `Redactor`), as `events.rs` does out of live events; ids, names and the markup are never
//!   masked. A page that shows run data some other way masks it itself, and never reads the
//!   environment or `.env` files.
//! - **Escaping.** Everything from a spec, a run or a request is text to escape (`pages::escape`).

mod api;
mod app;
mod auth;
mod connections;
mod events;
mod executor;
mod openapi;
mod pages;
mod triggers;
mod workflows;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use archon_engine::session::Session;
use tokio_util::sync::CancellationToken;

use super::Status;
use crate::args::ServeArgs;
use crate::output;

/// How long, once no run is going on, open connections (live event streams included) have to end before
/// the server exits anyway.
const CLOSE_LIMIT: Duration = Duration::from_secs(2);

pub fn serve(args: &ServeArgs) -> anyhow::Result<Status> {
    if args.openapi {
        output::stdout(&openapi::document_text());
        return Ok(Status::Success);
    }
    let address = SocketAddr::new(args.bind, args.port);
    let tokens = match auth::Tokens::load(args.token_file.as_deref()) {
        Ok(tokens) => tokens,
        Err(refusal) => return Ok(refuse(&refusal.message, &refusal.hint)),
    };
    if tokens.is_empty() && !address.ip().is_loopback() {
        return Ok(refuse(
            &format!("serving on `{address}` needs a token: it is not a loopback address"),
            "set `ARCHON_SERVE_TOKEN` or pass `--token-file FILE`; docs/serve.md says how tokens work",
        ));
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("."));
    let catalog = match workflows::Catalog::load(&dir)? {
        Ok(catalog) => catalog,
        Err(refusal) => return Ok(refuse(&refusal.message, &refusal.hint)),
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
    let limits = connections::Limits {
        max_connections: args.max_connections as usize,
        header_timeout: Duration::from_millis(args.header_timeout_ms),
    };
    limits.check_fd_limit();
    // This process runs many runs: `archon cancel` must ask through the store, not signal it.
    let _serving = archon_engine::session::ServingMark::new(&state_dir)?;
    let stopping = CancellationToken::new();
    let signal_handle = super::run::cancel_on_signals(stopping.clone())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .enable_all()
        .build()?;
    let served = runtime.block_on(async {
        let app = app::App::new(
            catalog,
            store,
            tokens,
            args.max_runs as usize,
            args.max_queue as usize,
            stopping.clone(),
            args.labels.iter().cloned().collect(),
        )?;
        let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on `{address}`: {}",
                e.to_string().to_lowercase()
            )
        })?;
        let bound = listener.local_addr()?;
        output::stderr(&format!("listening on http://{bound}/\n"));
        events::spawn_watcher(app.clone());
        app.executor.resume_after_restart(&app);
        triggers::spawn(app.clone());
        // A delivery has as long to send its body as any request has to send its headers.
        let router = app::router(app.clone(), limits.header_timeout);
        let shutdown = stopping.clone();
        let mut server = tokio::spawn(connections::serve(listener, router, limits, shutdown));
        tokio::select! {
            ended = &mut server => {
                ended.map_err(|e| anyhow::anyhow!("the HTTP server stopped: {e}"))?;
            }
            () = stopping.cancelled() => {
                // The runs are interrupted and recorded; live streams end with `stopping`.
                app.executor.wait_idle().await;
                let _ = tokio::time::timeout(CLOSE_LIMIT, &mut server).await;
            }
        }
        app.executor.wait_idle().await;
        app.executor.remember_for_restart();
        Ok::<_, anyhow::Error>(())
    });
    stopping.cancel();
    runtime.shutdown_timeout(CLOSE_LIMIT);
    signal_handle.close();
    served?;
    Ok(Status::Success)
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

/// Why serving cannot start.
#[derive(Debug)]
pub struct Refusal {
    pub message: String,
    pub hint: String,
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Arc<app::App>>();
}
