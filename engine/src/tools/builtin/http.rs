//! The `http` tool. By default it refuses addresses that are not globally reachable (loopback, private,
//! link-local and cloud metadata, and the rest of the special-purpose registries: `crate::network`) —
//! checked on the resolved addresses of every request and every redirect — unless `network.allow` lists
//! them.

use crate::network::{GuardedResolver, NetworkPolicy, check_url};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value as Json, json};

use super::{Tool, ToolContext, ToolError, ToolOutput, Watcher, object, timeout};
use crate::tools::ErrorClass;
use crate::tools::{CallFuture, SafetyRule};

pub(super) struct Http;

impl Tool for Http {
    fn name(&self) -> &'static str {
        "http"
    }

    fn description(&self) -> &'static str {
        "Make an HTTP request"
    }

    fn parameters(&self) -> Json {
        object(
            json!({
                "method": { "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] },
                "url": { "type": "string" },
                "headers": { "type": "object", "additionalProperties": { "type": "string" } },
                "json": {},
                "body": { "type": "string" },
                "timeout": timeout(),
                "ok_status": {
                    "description": "statuses that succeed, each exact (404) or a class (\"2xx\"); default: below 400",
                    "type": "array",
                    "items": {
                        "anyOf": [
                            { "type": "integer", "minimum": 100, "maximum": 599 },
                            { "type": "string", "pattern": "^([1-5]xx|[1-5][0-9][0-9])$" }
                        ]
                    }
                },
            }),
            &["url"],
        )
    }

    /// Read-only when its method only reads; sensitive otherwise.
    fn safety(&self) -> SafetyRule {
        SafetyRule::ByMethod
    }

    fn durations(&self) -> &'static [&'static str] {
        &["timeout"]
    }

    fn call<'a>(&'a self, args: Json, cx: &'a ToolContext, _: Watcher<'a>) -> CallFuture<'a> {
        Box::pin(async move { request(&args, &cx.network, &cx.redactor).await })
    }
}

/// Most bytes of a response body kept.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Most redirects followed.
const MAX_REDIRECTS: usize = 10;

