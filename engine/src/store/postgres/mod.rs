//! The run store on PostgreSQL: the same runs, journal and rules as the embedded SQLite store
//! ([`super::sqlite`]), kept in a server database that processes on many hosts share.
//!
//! The store's traits are synchronous and are called from inside the callers' tokio runtimes, so the store
//! has a runtime of its own (threads named `archon-postgres`, one per core, at least two): each call runs
//! its future there and waits for the answer on a channel, never blocking a caller's runtime on one of its
//! own futures (on a multi-threaded runtime the wait is `block_in_place`, which hands the thread's other
//! tasks to another thread first; so it is when the caller's runtime is the store's own). A run's
//! journal is a writer task on that runtime (`journal.rs`), which applies entries in order in batches, one
//! transaction each, fenced by the run's owner token, and renews the run's lease. `archon worker` runs
//! its steps on that runtime too ([`crate::store::Tasks::runtime`]): their store calls then stay on its
//! threads.
//!
//! A run's owner is alive while its lease lasts; on this host, while its process lives (as with SQLite).
//! Tables live in the connection's current schema (`search_path`); `schema.rs` creates and migrates them.
//! Agents' long-term memory lives there too (`run/memory/postgres.rs`, through [`PostgresStore::call`]).

mod commit;
mod journal;
mod queries;
mod schema;
mod tasks;
#[cfg(test)]
mod testing;
mod tls;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{
    CacheEntry, CacheFilter, CacheSummary, Firing, FiringFilter, Journal, LogChunk, NewRun, Owner,
    Pruned, RunFilter, RunPage, RunQuery, RunState, RunStore, RunSummary, StoreError, StoredRun,
    TriggerMark, now_ms,
};
use crate::report::{ApprovalDecision, ApprovalRequest};

pub use schema::SCHEMA_VERSION;
pub use tasks::WORKERS;

/// How long a run's lease lasts unless renewed; its owner renews it every third of that.
pub const LEASE: Duration = Duration::from_secs(15);
/// How long the server lets a connection sit idle inside a transaction before it ends the session.
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(5);
/// Most connections one store keeps open.
const POOL_SIZE: usize = 16;
/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `url` names a PostgreSQL database (`postgres://` or `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    let lower = url.trim_start().to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// `url` as it may be shown: the password (in the user part, or a `password=` parameter) as `***`.
pub fn masked(url: &str) -> String {
    let mut shown = url.to_owned();
    if let Some(start) = shown.find("://").map(|i| i + 3) {
        // As tokio-postgres reads it: the credentials run to the first `@`, wherever it is (a password
        // may hold a raw `/`, `?` or `#`), and the password from their first `:`.
        if let Some(at) = shown[start..].find('@').map(|i| start + i)
            && let Some(colon) = shown[start..at].find(':').map(|i| start + i)
        {
            shown.replace_range(colon + 1..at, "***");
        }
    }
    if let Some(query) = shown.find('?') {
        let (head, params) = shown.split_at(query + 1);
        let params: Vec<String> = params
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => p.to_owned(),
            })
            .collect();
        shown = format!("{head}{}", params.join("&"));
    }
    shown
}

/// How a store is opened: what tests change to play several hosts on one machine.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// The name this process's host goes by (default: the machine's name).
    pub host: String,
    pub lease: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host: super::sqlite::host(),
            lease: LEASE,
        }
    }
}

/// Runs kept in a PostgreSQL database. Cheap to clone: clones share the connections.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pool: deadpool_postgres::Pool,
    /// The URL as shown in messages (password masked).
    shown: String,
    /// The password, which no message may contain.
    secret: Option<String>,
    /// The local state directory (for the marks of processes that serve several runs).
    state_dir: Option<PathBuf>,
    options: Options,
    /// The ownership tokens of the runs this process owns, by run id.
    tokens: Mutex<HashMap<String, String>>,
    /// How to connect (for the connections that listen for cancels and work).
    config: tokio_postgres::Config,
    /// How those connections, and the pool's, make TLS (the URL's `sslmode` and the rest).
    tls: tls::Tls,
    /// The journals of this process that want to hear of `archon cancel` at once, by run id, and
    /// whether the connection that listens for it is up.
    cancels: Mutex<Cancels>,
    /// Woken when tasks may have become ready (`NOTIFY archon_work`); the listener starts on first use.
    work: Mutex<Option<Arc<tokio::sync::Notify>>>,
    /// The tasks renewing this process's worker registrations, by worker name (`tasks.rs`): a worker's
    /// deregistration waits for its renewal to end, so that a renewal under way cannot register it again.
    pub(crate) renewals: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// Applies the writes of this process's task journals together (`commit.rs`); started
    /// on first use.
    committer: OnceLock<commit::Committer>,
}

