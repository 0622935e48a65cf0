//! What every HTTP provider shares: one reqwest client (rustls) with connect and total timeouts, retries
//! with exponential backoff and full jitter on 429, 5xx, 529 and connection problems (honouring
//! `Retry-After`), never on other 4xx; a concurrency limit and a request rate limit per provider.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use serde_json::Value as Json;
use tokio::sync::{Mutex, Semaphore};

use super::{LlmError, provider_message};

/// Largest response body read from a provider (a model's answer is a few hundred KiB at most).
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How a provider's requests are made.
#[derive(Clone, Debug)]
pub struct Settings {
    pub connect_timeout: Duration,
    /// Limit for one whole request (connect, send, wait, read).
    pub timeout: Duration,
    /// Attempts after the first.
    pub retries: usize,
    /// First backoff delay; doubled each retry up to `max_delay`, each delay drawn at random below it.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Longest `Retry-After` honoured; a provider asking for more fails the call instead.
    pub max_retry_after: Duration,
    pub max_concurrency: usize,
    pub requests_per_minute: Option<u32>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            connect_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(120),
            retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
            max_concurrency: 8,
            requests_per_minute: None,
        }
    }
}

/// The HTTP side of one provider.
#[derive(Debug)]
pub struct Client {
    /// The provider's name, for messages.
    name: String,
    http: reqwest::Client,
    settings: Settings,
    in_flight: Arc<Semaphore>,
    /// When the next request may start, under the rate limit.
    next_slot: Mutex<Instant>,
}

/// What every HTTP adapter holds: its client, base URL (without a trailing `/`) and API key.
#[derive(Debug)]
pub struct Endpoint {
    pub client: Client,
    pub base_url: String,
    pub key: Option<super::ApiKey>,
}

impl Endpoint {
    pub fn new(
        name: impl Into<String>,
        base_url: impl Into<String>,
        key: Option<super::ApiKey>,
        settings: Settings,
    ) -> Result<Self, LlmError> {
        Ok(Endpoint {
            client: Client::new(name, settings)?,
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            key,
        })
    }
}

/// A successful response: the body as JSON and the provider's request id, if it sent one.
#[derive(Debug)]
pub struct Reply {
    pub body: Json,
    pub request_id: Option<String>,
}