/// Makes one request (following redirects that pass the same checks, without carrying credentials or a
/// body to another origin).
pub async fn request(
    args: &Json,
    policy: &Arc<NetworkPolicy>,
    redactor: &crate::redact::Redactor,
) -> Result<ToolOutput, ToolError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url_text = args["url"].as_str().unwrap_or_default();
    let url = reqwest::Url::parse(url_text)
        .map_err(|e| ToolError::permanent(format!("invalid URL `{url_text}`: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ToolError::permanent(format!(
            "`http` only speaks http and https, not `{}`",
            url.scheme()
        )));
    }
    check_url(&url, policy, "`http`").map_err(ToolError::permanent)?;
    let ok_status = OkStatus::of(&args["ok_status"])?;
    // An argument, perhaps rendered from a template, so it is read here.
    let timeout = match args["timeout"].as_str() {
        None => Duration::from_secs(30),
        Some(text) => humantime::parse_duration(text.trim())
            .map_err(|_| ToolError::permanent(format!("invalid duration `{text}` for `http`")))?,
    };
    // Redirects are followed here, not by reqwest, so that what is sent on each hop is decided against
    // the origin the spec named (see `Outgoing::redirect`).
    let client = reqwest::Client::builder()
        .dns_resolver(Arc::new(GuardedResolver::new(policy.clone(), "`http`")))
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .timeout(timeout)
        .no_proxy()
        .build()
        .map_err(|e| ToolError::new(format!("cannot set up HTTP: {e}")))?;
    let method = args["method"].as_str().unwrap_or("GET");
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| ToolError::permanent(format!("invalid method `{method}`")))?;
    let mut outgoing = Outgoing {
        origin: url.origin(),
        url,
        method: method.clone(),
        headers: args["headers"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, value)| (name.clone(), value.as_str().unwrap_or_default().to_owned()))
            .collect(),
        body: if !args["json"].is_null() {
            Some(Body::Json(args["json"].clone()))
        } else {
            args["body"].as_str().map(|b| Body::Text(b.to_owned()))
        },
        left_origin: false,
    };
    let mut hops = 0;
    let mut response = loop {
        let response = outgoing
            .build(&client)
            .send()
            .await
            .map_err(|e| transport_error(&e, &method, url_text))?;
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok());
        let (true, Some(location)) = (response.status().is_redirection(), location) else {
            break response;
        };
        if hops == MAX_REDIRECTS {
            return Err(ToolError::new(format!(
                "{method} {url_text} failed: more than {MAX_REDIRECTS} redirects"
            )));
        }
        hops += 1;
        outgoing
            .redirect(response.status(), location, policy, redactor)
            .map_err(|refusal| {
                ToolError::permanent(format!(
                    "{method} {url_text} failed: redirect refused: {refusal}"
                ))
            })?;
    };
    let status = response.status();
    let headers: Map<String, Json> = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                Json::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
            )
        })
        .collect();
    let mut body = Vec::new();
    let mut truncated = 0usize;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| ToolError::new(describe(&e, &method, url_text)))?
    {
        let room = MAX_BODY_BYTES.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        truncated += chunk.len().saturating_sub(room);
    }
    let mut text = String::from_utf8_lossy(&body).into_owned();
    if truncated > 0 {
        text.push_str(&format!(
            "\n[archon: body truncated, {truncated} more bytes]"
        ));
    }
    if !ok_status.accepts(status.as_u16()) {
        let excerpt: String = redactor.text(&text).chars().take(300).collect();
        let class = ErrorClass::of_status(status.as_u16());
        return Err(ToolError::new(format!(
            "HTTP {} from {method} {url_text}: {excerpt}",
            status.as_u16()
        ))
        .of(class));
    }
    let parsed = serde_json::from_slice::<Json>(&body).ok();
    let output =
        json!({ "status": status.as_u16(), "headers": headers, "body": text, "json": parsed });
    Ok(ToolOutput {
        output,
        text,
        exit_code: None,
    })
}

/// A request body as the arguments give it.
#[derive(Clone, Debug)]
enum Body {
    Json(Json),
    Text(String),
}

/// The request of the current hop of a redirect chain.
struct Outgoing {
    /// The origin the spec named: what headers and body were written for.
    origin: url::Origin,
    url: reqwest::Url,
    method: reqwest::Method,
    headers: Vec<(String, String)>,
    body: Option<Body>,
    /// A hop has left `origin`: credentials stay behind for the rest of the chain, even if it comes
    /// back.
    left_origin: bool,
}

impl Outgoing {
    fn build(&self, client: &reqwest::Client) -> reqwest::RequestBuilder {
        let mut request = client.request(self.method.clone(), self.url.clone());
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        match &self.body {
            Some(Body::Json(json)) => request.json(json),
            Some(Body::Text(text)) => request.body(text.clone()),
            None => request,
        }
    }