/// The runs whose journals listen for cancels (`NOTIFY archon_cancel, 'RUN'`), and the listener's state.
#[derive(Default)]
struct Cancels {
    /// By run id: a worker may record several steps of one run at once, each journal with its own.
    waiting: HashMap<String, Vec<Arc<tokio::sync::Notify>>>,
    /// Whether the connection that listens is up (`Some(true)`), being set up (`Some(false)`), or not
    /// there (`None`); `None` until the first journal.
    listening: Option<tokio::sync::watch::Sender<bool>>,
}

/// The channel `cancel` notifies, with the run id as payload.
const CANCEL_CHANNEL: &str = "archon_cancel";

/// Sent inside a transaction that makes tasks ready, so that idle workers hear of it once it commits
/// (a notification is delivered at commit, never before): the channel `archon_work`, the store's schema
/// as payload (stores in other schemas of the database ignore it).
pub(crate) const NOTIFY_WORK: &str = "SELECT pg_notify('archon_work', current_schema())";

/// The first wait before the work listener connects again; it doubles up to [`MOST_RELISTEN`].
const LEAST_RELISTEN: Duration = Duration::from_millis(100);
const MOST_RELISTEN: Duration = Duration::from_secs(5);

/// Leaves the password out.
impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.shown)
            .field("state_dir", &self.state_dir)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Most threads of the store's runtime ([`runtime`]): one per core, at least two (a worker's steps run
/// there too, `archon worker`), and no more than this.
const MOST_THREADS: usize = 16;

/// The runtime every PostgreSQL store of the process runs its futures on (and `archon worker` its steps).
fn runtime() -> Result<&'static tokio::runtime::Runtime, StoreError> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(cores.clamp(2, MOST_THREADS))
                .thread_name("archon-postgres")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| StoreError::new(format!("cannot start the run store's threads: {e}")))
}

/// Runs `wait`, which blocks its thread until the store's runtime answers. Called from a task of a
/// multi-threaded runtime (a worker's step, a server's request), the thread's other tasks are given to
/// another thread first, so that one store call does not hold them up.
pub(crate) fn blocking<T>(wait: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

/// A failure inside the store's futures: the server's, the pool's, or the store's own.
#[derive(Debug)]
pub(crate) enum Failure {
    Pg(tokio_postgres::Error),
    Pool(deadpool_postgres::PoolError),
    Store(StoreError),
    /// A write the committer could not apply because the connection failed before the commit was
    /// sent: nothing of it was kept, and it may be tried again (`commit.rs`).
    Transient(StoreError),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Pg(e)
    }
}

impl From<deadpool_postgres::PoolError> for Failure {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Failure::Pool(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

pub(crate) type Result<T, E = Failure> = std::result::Result<T, E>;

/// The stores opened in this process, by URL and state directory.
type Opened = Mutex<HashMap<(String, Option<PathBuf>), PostgresStore>>;

/// The stores opened by URL in this process, shared by every session that names the same one.
fn opened() -> &'static Opened {
    static OPENED: OnceLock<Opened> = OnceLock::new();
    OPENED.get_or_init(Mutex::default)
}

impl PostgresStore {
    /// Opens the store at `url` (once per process: later calls share its connections), creating or
    /// migrating its tables on first use. `state_dir` is the local state directory.
    pub fn open(url: &str, state_dir: Option<PathBuf>) -> Result<Self, StoreError> {
        let key = (url.to_owned(), state_dir.clone());
        if let Some(store) = opened().lock().ok().and_then(|o| o.get(&key).cloned()) {
            return Ok(store);
        }
        let store = Self::connect(url, state_dir, Options::default())?;
        store.migrate()?;
        if let Ok(mut opened) = opened().lock() {
            opened.insert(key, store.clone());
        }
        Ok(store)
    }

    /// Opens the store at `url` only when its tables exist; `Ok(None)` when they do not.
    pub fn open_existing(
        url: &str,
        state_dir: Option<PathBuf>,
    ) -> Result<Option<Self>, StoreError> {
        let key = (url.to_owned(), state_dir.clone());
        if let Some(store) = opened().lock().ok().and_then(|o| o.get(&key).cloned()) {
            return Ok(Some(store));
        }
        let store = Self::connect(url, state_dir, Options::default())?;
        let inner = store.inner.clone();
        if !store.run(async move { schema::exists(&inner).await })? {
            return Ok(None);
        }
        store.migrate()?;
        if let Ok(mut opened) = opened().lock() {
            opened.insert(key, store.clone());
        }
        Ok(Some(store))
    }