impl Client {
    pub fn new(name: impl Into<String>, settings: Settings) -> Result<Self, LlmError> {
        let name = name.into();
        let _ = rustls::crypto::ring::default_provider().install_default();
        // The API key travels in headers: a redirect to another origin would carry it (or, for custom key
        // headers, keep it on every hop), so a provider is never followed off its own origin.
        let redirects = reqwest::redirect::Policy::custom(|attempt| {
            let first = attempt.previous().first().map(reqwest::Url::origin);
            if first.is_some_and(|origin| origin != attempt.url().origin()) {
                let target = attempt.url().origin().ascii_serialization();
                attempt.error(format!(
                    "the provider redirected to another origin, `{target}`, where the key is not sent"
                ))
            } else if attempt.previous().len() >= 10 {
                attempt.error("more than 10 redirects")
            } else {
                attempt.follow()
            }
        });
        let http = reqwest::Client::builder()
            .redirect(redirects)
            .connect_timeout(settings.connect_timeout)
            .timeout(settings.timeout)
            .build()
            .map_err(|e| {
                LlmError::fatal(format!(
                    "provider `{name}`: cannot build an HTTP client: {e}"
                ))
            })?;
        Ok(Client {
            in_flight: Arc::new(Semaphore::new(settings.max_concurrency.max(1))),
            next_slot: Mutex::new(Instant::now()),
            name,
            http,
            settings,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// POSTs `body` as JSON with `headers`, retrying what is worth retrying.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Json,
    ) -> Result<Reply, LlmError> {
        self.post_and_read(url, headers, body, Ok).await
    }

    /// POSTs `body` and reads the reply with `read`, retrying what is worth retrying, including an error
    /// `read` finds in a successful response (an overloaded provider answering 200 with an error body).
    pub async fn post_and_read<T>(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Json,
        read: impl Fn(Reply) -> Result<T, LlmError>,
    ) -> Result<T, LlmError> {
        self.post_and_read_resending(url, headers, body, read, |_| false)
            .await
    }

    /// As [`Client::post_and_read`], for a caller that sends the request again itself (changed) after an
    /// error `resends` accepts: such a request is reported as followed by another.
    pub async fn post_and_read_resending<T>(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Json,
        read: impl Fn(Reply) -> Result<T, LlmError>,
        resends: impl Fn(&LlmError) -> bool,
    ) -> Result<T, LlmError> {
        let settings = &self.settings;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(settings.base_delay)
            .with_max_delay(settings.max_delay)
            .with_max_times(settings.retries);
        let made = std::sync::atomic::AtomicUsize::new(0);
        let attempt = || async {
            let started = Instant::now();
            let started_at = std::time::SystemTime::now();
            let made = made.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            super::attempts::report(super::attempts::Report::Started);
            let outcome = self.attempt(url, headers, body).await.and_then(&read);
            super::attempts::report(super::attempts::Report::Ended(super::attempts::Attempt {
                started: started_at,
                duration: started.elapsed(),
                error: outcome.as_ref().err().map(|e| e.message.clone()),
                retrying: outcome
                    .as_ref()
                    .err()
                    .is_some_and(|e| (self.retries(e) && made <= settings.retries) || resends(e)),
            }));
            outcome
        };
        attempt
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .when(|e: &LlmError| self.retries(e))
            // Full jitter: a delay drawn between zero and the exponential delay; `Retry-After` wins.
            // `None` from the backoff means the retries are used up, whatever `Retry-After` says.
            .adjust(|e: &LlmError, delay| match (delay, e.retry_after) {
                (None, _) => None,
                (Some(_), Some(wait)) => Some(wait),
                (Some(d), None) => Some(d.mul_f64(fastrand::f64())),
            })
            .await
    }

    /// Whether a failed attempt is tried again (while attempts are left): a retryable error whose
    /// `Retry-After`, if any, is not longer than the longest honoured.
    fn retries(&self, e: &LlmError) -> bool {
        e.retryable
            && e.retry_after
                .is_none_or(|wait| wait <= self.settings.max_retry_after)
    }

    async fn attempt(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Json,
    ) -> Result<Reply, LlmError> {
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| LlmError::fatal(format!("provider `{}` is shut down", self.name)))?;
        self.wait_for_rate().await;
        let mut request = self.http.post(url).json(body);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let response = request.send().await.map_err(|e| self.transport_error(&e))?;
        let status = response.status();
        let request_id = ["x-request-id", "request-id", "x-goog-request-id"]
            .iter()
            .find_map(|h| response.headers().get(*h)?.to_str().ok().map(str::to_owned));
        let retry_after = retry_after(response.headers());
        let text = self.body(response).await?;
        if !status.is_success() {
            let code = status.as_u16();
            // Some gateways echo the key they were sent: it never reaches a message.
            let message = without_keys(
                format!(
                    "provider `{}`: HTTP {code}: {}",
                    self.name,
                    provider_message(&text)
                ),
                headers,
            );
            // A server that does not take tools (llama.cpp answers 500) will not take them next time.
            let retryable = (code == 429 || code == 408 || code >= 500)
                && !(body.get("tools").is_some() && super::refuses_tools(&message));
            let mut message = message;
            if let Some(wait) =
                retry_after.filter(|w| retryable && *w > self.settings.max_retry_after)
            {
                message.push_str(&format!(
                    " (it asked to wait `{}`, longer than the `{}` archon waits)",
                    humantime::format_duration(wait),
                    humantime::format_duration(self.settings.max_retry_after)
                ));
            }
            return Err(LlmError {
                message,
                status: Some(code),
                retryable,
                retry_after: if retryable { retry_after } else { None },
                connect: false,
            });
        }
        let body = serde_json::from_str(&text).map_err(|e| LlmError {
            message: without_keys(
                format!(
                    "provider `{}`: the response is not valid JSON ({e}): `{}`",
                    self.name,
                    text.chars().take(120).collect::<String>()
                ),
                headers,
            ),
            status: Some(status.as_u16()),
            // A truncated body is a transport accident; a well-delivered non-JSON body will not improve.
            retryable: text.is_empty() || e.is_eof(),
            retry_after: None,
            connect: false,
        })?;
        Ok(Reply { body, request_id })
    }

    /// The response body, read a chunk at a time up to [`MAX_RESPONSE_BYTES`]: a larger one fails the call
    /// (without a retry: it would be as large again) before it can fill memory.
    async fn body(&self, mut response: reqwest::Response) -> Result<String, LlmError> {
        let too_large = || LlmError {
            message: format!(
                "provider `{}`: the response is larger than {} MiB, which archon reads at most",
                self.name,
                MAX_RESPONSE_BYTES / (1024 * 1024)
            ),
            status: None,
            retryable: false,
            retry_after: None,
            connect: false,
        };
        if response
            .content_length()
            .is_some_and(|n| n > MAX_RESPONSE_BYTES as u64)
        {
            return Err(too_large());
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport_error(&e))?
        {
            if bytes.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// Waits until the rate limit allows another request.
    async fn wait_for_rate(&self) {
        let Some(per_minute) = self.settings.requests_per_minute.filter(|r| *r > 0) else {
            return;
        };
        let spacing = Duration::from_secs(60) / per_minute;
        let start = {
            let mut next = self.next_slot.lock().await;
            let now = Instant::now();
            let start = (*next).max(now);
            *next = start + spacing;
            start
        };
        tokio::time::sleep_until(start.into()).await;
    }

    fn transport_error(&self, e: &reqwest::Error) -> LlmError {
        let what = if e.is_timeout() {
            format!(
                "no answer within {}",
                humantime::format_duration(self.settings.timeout)
            )
        } else if e.is_connect() {
            "cannot connect".to_owned()
        } else if e.is_body() || e.is_decode() {
            "the response was cut off".to_owned()
        } else if e.is_redirect() {
            "the redirect was refused".to_owned()
        } else {
            "the request failed".to_owned()
        };
        // Only the causes are shown (the innermost says the most: `connection refused`), never the URL.
        let mut causes: Vec<String> = Vec::new();
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            let text = cause.to_string().to_lowercase();
            if !causes.iter().any(|c| c.contains(&text)) {
                causes.push(text);
            }
            source = cause.source();
        }
        let detail = (!causes.is_empty()).then(|| causes.join(": "));
        LlmError {
            message: match detail {
                Some(detail) => format!("provider `{}`: {what}: {detail}", self.name),
                None => format!("provider `{}`: {what}", self.name),
            },
            status: None,
            // A request that cannot even be built (a bad header value) will not build next time either.
            retryable: !e.is_builder() && !e.is_redirect(),
            retry_after: None,
            connect: e.is_connect(),
        }
    }
}

/// `message` with the value of every header sent (the key, with or without its `Bearer ` scheme) masked.
fn without_keys(mut message: String, headers: &[(&str, String)]) -> String {
    for (_, value) in headers {
        let key = value.strip_prefix("Bearer ").unwrap_or(value).trim();
        if key.len() >= 8 && message.contains(key) {
            message = message.replace(key, "***");
        }
    }
    message
}

/// `Retry-After` as seconds or an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    // An HTTP date (IMF-fixdate, or the obsolete RFC 850 and asctime forms HTTP/1.1 still accepts).
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

    fn wait(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).expect("header"));
        super::retry_after(&headers)
    }

    #[test]
    fn retry_after_as_seconds_or_any_http_date_form() {
        assert_eq!(wait("2"), Some(Duration::from_secs(2)));
        assert_eq!(wait(" 1.5 "), Some(Duration::from_millis(1500)));
        let later = SystemTime::now() + Duration::from_secs(30);
        let waited = wait(&httpdate::fmt_http_date(later)).expect("an IMF-fixdate");
        assert!(
            waited > Duration::from_secs(28) && waited <= Duration::from_secs(30),
            "{waited:?}"
        );
        // The obsolete forms HTTP/1.1 recipients still accept; a date in the past means now.
        assert_eq!(wait("Sunday, 06-Nov-94 08:49:37 GMT"), Some(Duration::ZERO));
        assert_eq!(wait("Sun Nov  6 08:49:37 1994"), Some(Duration::ZERO));
        assert_eq!(wait("soon"), None);
    }
}