    /// Moves to the hop a redirect names. A 303 (and a 301 or 302 after a POST) continues as a GET
    /// without a body, as browsers do. On leaving the spec's origin, every header that carries a secret
    /// (and `authorization`, `cookie`, `proxy-authorization` whatever they hold) is dropped for good, and
    /// a request body is never carried there: a 307 or 308 that would resend it is refused.
    fn redirect(
        &mut self,
        status: reqwest::StatusCode,
        location: &str,
        policy: &NetworkPolicy,
        redactor: &crate::redact::Redactor,
    ) -> Result<(), String> {
        let next = self
            .url
            .join(location)
            .map_err(|e| format!("invalid location `{location}`: {e}"))?;
        if !matches!(next.scheme(), "http" | "https") {
            return Err(format!("`{next}` is not http or https"));
        }
        check_url(&next, policy, "`http`")?;
        let keeps_method = matches!(status.as_u16(), 307 | 308);
        if !keeps_method
            && (status.as_u16() == 303 || self.method == reqwest::Method::POST)
            && self.method != reqwest::Method::HEAD
        {
            self.method = reqwest::Method::GET;
            self.body = None;
            self.headers.retain(|(name, _)| {
                !name.eq_ignore_ascii_case("content-type")
                    && !name.eq_ignore_ascii_case("content-length")
            });
        }
        if next.origin() != self.origin {
            if self.body.is_some() {
                return Err(format!(
                    "`{}` is another origin, and the request body is not sent there",
                    next.origin().ascii_serialization()
                ));
            }
            self.left_origin = true;
        }
        if self.left_origin {
            self.headers.retain(|(name, value)| {
                let credential = ["authorization", "cookie", "proxy-authorization"]
                    .iter()
                    .any(|c| name.eq_ignore_ascii_case(c));
                !credential && redactor.text(value) == value.as_str()
            });
        }
        self.url = next;
        Ok(())
    }
}

/// A request that got no answer: refused by the network policy when the name resolved to an internal
/// address (permanent), else a connection problem or a timeout.
fn transport_error(err: &reqwest::Error, method: &reqwest::Method, url: &str) -> ToolError {
    let message = describe(err, method, url);
    let class = if message.contains("which `http` refuses") {
        ErrorClass::Permanent
    } else if err.is_connect() || err.is_timeout() || err.is_request() || err.is_body() {
        ErrorClass::Connect
    } else {
        ErrorClass::Other
    };
    ToolError::new(message).of(class)
}

/// The statuses a request may answer with and succeed (`ok_status`): each an exact status (`404`) or a
/// class (`"2xx"`); by default every status below 400.
struct OkStatus(Vec<(u16, u16)>);

impl OkStatus {
    fn of(value: &Json) -> Result<OkStatus, ToolError> {
        let Some(items) = value.as_array() else {
            return match value {
                Json::Null => Ok(OkStatus(vec![(100, 399)])),
                other => Err(ToolError::permanent(format!(
                    "`ok_status` must be a list of statuses, such as `[200, 404]` or `[\"2xx\"]`, not `{other}`"
                ))),
            };
        };
        let mut ranges = Vec::with_capacity(items.len());
        for item in items {
            let range = match item {
                Json::Number(n) => n
                    .as_u64()
                    .filter(|n| (100..=599).contains(n))
                    .map(|n| (n as u16, n as u16)),
                Json::String(s) => s
                    .strip_suffix("xx")
                    .and_then(|d| d.parse::<u16>().ok())
                    .filter(|d| (1..=5).contains(d))
                    .map(|d| (d * 100, d * 100 + 99))
                    .or_else(|| {
                        s.parse::<u16>()
                            .ok()
                            .filter(|n| (100..=599).contains(n))
                            .map(|n| (n, n))
                    }),
                _ => None,
            };
            let Some(range) = range else {
                return Err(ToolError::permanent(format!(
                    "`ok_status` has `{item}`: write a status such as `404` or a class such as `\"2xx\"`"
                )));
            };
            ranges.push(range);
        }
        Ok(OkStatus(ranges))
    }

    fn accepts(&self, status: u16) -> bool {
        self.0
            .iter()
            .any(|(low, high)| (*low..=*high).contains(&status))
    }
}

fn describe(err: &reqwest::Error, method: &reqwest::Method, url: &str) -> String {
    let mut message = format!("{method} {url} failed");
    if err.is_timeout() {
        message.push_str(": timed out");
    }
    let mut source: Option<&dyn std::error::Error> = Some(err);
    let mut seen = Vec::new();
    while let Some(e) = source {
        let text = e.to_string();
        if !seen.contains(&text) && !text.contains(url) {
            message.push_str(": ");
            message.push_str(&text);
            seen.push(text);
        }
        source = e.source();
    }
    message
}