    /// A store of its own (not shared with other sessions), its tables not yet checked.
    pub(crate) fn connect(
        url: &str,
        state_dir: Option<PathBuf>,
        options: Options,
    ) -> Result<Self, StoreError> {
        let shown = masked(url);
        if !is_postgres_url(url) {
            return Err(refused_url(url));
        }
        let (rest, tls) = tls::from_url(url, &shown)?;
        let mut config: tokio_postgres::Config =
            rest.parse().map_err(|e: tokio_postgres::Error| {
                StoreError::new(format!(
                    "run store `{shown}` is not a valid PostgreSQL URL: {}",
                    lowercase(&e.to_string())
                ))
            })?;
        tls::configure(&mut config, &tls);
        let secret = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .filter(|p| !p.is_empty());
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("archon");
        }
        // Every commit is durable on the server when it is acknowledged, whatever the server's default.
        let given = config.get_options().unwrap_or("").to_owned();
        // A process frozen (or cut off) inside a transaction would hold its locks, the run's row among
        // them, for as long as the server keeps its connection: the server ends such a session instead.
        config.options(
            format!(
                "{given} -c synchronous_commit=on -c idle_in_transaction_session_timeout={}",
                IDLE_IN_TRANSACTION.as_millis()
            )
            .trim(),
        );
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            tls.connector.clone(),
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(60)))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::new(format!("run store `{shown}`: {e}")))?;
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                shown,
                secret,
                state_dir,
                options,
                tokens: Mutex::new(HashMap::new()),
                config,
                tls,
                cancels: Mutex::default(),
                work: Mutex::default(),
                renewals: Mutex::default(),
                committer: OnceLock::new(),
            }),
        })
    }

    /// Creates or migrates the store's tables.
    pub(crate) fn migrate(&self) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        self.run(async move { schema::migrate(&inner).await })
    }

    /// The URL as messages show it.
    pub fn shown(&self) -> &str {
        &self.inner.shown
    }

    /// Runs `future` on the store's runtime and waits for its outcome.
    fn run<T: Send + 'static>(
        &self,
        future: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        let (done, outcome) = std::sync::mpsc::sync_channel(1);
        runtime()?.spawn(async move {
            let result = future.await.map_err(|e| inner.error(e));
            let _ = done.send(result);
        });
        let wait = move || {
            outcome
                .recv()
                .unwrap_or_else(|_| Err(StoreError::new("the run store stopped")))
        };
        blocking(wait)
    }

    /// Runs `future` on the store's runtime, as [`PostgresStore::run`] does, for a caller that awaits
    /// its outcome rather than blocking its thread.
    fn spawn<T: Send + 'static>(
        &self,
        future: impl Future<Output = Result<T>> + Send + 'static,
    ) -> crate::store::StoreFuture<T> {
        let inner = self.inner.clone();
        let spawned = runtime()
            .map(|runtime| runtime.spawn(async move { future.await.map_err(|e| inner.error(e)) }));
        Box::pin(async move {
            spawned?
                .await
                .unwrap_or_else(|_| Err(StoreError::new("the run store stopped")))
        })
    }

    /// Runs `work`, given the store's connections, on the store's runtime and waits for its outcome: for
    /// what keeps its own tables in the store's database (agents' memory, `run::memory`).
    pub(crate) fn call<T: Send + 'static, F>(
        &self,
        work: impl FnOnce(Arc<Inner>) -> F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        self.run(work(self.inner.clone()))
    }

    /// A fresh ownership token for run `id`, remembered for its journal.
    fn new_token(&self, id: &str) -> String {
        let token = format!(
            "{}-{}-{}-{:016x}",
            self.inner.options.host,
            std::process::id(),
            now_ms(),
            fastrand::u64(..)
        );
        if let Ok(mut tokens) = self.inner.tokens.lock() {
            tokens.insert(id.to_owned(), token.clone());
        }
        token
    }

    /// Woken when tasks may have become ready; starts the listener on first use.
    fn work_signal(&self) -> Arc<tokio::sync::Notify> {
        let Ok(mut work) = self.inner.work.lock() else {
            return Arc::new(tokio::sync::Notify::new());
        };
        if let Some(notify) = work.as_ref() {
            return notify.clone();
        }
        let notify = Arc::new(tokio::sync::Notify::new());
        if let Ok(runtime) = runtime() {
            runtime.spawn(listen_for_work(
                Arc::downgrade(&self.inner),
                self.inner.config.clone(),
                self.inner.tls.connector.clone(),
                notify.clone(),
            ));
            *work = Some(notify.clone());
        }
        notify
    }

    fn forget_token(&self, id: &str) -> Option<String> {
        self.inner.tokens.lock().ok().and_then(|mut t| t.remove(id))
    }

    fn decide_pending(
        &self,
        id: &str,
        select: impl Fn(&ApprovalRequest) -> bool,
        decision: &ApprovalDecision,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let now = now_ms();
        let mut run = self.load(id)?;
        // A run submitted to workers takes decisions while its workers run its other steps.
        if run.status == RunState::Running && run.owner.as_ref().is_some_and(|o| o.host == WORKERS)
        {
            run.status = RunState::WaitingApproval;
        }
        let expired: Vec<String> = run
            .approvals
            .iter()
            .filter(|a| {
                a.decision.is_none()
                    && a.request
                        .timeout_ms
                        .is_some_and(|t| now.saturating_sub(a.requested_at) >= t)
            })
            .map(|a| a.request.key.clone())
            .collect();
        let pending = crate::store::pending_approvals(run, id, now, select)?;
        let inner = self.inner.clone();
        let (id_owned, decided, decision) = (id.to_owned(), pending.clone(), decision.clone());
        let still_waiting = self.run(async move {
            queries::decide(&inner, &id_owned, &decided, &decision, now, &expired).await
        })?;
        if !still_waiting {
            let mut error = StoreError::new(format!(
                "run `{id}` is no longer waiting for approval: a process took it up"
            ));
            error.unknown_run = true;
            return Err(error);
        }
        Ok(pending)
    }
}

