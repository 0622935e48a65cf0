//! One connection to an MCP server (rmcp): a child process in its own process group speaking MCP on its
//! standard input and output, or streamable HTTP; `initialize` within `startup_timeout`, `tools/list` over
//! every page, calls with progress, timeouts and cancellation.

use std::collections::HashMap;
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, CancelledNotification, CancelledNotificationParam,
    ClientConfig, ClientNotification, ClientRequest, Implementation, JsonObject, ListToolsRequest,
    PaginatedRequestParams, Request, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{ServerConfig, ServersOptions, Transport};
use crate::network::{GuardedResolver, check_url};
use crate::redact::Redactor;
use crate::tools::{ErrorClass, ToolError};

/// Most bytes of one message a server may send: a longer one fails the call, and the server, whose
/// stream can no longer be read in step, is restarted.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Bytes of a server's standard error kept (its tail).
const STDERR_KEPT_BYTES: usize = 16 * 1024;
/// Bytes of that tail quoted in an error.
const STDERR_QUOTED_BYTES: usize = 2 * 1024;
/// Most pages of `tools/list` read, and most tools kept.
const MAX_PAGES: usize = 1000;
const MAX_TOOLS: usize = 10_000;
/// How long a server has to exit after its input closes, then after SIGTERM.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
const TERM_GRACE: Duration = Duration::from_secs(2);

/// Why a streamable HTTP server could not be reached, as a person reads it: the innermost cause of an
/// HTTP client error (`connection refused (os error 111)`), without rmcp's layers of transport types.
fn unreachable_why(error: &rmcp::service::ClientInitializeError) -> String {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let rmcp::service::ClientInitializeError::TransportError { error, .. } = error else {
        return error.to_string();
    };
    let inner: &(dyn std::error::Error + Send + Sync + 'static) = &*error.error;
    let Some(StreamableHttpError::Client(client)) =
        inner.downcast_ref::<StreamableHttpError<reqwest::Error>>()
    else {
        return inner.to_string();
    };
    let mut innermost: &(dyn std::error::Error + 'static) = client;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    lowercase_first(&innermost.to_string())
}

/// `text` with its first letter lowercase, as errors are written (`Connection refused` becomes
/// `connection refused`), unless it begins an acronym (`URL`).
fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(first), Some(second)) if first.is_uppercase() && second.is_lowercase() => {
            first.to_lowercase().chain(text.chars().skip(1)).collect()
        }
        _ => text.to_owned(),
    }
}

/// What the client side tells the pool.
#[derive(Clone, Debug, Default)]
pub(crate) struct Handler {
    /// Set by `notifications/tools/list_changed`.
    pub stale: Arc<AtomicBool>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.stale.store(true, Ordering::SeqCst);
    }

    fn get_info(&self) -> ClientConfig {
        let mut config = ClientConfig::default();
        config.client_info = Implementation::new("archon", env!("CARGO_PKG_VERSION"));
        config
    }
}

/// How long a call may take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallLimits {
    /// Without news (a result or progress).
    pub quiet: Duration,
    /// What is left of the time in all.
    pub total: Duration,
    /// The time in all, as errors name it.
    pub named: Duration,
    /// Whether the time in all is the step's limit rather than the server's `max_call_timeout`.
    pub step_limit: bool,
}

/// Why a call failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The connection is gone (the server exited, or closed it): the message says why.
    Gone(String),
    /// Any other failure, the connection still usable.
    Call(ToolError),
}

