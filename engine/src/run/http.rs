//! The `http` tool. By default it refuses loopback, private, link-local and cloud metadata addresses —
//! checked on the resolved addresses of every request and every redirect — unless `network.allow` lists
//! them.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde_json::{Map, Value as Json, json};

use super::tools::{ToolError, ToolOutput};
use crate::cidr::parse_cidr;

/// Most bytes of a response body kept.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Most redirects followed.
const MAX_REDIRECTS: usize = 10;

/// Which destinations the workflow allows despite the default refusal.
#[derive(Clone, Debug, Default)]
pub struct NetworkPolicy {
    hosts: Vec<String>,
    ranges: Vec<(IpAddr, u8)>,
}

impl NetworkPolicy {
    pub fn new(allow: &[String]) -> Self {
        let mut policy = NetworkPolicy::default();
        for entry in allow {
            if let Some(range) = parse_cidr(entry) {
                policy.ranges.push(range);
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                policy
                    .ranges
                    .push((ip, if ip.is_ipv4() { 32 } else { 128 }));
            } else {
                policy.hosts.push(entry.to_ascii_lowercase());
            }
        }
        policy
    }

    fn host_allowed(&self, host: &str) -> bool {
        self.hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(host.trim_end_matches('.')))
    }

    /// Whether an address may be reached: public addresses always, others only when allowed.
    fn ip_allowed(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        !is_internal(ip)
            || self
                .ranges
                .iter()
                .any(|(net, prefix)| in_range(ip, canonical(*net), *prefix))
    }
}

/// IPv4-mapped IPv6 addresses are checked as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn in_range(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// Loopback, private, link-local (cloud metadata lives there), shared, unspecified and other non-public ranges.
fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0)
                || a >= 240
        }
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            let first = segments[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // Unique local, link-local, and the deprecated site-local.
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                // Discard-only, documentation, Teredo (whose IPv4 address is obfuscated), and NAT64 for
                // local use.
                || segments[..4] == [0x100, 0, 0, 0]
                || segments[..2] == [0x2001, 0xdb8]
                || segments[..2] == [0x2001, 0]
                || segments[..3] == [0x64, 0xff9b, 1]
                || embedded_ipv4(v6).is_some_and(|v4| is_internal(IpAddr::V4(v4)))
        }
    }
}

/// The IPv4 address inside an IPv6 address that carries one: IPv4-compatible (`::a.b.c.d`), NAT64
/// (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`). IPv4-mapped addresses are handled by [`canonical`].
fn embedded_ipv4(v6: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    let s = v6.segments();
    let from = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        std::net::Ipv4Addr::new(a, b, c, d)
    };
    if s[..6] == [0; 6] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some(from(s[6], s[7]))
    } else if s[0] == 0x2002 {
        Some(from(s[1], s[2]))
    } else {
        None
    }
}

/// Resolves names and drops the addresses the policy refuses; refuses the name if none is left.
struct GuardedResolver {
    policy: Arc<NetworkPolicy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if policy.host_allowed(&host) {
                return Ok(Box::new(addrs.into_iter()) as Addrs);
            }
            let allowed: Vec<SocketAddr> = addrs
                .iter()
                .copied()
                .filter(|a| policy.ip_allowed(a.ip()))
                .collect();
            if allowed.is_empty() {
                return Err(format!("`{host}` resolves to an internal address, which `http` refuses unless `network.allow` lists it").into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// Refuses a URL whose host is an IP literal the policy does not allow (names are checked when resolved).
fn check_url(url: &reqwest::Url, policy: &NetworkPolicy) -> Result<(), String> {
    let ip = match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
        Some(url::Host::Domain(_)) => return Ok(()),
        None => return Err(format!("`{url}` has no host")),
    };
    if policy.ip_allowed(ip) || policy.host_allowed(&ip.to_string()) {
        Ok(())
    } else {
        Err(format!(
            "`{ip}` is an internal address, which `http` refuses unless `network.allow` lists it"
        ))
    }
}

/// Makes one request (following redirects that pass the same checks).
pub async fn request(
    args: &Json,
    policy: &Arc<NetworkPolicy>,
    redactor: &super::redact::Redactor,
) -> Result<ToolOutput, ToolError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url_text = args["url"].as_str().unwrap_or_default();
    let url = reqwest::Url::parse(url_text)
        .map_err(|e| ToolError::new(format!("invalid URL `{url_text}`: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ToolError::new(format!(
            "`http` only speaks http and https, not `{}`",
            url.scheme()
        )));
    }
    check_url(&url, policy).map_err(ToolError::new)?;
    let redirect_policy = {
        let policy = policy.clone();
        reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            match check_url(attempt.url(), &policy) {
                Ok(()) => attempt.follow(),
                Err(refusal) => attempt.error(format!("redirect refused: {refusal}")),
            }
        })
    };
    let timeout = args["timeout"]
        .as_str()
        .and_then(super::tools::duration)
        .unwrap_or(Duration::from_secs(30));
    let client = reqwest::Client::builder()
        .dns_resolver(Arc::new(GuardedResolver {
            policy: policy.clone(),
        }))
        .redirect(redirect_policy)
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .timeout(timeout)
        .no_proxy()
        .build()
        .map_err(|e| ToolError::new(format!("cannot set up HTTP: {e}")))?;
    let method = args["method"].as_str().unwrap_or("GET");
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| ToolError::new(format!("invalid method `{method}`")))?;
    let mut request = client.request(method.clone(), url.clone());
    if let Some(headers) = args["headers"].as_object() {
        for (name, value) in headers {
            request = request.header(name, value.as_str().unwrap_or_default());
        }
    }
    if !args["json"].is_null() {
        request = request.json(&args["json"]);
    } else if let Some(body) = args["body"].as_str() {
        request = request.body(body.to_owned());
    }
    let mut response = request
        .send()
        .await
        .map_err(|e| ToolError::new(describe(&e, &method, url_text)))?;
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
    if status.is_client_error() || status.is_server_error() {
        let excerpt: String = redactor.text(&text).chars().take(300).collect();
        return Err(ToolError::new(format!(
            "HTTP {} from {method} {url_text}: {excerpt}",
            status.as_u16()
        )));
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