impl Inner {
    /// Wakes the journal of run `id` when `archon cancel` asks for it (anywhere): from then on until
    /// [`Inner::unwatch`]. Starts the connection that listens, once; without it the journal still notices
    /// at its next commit or heartbeat.
    pub(crate) async fn watch(self: &Arc<Self>, id: &str) -> Arc<tokio::sync::Notify> {
        let notify = Arc::new(tokio::sync::Notify::new());
        let (mut up, start) = match self.cancels.lock() {
            Ok(mut cancels) => {
                cancels
                    .waiting
                    .entry(id.to_owned())
                    .or_default()
                    .push(notify.clone());
                match &cancels.listening {
                    Some(listening) => (Some(listening.subscribe()), None),
                    None => {
                        let (listening, up) = tokio::sync::watch::channel(false);
                        cancels.listening = Some(listening.clone());
                        (Some(up), Some(listening))
                    }
                }
            }
            Err(_) => (None, None),
        };
        if let Some(listening) = start {
            let inner = Arc::downgrade(self);
            let (config, connector) = (self.config.clone(), self.tls.connector.clone());
            tokio::spawn(async move {
                listen(&inner, &config, connector, &listening).await;
                if let Some(inner) = inner.upgrade()
                    && let Ok(mut cancels) = inner.cancels.lock()
                {
                    cancels.listening = None;
                }
            });
        }
        // The run records nothing a cancel could miss until the listener is up (or has failed).
        if let Some(up) = up.as_mut() {
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, up.wait_for(|up| *up)).await;
        }
        notify
    }

    /// Stops waking `notify`, which [`Inner::watch`] gave for run `id`.
    pub(crate) fn unwatch(&self, id: &str, notify: &Arc<tokio::sync::Notify>) {
        if let Ok(mut cancels) = self.cancels.lock()
            && let Some(journals) = cancels.waiting.get_mut(id)
        {
            journals.retain(|n| !Arc::ptr_eq(n, notify));
            if journals.is_empty() {
                cancels.waiting.remove(id);
            }
        }
    }

    /// The committers of this store, started on first use (on the store's runtime).
    fn committer(self: &Arc<Self>) -> &commit::Committer {
        self.committer
            .get_or_init(|| commit::Committer::spawn(Arc::downgrade(self)))
    }

    /// A connection from the pool.
    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object> {
        Ok(self.pool.get().await?)
    }

    /// Whether a run's owner is alive: on this host, its process exists and is the same process
    /// (whatever its lease says); on another host, its lease has not lapsed.
    pub(crate) fn is_alive(&self, owner: &Owner) -> bool {
        if owner.host != self.options.host {
            return owner.lease_until >= now_ms();
        }
        let exists = rustix::process::Pid::from_raw(owner.pid as i32).is_some_and(|pid| {
            rustix::process::test_kill_process(pid).is_ok() && !super::sqlite::is_zombie(owner.pid)
        });
        exists
            && owner.started.is_none_or(|started| {
                crate::process::process_start_time(owner.pid) == Some(started)
            })
    }

    /// A stored `running` run is running only while its owner lives.
    pub(crate) fn effective_state(&self, status: RunState, owner: Option<&Owner>) -> RunState {
        match status {
            RunState::Running if owner.is_some_and(|o| self.is_alive(o)) => RunState::Running,
            RunState::Running => RunState::Interrupted,
            state => state,
        }
    }

    /// `text` without the URL's password.
    fn scrub(&self, text: &str) -> String {
        match &self.secret {
            Some(secret) => text.replace(secret.as_str(), "***"),
            None => text.to_owned(),
        }
    }

    /// A failure as the user sees it, naming the store by its masked URL.
    pub(crate) fn error(&self, failure: Failure) -> StoreError {
        let shown = &self.shown;
        match failure {
            Failure::Store(e) | Failure::Transient(e) => StoreError {
                message: self.scrub(&e.message),
                hint: e.hint.map(|h| self.scrub(&h)),
                ..e
            },
            Failure::Pool(deadpool_postgres::PoolError::Backend(e)) | Failure::Pg(e) => {
                self.pg_error(&e)
            }
            Failure::Pool(deadpool_postgres::PoolError::Timeout(_)) => {
                StoreError::new(format!("cannot reach the run store `{shown}`: timed out"))
                    .with_hint("check that the PostgreSQL server is up and reachable from here")
            }
            Failure::Pool(e) => StoreError::new(format!(
                "run store `{shown}`: {}",
                self.scrub(&lowercase(&e.to_string()))
            )),
        }
    }

    fn pg_error(&self, e: &tokio_postgres::Error) -> StoreError {
        let shown = &self.shown;
        if let Some(db) = e.as_db_error() {
            return StoreError::new(format!(
                "run store `{shown}`: {}",
                self.scrub(&lowercase(db.message()))
            ));
        }
        if let Some((message, hint)) = tls::explain(e, &self.tls) {
            let error = StoreError::new(format!("run store `{shown}`: {}", self.scrub(&message)));
            return match hint {
                Some(hint) => error.with_hint(hint),
                None => error,
            };
        }
        // The cause says what went wrong (`connection refused`); the error itself only that it did.
        let mut detail = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !detail.contains(&cause_text) {
                detail = format!("{detail}: {cause_text}");
            }
            source = cause.source();
        }
        let detail = self.scrub(&detail.to_lowercase());
        // Refused, dropped or reset: the server cannot be reached (for now), whatever the query was.
        if e.is_closed()
            || detail.contains("error connecting")
            || detail.contains("error communicating")
        {
            let sockets = tls::sockets(&self.config);
            let hint = if sockets.is_empty() {
                "check that the PostgreSQL server is up and reachable from here".to_owned()
            } else {
                format!(
                    "check that the PostgreSQL server is up and listens on `{}` (the URL's host is the socket's directory)",
                    sockets.join("`, `")
                )
            };
            StoreError::new(format!("cannot reach the run store `{shown}`: {detail}"))
                .with_hint(hint)
        } else {
            StoreError::new(format!("run store `{shown}`: {detail}"))
        }
    }
}