/// One started server.
pub(crate) struct Connection {
    name: String,
    service: RunningService<RoleClient, Handler>,
    pub stale: Arc<AtomicBool>,
    process: Option<Process>,
    /// Set when the server sent a message larger than [`MAX_MESSAGE_BYTES`].
    overflow: Arc<AtomicBool>,
    url: Option<String>,
    redactor: Arc<Redactor>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("name", &self.name)
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Starts the server and initialises it within its `startup_timeout`.
    pub(crate) async fn start(
        config: &ServerConfig,
        options: &ServersOptions,
    ) -> Result<Connection, ToolError> {
        let name = &config.name;
        let handler = Handler::default();
        let stale = handler.stale.clone();
        let startup = config.limits.startup_timeout;
        match &config.transport {
            Transport::Stdio { argv, env, cwd } => {
                let Some(program) = argv.first() else {
                    return Err(ToolError::permanent(format!(
                        "MCP server `{name}` has an empty `command`"
                    )));
                };
                let mut command = tokio::process::Command::new(program);
                command
                    .args(&argv[1..])
                    .current_dir(cwd)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .process_group(0)
                    .kill_on_drop(true);
                for variable in &options.withheld {
                    command.env_remove(variable);
                }
                command.envs(env.iter().map(|(k, v)| (k, v)));
                // Like a command's: what leaves the server's group and session is found by this tag.
                let tag = crate::process::new_tag();
                command.env(crate::process::TAG_VAR, &tag);
                let mut child = command.spawn().map_err(|e| {
                    let why = match e.kind() {
                        std::io::ErrorKind::NotFound if !program.contains('/') => format!(
                            "`{program}` is not found on `PATH`\ninstall it, or give its path in `command`"
                        ),
                        std::io::ErrorKind::NotFound => format!("`{program}` does not exist"),
                        _ => format!("`{program}`: {}", lowercase_first(&e.to_string())),
                    };
                    ToolError::new(format!("cannot start MCP server `{name}`: {why}"))
                        .of(ErrorClass::Connect)
                })?;
                let (Some(pid), Some(stdin), Some(stdout), Some(stderr)) = (
                    child.id(),
                    child.stdin.take(),
                    child.stdout.take(),
                    child.stderr.take(),
                ) else {
                    return Err(ToolError::new(format!(
                        "cannot start MCP server `{name}`: its pipes are missing"
                    ))
                    .of(ErrorClass::Connect));
                };
                (options.on_spawn)(pid);
                let tracked = crate::process::Tracked::new(pid, tag);
                let process = Process::watch(pid, child, tracked, stderr, options.redactor.clone());
                let overflow = Arc::new(AtomicBool::new(false));
                let reader = Bounded {
                    inner: stdout,
                    line: 0,
                    overflow: overflow.clone(),
                };
                let transport =
                    AsyncRwTransport::new_client(reader, stdin).with_max_line_length(usize::MAX);
                let started = tokio::time::timeout(startup, handler.serve(transport)).await;
                match started {
                    Ok(Ok(service)) => Ok(Connection {
                        name: name.clone(),
                        service,
                        stale,
                        process: Some(process),
                        overflow,
                        url: None,
                        redactor: options.redactor.clone(),
                    }),
                    Ok(Err(error)) => {
                        let why = match process.exited(TERM_GRACE).await {
                            Some(status) => format!("exited with {}", status_text(status)),
                            None => format!("failed to initialize: {error}"),
                        };
                        let tail = process.tail();
                        process.stop().await;
                        Err(ToolError::new(format!(
                            "MCP server `{name}` {why} during `initialize`{tail}"
                        ))
                        .of(ErrorClass::Connect))
                    }
                    Err(_) => {
                        let tail = process.tail();
                        process.stop().await;
                        Err(ToolError::new(format!(
                            "MCP server `{name}` did not initialize within {}{tail}",
                            humantime::format_duration(startup)
                        ))
                        .of(ErrorClass::Connect))
                    }
                }
            }
            Transport::Http { url, headers } => {
                let _ = rustls::crypto::ring::default_provider().install_default();
                let parsed = reqwest::Url::parse(url).map_err(|e| {
                    ToolError::permanent(format!(
                        "invalid URL `{url}` for MCP server `{name}`: {e}"
                    ))
                })?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(ToolError::permanent(format!(
                        "MCP server `{name}`: `{url}` is not an http or https URL"
                    )));
                }
                check_url(&parsed, &options.network, "MCP").map_err(ToolError::permanent)?;
                let client = reqwest::Client::builder()
                    .dns_resolver(Arc::new(GuardedResolver::new(
                        options.network.clone(),
                        "MCP",
                    )))
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(Duration::from_secs(10).min(startup))
                    .no_proxy()
                    .build()
                    .map_err(|e| ToolError::new(format!("cannot set up HTTP: {e}")))?;
                let mut custom = HashMap::new();
                for (key, value) in headers {
                    let header =
                        reqwest::header::HeaderName::from_bytes(key.as_bytes()).map_err(|_| {
                            ToolError::permanent(format!(
                                "invalid header name `{key}` for MCP server `{name}`"
                            ))
                        })?;
                    let value = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
                        ToolError::permanent(format!(
                            "invalid value of header `{key}` for MCP server `{name}`"
                        ))
                    })?;
                    custom.insert(header, value);
                }
                let transport = StreamableHttpClientTransport::with_client(
                    client,
                    StreamableHttpClientTransportConfig::with_uri(url.as_str())
                        .custom_headers(custom)
                        .max_sse_event_size(MAX_MESSAGE_BYTES)
                        .max_json_response_size(MAX_MESSAGE_BYTES),
                );
                let started = tokio::time::timeout(startup, handler.serve(transport)).await;
                let redactor = &options.redactor;
                match started {
                    Ok(Ok(service)) => Ok(Connection {
                        name: name.clone(),
                        service,
                        stale,
                        process: None,
                        overflow: Arc::new(AtomicBool::new(false)),
                        url: Some(url.clone()),
                        redactor: redactor.clone(),
                    }),
                    Ok(Err(error)) => {
                        let error = redactor.text(&unreachable_why(&error)).into_owned();
                        let class = if error.contains("which MCP refuses") {
                            ErrorClass::Permanent
                        } else {
                            ErrorClass::Connect
                        };
                        Err(ToolError::new(format!(
                            "cannot reach MCP server `{name}` at `{url}`: {error}"
                        ))
                        .of(class))
                    }
                    Err(_) => Err(ToolError::new(format!(
                        "MCP server `{name}` at `{url}` did not initialize within {}",
                        humantime::format_duration(startup)
                    ))
                    .of(ErrorClass::Connect)),
                }
            }
        }
    }

    /// Whether the connection can still carry calls.
    pub(crate) fn alive(&self) -> bool {
        !self.service.is_closed()
            && !self.overflow.load(Ordering::SeqCst)
            && self.process.as_ref().is_none_or(|p| p.status().is_none())
    }

    /// Every tool the server lists (every page).
    pub(crate) async fn list(&self, timeout: Duration) -> Result<Vec<rmcp::model::Tool>, Failure> {
        let mut tools = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_PAGES {
            let params = PaginatedRequestParams::default().with_cursor(cursor.take());
            let request = ClientRequest::ListToolsRequest(ListToolsRequest::with_param(params));
            let response = self
                .service
                .peer()
                .send_request_with_option(request, PeerRequestOptions::with_timeout(timeout))
                .await;
            let response = match response {
                Ok(handle) => handle.await_response().await,
                Err(error) => Err(error),
            };
            let page = match response {
                Ok(ServerResult::ListToolsResult(page)) => page,
                Ok(_) => {
                    return Err(Failure::Call(ToolError::new(format!(
                        "MCP server `{}` answered `tools/list` with something else",
                        self.name
                    ))));
                }
                Err(error) => return Err(self.failure("tools/list", error, None).await),
            };
            tools.extend(page.tools);
            if tools.len() > MAX_TOOLS {
                return Err(Failure::Call(ToolError::new(format!(
                    "MCP server `{}` lists more than {MAX_TOOLS} tools",
                    self.name
                ))));
            }
            match page.next_cursor {
                Some(next) if !next.is_empty() => cursor = Some(next),
                _ => return Ok(tools),
            }
        }
        Err(Failure::Call(ToolError::new(format!(
            "MCP server `{}` lists tools over more than {MAX_PAGES} pages",
            self.name
        ))))
    }

    /// Calls `tool`; on timeout or cancellation the server is sent `notifications/cancelled`.
    pub(crate) async fn call(
        &self,
        tool: &str,
        args: JsonObject,
        limits: CallLimits,
        cancel: &CancellationToken,
    ) -> Result<CallToolResult, Failure> {
        let started = Instant::now();
        let options = PeerRequestOptions::with_timeout(limits.quiet.min(limits.total))
            .reset_timeout_on_progress()
            .with_max_total_timeout(limits.total);
        let request = ClientRequest::CallToolRequest(Request::new(
            CallToolRequestParams::new(tool.to_owned()).with_arguments(args),
        ));
        let handle = match self
            .service
            .peer()
            .send_request_with_option(request, options)
            .await
        {
            Ok(handle) => handle,
            Err(error) => return Err(self.failure("tools/call", error, None).await),
        };
        // Armed while the answer is awaited: a caller that stops waiting (a step's timeout drops the
        // call) tells the server too.
        let mut abandoned = Abandoned {
            peer: Some(handle.peer.clone()),
            id: handle.id.clone(),
        };
        let response = tokio::select! {
            response = handle.await_response() => response,
            () = cancel.cancelled() => {
                if let Some(peer) = abandoned.peer.take() {
                    let _ = tokio::time::timeout(
                        CLOSE_GRACE,
                        peer.send_notification(cancelled(abandoned.id.clone())),
                    )
                    .await;
                }
                return Err(Failure::Call(ToolError::new("cancelled")));
            }
        };
        abandoned.peer = None;
        match response {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(_) => Err(Failure::Call(ToolError::new(format!(
                "MCP server `{}` answered `tools/call` with something else",
                self.name
            )))),
            Err(error) => Err(self
                .failure("tools/call", error, Some((tool, limits, started)))
                .await),
        }
    }

    /// What a failed request means.
    async fn failure(
        &self,
        method: &str,
        error: ServiceError,
        call: Option<(&str, CallLimits, Instant)>,
    ) -> Failure {
        let name = &self.name;
        let what = match call {
            Some((tool, ..)) => format!("`{name}.{tool}`"),
            None => format!("`{name}` `{method}`"),
        };
        match error {
            ServiceError::Timeout { timeout } => {
                let message = match call {
                    Some((_, limits, started))
                        if timeout >= limits.total || started.elapsed() >= limits.total =>
                    {
                        let limit = if limits.step_limit {
                            "the step's time"
                        } else {
                            "`max_call_timeout`"
                        };
                        format!(
                            "{what} timed out after {} ({limit})",
                            humantime::format_duration(limits.named)
                        )
                    }
                    _ => format!(
                        "{what} timed out after {} without progress (`call_timeout`)",
                        humantime::format_duration(timeout)
                    ),
                };
                Failure::Call(ToolError::new(message))
            }
            ServiceError::McpError(data) => {
                let message = bounded(&self.redact(&data.message), 4096);
                let class = if data.code == rmcp::model::ErrorCode::INVALID_PARAMS
                    || data.code == rmcp::model::ErrorCode::METHOD_NOT_FOUND
                {
                    ErrorClass::Permanent
                } else {
                    ErrorClass::Other
                };
                Failure::Call(
                    ToolError::new(format!("MCP server `{name}` refused `{method}`: {message}"))
                        .of(class),
                )
            }
            error => Failure::Gone(self.gone(method, &error).await),
        }
    }

    /// Why the connection ended, as the error of the request that met it.
    async fn gone(&self, method: &str, error: &ServiceError) -> String {
        let name = &self.name;
        if self.overflow.load(Ordering::SeqCst) {
            return format!(
                "MCP server `{name}` sent a message larger than {} MiB during `{method}`",
                MAX_MESSAGE_BYTES / (1024 * 1024)
            );
        }
        match &self.process {
            Some(process) => {
                let tail = process.tail();
                match process.exited(TERM_GRACE).await {
                    Some(status) => format!(
                        "MCP server `{name}` exited with {} during `{method}`{tail}",
                        status_text(status)
                    ),
                    None => {
                        format!("MCP server `{name}` closed the connection during `{method}`{tail}")
                    }
                }
            }
            None => {
                let url = self.url.as_deref().unwrap_or_default();
                let error = bounded(&self.redact(&error.to_string()), 1024);
                format!(
                    "MCP server `{name}` at `{url}` broke the connection during `{method}`: {error}"
                )
            }
        }
    }

    fn redact(&self, text: &str) -> String {
        self.redactor.text(text).into_owned()
    }

    /// MCP close (the connection ends; a child's input closes), then the whole process group: SIGTERM,
    /// then SIGKILL.
    pub(crate) async fn shutdown(&self) {
        self.service.cancellation_token().cancel();
        if let Some(process) = &self.process {
            let _ = process.exited(CLOSE_GRACE).await;
            process.stop().await;
        }
    }
}

/// A server's child process: its process group, exit status and standard error's tail.
struct Process {
    pgid: Pid,
    exit: watch::Receiver<Option<ExitStatus>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    redactor: Arc<Redactor>,
    /// Set once the group was killed on purpose.
    stopped: AtomicBool,
    /// The server's processes, until they are swept: when it exits (by the task that waits for it), or
    /// when it is stopped or dropped before that task could.
    tracked: Arc<Mutex<Option<crate::process::Tracked>>>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pgid", &self.pgid)
            .finish_non_exhaustive()
    }
}

impl Process {
    fn watch(
        pid: u32,
        mut child: tokio::process::Child,
        tracked: crate::process::Tracked,
        mut stderr: tokio::process::ChildStderr,
        redactor: Arc<Redactor>,
    ) -> Process {
        let (sender, exit) = watch::channel(None);
        let tracked = Arc::new(Mutex::new(Some(tracked)));
        let swept = tracked.clone();
        tokio::spawn(async move {
            if let Ok(status) = child.wait().await {
                // What the server left running goes with it: its group, and what left the group or
                // the session (found by its tag), which then no longer holds its output open, so the
                // connection sees the end.
                if let Some(tracked) = swept.lock().ok().and_then(|mut t| t.take()) {
                    tracked.exited();
                }
                let _ = sender.send(Some(status));
            }
        });
        #[allow(clippy::cast_possible_wrap)]
        let pgid = Pid::from_raw(pid as i32);
        let kept = Arc::new(Mutex::new(Vec::new()));
        let tail = kept.clone();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 8192];
            loop {
                match stderr.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let Ok(mut kept) = tail.lock() else { break };
                        kept.extend_from_slice(&buffer[..n]);
                        if kept.len() > STDERR_KEPT_BYTES {
                            let excess = kept.len() - STDERR_KEPT_BYTES;
                            kept.drain(..excess);
                        }
                    }
                }
            }
        });
        Process {
            pgid,
            exit,
            stderr: kept,
            redactor,
            stopped: AtomicBool::new(false),
            tracked,
        }
    }

    /// Sweeps what the server left running now, unless the task that waits for it did already.
    fn sweep(&self) {
        let tracked = self.tracked.lock().ok().and_then(|mut t| t.take());
        // Dropped before it exited is a command abandoned: its group and descendants are killed.
        drop(tracked);
    }

    fn status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// Waits at most `grace` for the process to exit.
    async fn exited(&self, grace: Duration) -> Option<ExitStatus> {
        let mut exit = self.exit.clone();
        let waited = tokio::time::timeout(grace, exit.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(status)) => *status,
            _ => self.status(),
        }
    }

    /// The end of what the server wrote to standard error, secrets masked, as `: <text>` (nothing when
    /// it wrote nothing).
    fn tail(&self) -> String {
        let kept = match self.stderr.lock() {
            Ok(kept) => String::from_utf8_lossy(&kept).into_owned(),
            Err(_) => return String::new(),
        };
        // Masked before it is cut: a secret at the start of what is kept may be split, so the part
        // quoted starts well after it.
        let masked = self.redactor.text(&kept);
        let text = masked.trim();
        if text.is_empty() {
            return String::new();
        }
        let mut start = text.len().saturating_sub(STDERR_QUOTED_BYTES);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        let mut quoted = &text[start..];
        if start > 0
            && let Some(newline) = quoted.find('\n')
        {
            quoted = &quoted[newline + 1..];
        }
        format!(": {}", quoted.trim())
    }

    /// Stops the whole process group: SIGTERM, then SIGKILL after a grace (and SIGKILL in any case, for
    /// what the server left running).
    async fn stop(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = killpg(self.pgid, Signal::SIGTERM);
        let _ = self.exited(TERM_GRACE).await;
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let _ = self.exited(TERM_GRACE).await;
        // On a machine too busy for the waiting task to have swept by now, this does.
        self.sweep();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.stopped.swap(true, Ordering::SeqCst) {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
        self.sweep();
    }
}