/// Listens for cancels until the connection fails or the store is gone, waking the journals they name
/// (a notification from another schema of the same database wakes a journal for nothing: it only looks).
async fn listen(
    inner: &std::sync::Weak<Inner>,
    config: &tokio_postgres::Config,
    connector: tls::Connector,
    listening: &tokio::sync::watch::Sender<bool>,
) {
    let Ok((client, mut connection)) = config.connect(connector).await else {
        return;
    };
    let (messages, mut received) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        while let Some(message) =
            futures_util::future::poll_fn(|cx| connection.poll_message(cx)).await
        {
            match message {
                Ok(message) => {
                    if messages.send(message).is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    });
    if client
        .batch_execute(&format!("LISTEN {CANCEL_CHANNEL}"))
        .await
        .is_ok()
    {
        listening.send_replace(true);
        while let Some(message) = received.recv().await {
            let Some(inner) = inner.upgrade() else { break };
            if let tokio_postgres::AsyncMessage::Notification(n) = message
                && let Ok(cancels) = inner.cancels.lock()
                && let Some(journals) = cancels.waiting.get(n.payload())
            {
                for notify in journals {
                    notify.notify_one();
                }
            }
        }
    }
    driver.abort();
}

/// Listens for `NOTIFY archon_work` while the store lives, connecting again with backoff whenever the
/// connection fails; `notify` is woken by each notification for this store's schema, and each time the
/// listener is up again (what was made ready while nobody listened is found by looking).
async fn listen_for_work(
    inner: std::sync::Weak<Inner>,
    config: tokio_postgres::Config,
    connector: tls::Connector,
    notify: Arc<tokio::sync::Notify>,
) {
    let mut wait = LEAST_RELISTEN;
    while inner.strong_count() > 0 {
        if listen_for_work_once(&config, connector.clone(), &notify).await {
            wait = LEAST_RELISTEN;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MOST_RELISTEN);
    }
}

/// One connection's listening; whether it got as far as listening.
async fn listen_for_work_once(
    config: &tokio_postgres::Config,
    connector: tls::Connector,
    notify: &tokio::sync::Notify,
) -> bool {
    let Ok((client, mut connection)) = config.connect(connector).await else {
        return false;
    };
    let (messages, mut received) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        while let Some(message) =
            futures_util::future::poll_fn(|cx| connection.poll_message(cx)).await
        {
            match message {
                Ok(message) => {
                    if messages.send(message).is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    });
    let schema: Option<String> = match client.query_one("SELECT current_schema()::text", &[]).await
    {
        Ok(row) => row.get(0),
        Err(_) => {
            driver.abort();
            return false;
        }
    };
    if client.batch_execute("LISTEN archon_work").await.is_err() {
        driver.abort();
        return false;
    }
    notify.notify_one();
    while let Some(message) = received.recv().await {
        if let tokio_postgres::AsyncMessage::Notification(n) = message
            && schema.as_deref().is_none_or(|s| s == n.payload())
        {
            notify.notify_one();
        }
    }
    driver.abort();
    true
}

/// The message of a store URL this archon cannot open.
pub fn refused_url(url: &str) -> StoreError {
    StoreError::new(format!(
        "unsupported run store `{}`: only PostgreSQL URLs (`postgres://` or `postgresql://`) are supported",
        masked(url)
    ))
    .with_hint("leave `--store` (and `ARCHON_STORE`) out to keep runs in the state directory")
}

fn lowercase(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

impl RunStore for PostgresStore {
    fn location(&self) -> Option<PathBuf> {
        self.inner.state_dir.clone()
    }

    fn memory_database(&self) -> Option<PostgresStore> {
        Some(self.clone())
    }

    fn create_run(&self, run: &NewRun) -> Result<(), StoreError> {
        let token = self.new_token(&run.id);
        let inner = self.inner.clone();
        let run = run.clone();
        self.run(async move { queries::create_run(&inner, &run, &token).await })
    }

    fn claim(&self, id: &str, allowed: &[RunState]) -> Result<RunState, StoreError> {
        let token = self.new_token(id);
        let inner = self.inner.clone();
        let (id_owned, allowed) = (id.to_owned(), allowed.to_vec());
        let outcome =
            self.run(async move { queries::claim(&inner, &id_owned, &allowed, &token).await });
        if outcome.is_err() {
            self.forget_token(id);
        }
        outcome
    }

    fn release(&self, id: &str, status: RunState) -> Result<(), StoreError> {
        let token = self.forget_token(id);
        let inner = self.inner.clone();
        let id = id.to_owned();
        self.run(async move { queries::release(&inner, &id, status, token.as_deref()).await })
    }

    fn forget_results(&self, id: &str, steps: &[String]) -> Result<u32, StoreError> {
        let inner = self.inner.clone();
        let (id, steps) = (id.to_owned(), steps.to_vec());
        self.run(async move { queries::forget_results(&inner, &id, &steps).await })
    }

    fn decide(
        &self,
        id: &str,
        step: Option<&str>,
        decision: &ApprovalDecision,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        self.decide_pending(id, |r| crate::store::asked_within(r, step), decision)
    }

    fn decide_call(
        &self,
        id: &str,
        key: &str,
        decision: &ApprovalDecision,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        Ok(self
            .decide_pending(id, |r| r.key == key, decision)?
            .into_iter()
            .next())
    }

    /// Asks the run to stop for good: a live owner notices at its next commit or heartbeat (and is sent
    /// SIGTERM when it runs on this host and serves only this run); a run nobody owns is cancelled at once.
    fn cancel(&self, id: &str) -> Result<RunState, StoreError> {
        let run = self.load(id)?;
        match run.status {
            RunState::Succeeded | RunState::Failed | RunState::Cancelled => Ok(run.status),
            RunState::Running => {
                let inner = self.inner.clone();
                let id_owned = id.to_owned();
                let signalled =
                    self.run(async move { queries::request_cancel(&inner, &id_owned).await })?;
                // Only the process `load` found alive, on this host, serving only this run.
                if let Some((pid, host)) = signalled
                    && host == self.inner.options.host
                    && pid != std::process::id()
                    && run
                        .owner
                        .as_ref()
                        .is_some_and(|o| o.pid == pid && o.host == host)
                {
                    let _ = rustix::process::Pid::from_raw(pid as i32).map(|pid| {
                        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
                    });
                }
                // A submitted run no worker is working on ends at once; else when its steps stop.
                if run.owner.as_ref().is_some_and(|o| o.host == WORKERS) {
                    super::Tasks::reap(self)?;
                    return Ok(self.load_brief(id)?.status);
                }
                Ok(RunState::Running)
            }
            RunState::Interrupted | RunState::WaitingApproval => {
                let inner = self.inner.clone();
                let id_owned = id.to_owned();
                let changed =
                    self.run(async move { queries::cancel_idle(&inner, &id_owned).await })?;
                if changed {
                    Ok(RunState::Cancelled)
                } else {
                    self.cancel(id)
                }
            }
        }
    }

    fn list(&self) -> Result<Vec<RunSummary>, StoreError> {
        self.list_where(&RunFilter::default())
    }

    fn list_where(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        let inner = self.inner.clone();
        let filter = filter.clone();
        self.run(async move { queries::list_where(&inner, &filter).await })
    }

    fn with_prefix(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<(Vec<RunSummary>, usize), StoreError> {
        let inner = self.inner.clone();
        let prefix = prefix.to_owned();
        self.run(async move { queries::with_prefix(&inner, &prefix, limit).await })
    }

    fn prune(&self, finished_before: u64, dry_run: bool) -> Result<Pruned, StoreError> {
        let inner = self.inner.clone();
        self.run(async move { queries::prune(&inner, finished_before, dry_run).await })
    }

    fn page(&self, query: &RunQuery) -> Result<RunPage, StoreError> {
        let inner = self.inner.clone();
        let query = query.clone();
        self.run(async move { queries::page(&inner, &query).await })
    }

    fn summary(&self, id: &str) -> Result<Option<RunSummary>, StoreError> {
        let inner = self.inner.clone();
        let id = id.to_owned();
        self.run(async move { queries::summary(&inner, &id).await })
    }

    fn changed_since(&self, since: u64) -> Result<Vec<RunSummary>, StoreError> {
        let inner = self.inner.clone();
        self.run(async move { queries::changed_since(&inner, since).await })
    }

    /// The store's change counter: a sequence every write transaction advances once it committed.
    fn changes(&self) -> Result<Option<u64>, StoreError> {
        let inner = self.inner.clone();
        self.run(async move { queries::changes(&inner).await })
            .map(Some)
    }

    fn events_after(
        &self,
        id: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, serde_json::Value)>, StoreError> {
        let inner = self.inner.clone();
        let id = id.to_owned();
        self.run(async move { queries::events_after(&inner, &id, after, limit).await })
    }

    fn last_event(&self, id: &str) -> Result<i64, StoreError> {
        let inner = self.inner.clone();
        let id = id.to_owned();
        self.run(async move { queries::last_event(&inner, &id).await })
    }

    fn logs_after(&self, id: &str, after: i64, limit: usize) -> Result<Vec<LogChunk>, StoreError> {
        let inner = self.inner.clone();
        let id = id.to_owned();
        self.run(async move { queries::logs_after(&inner, &id, after, limit).await })
    }

    fn load(&self, id: &str) -> Result<StoredRun, StoreError> {
        let inner = self.inner.clone();
        let id = id.to_owned();
        self.run(async move { queries::load(&inner, &id, true, None).await })
    }

    fn load_brief(&self, id: &str) -> Result<StoredRun, StoreError> {
        let inner = self.inner.clone();
        let id = id.to_owned();
        self.run(async move { queries::load(&inner, &id, false, None).await })
    }

    fn files(&self, id: &str) -> Result<Vec<(String, String)>, StoreError> {
        let inner = self.inner.clone();
        let id = id.to_owned();
        self.run(async move { queries::files(&inner, &id).await })
    }

    fn replace_files(&self, id: &str, files: &[(String, String)]) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let (id, files) = (id.to_owned(), files.to_vec());
        self.run(async move { queries::replace_files(&inner, &id, &files).await })
    }

    fn events(&self, id: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        Ok(self
            .events_after(id, 0, usize::MAX)?
            .into_iter()
            .map(|(_, event)| event)
            .collect())
    }

    fn logs(&self, id: &str, after: i64) -> Result<Vec<LogChunk>, StoreError> {
        self.logs_after(id, after, usize::MAX)
    }

    fn check(&self) -> Result<Vec<String>, StoreError> {
        let inner = self.inner.clone();
        self.run(async move { queries::check(&inner).await })
    }

    fn cache_entries(&self, workflows: &[String], now: u64) -> Result<Vec<CacheEntry>, StoreError> {
        let inner = self.inner.clone();
        let workflows = workflows.to_vec();
        self.run(async move { queries::cache_entries(&inner, &workflows, now).await })
    }

    fn step_cache_entries(
        &self,
        workflow: &str,
        step: &str,
        others: &[String],
        now: u64,
    ) -> Result<Vec<CacheEntry>, StoreError> {
        let inner = self.inner.clone();
        let (workflow, step, others) = (workflow.to_owned(), step.to_owned(), others.to_vec());
        self.run(async move {
            queries::step_cache_entries(&inner, (&workflow, &step), &others, now).await
        })
    }

    fn cache_list(&self) -> Result<Vec<CacheSummary>, StoreError> {
        let inner = self.inner.clone();
        self.run(async move { queries::cache_list(&inner).await })
    }

    fn cache_clear(&self, filter: &CacheFilter, now: u64) -> Result<usize, StoreError> {
        let inner = self.inner.clone();
        let filter = filter.clone();
        self.run(async move { queries::cache_clear(&inner, &filter, now).await })
    }

    fn record_firing(&self, firing: &Firing) -> Result<bool, StoreError> {
        let inner = self.inner.clone();
        let firing = firing.clone();
        self.run(async move { queries::record_firing(&inner, &firing).await })
    }

    fn last_firing(&self, workflow: &str, trigger: &str) -> Result<Option<Firing>, StoreError> {
        let inner = self.inner.clone();
        let (workflow, trigger) = (workflow.to_owned(), trigger.to_owned());
        self.run(async move { queries::last_firing(&inner, &workflow, &trigger).await })
    }

    fn firings(&self, filter: &FiringFilter) -> Result<Vec<Firing>, StoreError> {
        let inner = self.inner.clone();
        let filter = filter.clone();
        self.run(async move { queries::firings(&inner, &filter).await })
    }

    fn unstarted_firings(&self) -> Result<Vec<Firing>, StoreError> {
        let inner = self.inner.clone();
        self.run(async move { queries::unstarted_firings(&inner).await })
    }

    fn skip_unstarted_firing(&self, run_id: &str, reason: &str) -> Result<bool, StoreError> {
        let inner = self.inner.clone();
        let (run_id, reason) = (run_id.to_owned(), reason.to_owned());
        self.run(async move { queries::skip_unstarted_firing(&inner, &run_id, &reason).await })
    }

    fn arm_trigger(
        &self,
        workflow: &str,
        trigger: &str,
        now: u64,
    ) -> Result<TriggerMark, StoreError> {
        let inner = self.inner.clone();
        let (workflow, trigger) = (workflow.to_owned(), trigger.to_owned());
        self.run(async move { queries::arm_trigger(&inner, &workflow, &trigger, now).await })
    }

    fn journal(&self, id: &str, cancel: CancellationToken) -> Result<Arc<dyn Journal>, StoreError> {
        let token = self
            .inner
            .tokens
            .lock()
            .ok()
            .and_then(|t| t.get(id).cloned())
            .ok_or_else(|| {
                StoreError::new(format!("this process does not own run `{id}`"))
                    .with_hint("a run is recorded by the process that created or claimed it")
            })?;
        let inner = self.inner.clone();
        let id_owned = id.to_owned();
        let start =
            self.run(async move { journal::Writer::start(inner, id_owned, token).await })?;
        Ok(Arc::new(journal::PgJournal::spawn(
            start,
            cancel,
            runtime()?,
        )))
    }

    fn tasks(&self) -> Option<&dyn super::Tasks> {
        Some(self)
    }
}