fn status_text(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(signal) => format!("signal {}", signal.as_str()),
            Err(_) => format!("signal {signal}"),
        },
        (None, None) => "an unknown status".to_owned(),
    }
}

/// `text` cut to at most `max` bytes (on a character boundary).
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// A server's standard output, read with a bound on one message: a line longer than
/// [`MAX_MESSAGE_BYTES`] ends the stream (the overflow flag says why).
struct Bounded<R> {
    inner: R,
    /// Bytes since the last newline.
    line: usize,
    overflow: Arc<AtomicBool>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Bounded<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.overflow.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                let mut over = false;
                let mut segments = read.split(|b| *b == b'\n').peekable();
                while let Some(segment) = segments.next() {
                    this.line += segment.len();
                    over |= this.line > MAX_MESSAGE_BYTES;
                    if segments.peek().is_some() {
                        this.line = 0;
                    }
                }
                if over {
                    this.line = MAX_MESSAGE_BYTES + 1;
                }
                if this.line > MAX_MESSAGE_BYTES {
                    this.overflow.store(true, Ordering::SeqCst);
                    buf.set_filled(before);
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

/// `notifications/cancelled` for request `id`.
fn cancelled(id: rmcp::model::RequestId) -> ClientNotification {
    ClientNotification::CancelledNotification(CancelledNotification::new(
        CancelledNotificationParam::new(Some(id), Some("cancelled".to_owned())),
    ))
}

/// A call whose answer is still awaited: dropped before it is disarmed (its caller stopped waiting), it
/// sends the server `notifications/cancelled` for the request, from a task of its own.
struct Abandoned {
    peer: Option<rmcp::Peer<RoleClient>>,
    id: rmcp::model::RequestId,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some(peer) = self.peer.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let notification = cancelled(self.id.clone());
            runtime.spawn(async move {
                let _ =
                    tokio::time::timeout(CLOSE_GRACE, peer.send_notification(notification)).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(input: Vec<u8>) -> (Vec<u8>, bool) {
        let overflow = Arc::new(AtomicBool::new(false));
        let mut reader = Bounded {
            inner: std::io::Cursor::new(input),
            line: 0,
            overflow: overflow.clone(),
        };
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.expect("read");
        (out, overflow.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_message_over_the_bound_ends_the_stream() {
        let mut input = b"{}\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_MESSAGE_BYTES + 1));
        input.push(b'\n');
        let (out, overflow) = read_all(input).await;
        assert!(overflow);
        assert!(out.len() <= MAX_MESSAGE_BYTES + 8192 + 3);
    }

    #[tokio::test]
    async fn messages_under_the_bound_pass() {
        let mut input = Vec::new();
        for _ in 0..3 {
            input.extend(std::iter::repeat_n(b'x', MAX_MESSAGE_BYTES));
            input.push(b'\n');
        }
        let (out, overflow) = read_all(input.clone()).await;
        assert!(!overflow);
        assert_eq!(out.len(), input.len());
    }
}
