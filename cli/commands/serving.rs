//! What the two servers, `archon mcp serve` and `archon serve`, share: a workflow's inputs as one JSON
//! Schema, token comparison, and the origins of browser pages served from this machine.

use archon_engine::Workflow;
use axum::http::{HeaderMap, header};
use serde_json::{Map, Value as Json, json};

/// A workflow's inputs as one JSON Schema object: each input's own schema (its type, description,
/// default and constraints) as a property, the inputs without a default required, and no other property.
pub fn input_schema(workflow: &Workflow) -> Map<String, Json> {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, schema) in &workflow.spec.inputs {
        if schema.get("default").is_none() {
            required.push(Json::String(name.value.clone()));
        }
        properties.insert(name.value.clone(), schema.to_json());
    }
    let mut schema = json!({
        "type": "object",
        "properties": properties,
        "additionalProperties": false,
    });
    if !required.is_empty() {
        schema["required"] = Json::Array(required);
    }
    match schema {
        Json::Object(map) => map,
        _ => Map::new(),
    }
}

/// The token of an `Authorization: Bearer TOKEN` header, if the request has one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
}

/// Whether two byte strings are equal, in time that depends only on their lengths.
pub fn same(given: &[u8], expected: &[u8]) -> bool {
    let mut differ = u8::from(given.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        differ |= given.get(i).copied().unwrap_or(!e) ^ e;
    }
    std::hint::black_box(differ) == 0
}

/// Whether an `Origin` is a page served from this machine: `http(s)://localhost`, `127.x.y.z` or `[::1]`,
/// on any port.
pub fn loopback_origin(origin: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    if !matches!(scheme, "http" | "https") {
        return false;
    }
    loopback_host(rest)
}

/// Whether a `Host` header (`name[:port]`) names this machine: `localhost`, `127.x.y.z` or `[::1]`.
pub fn loopback_host(host_and_port: &str) -> bool {
    let host = if let Some(v6) = host_and_port.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, tail)) if tail.is_empty() || tail.starts_with(':') => host,
            _ => return false,
        }
    } else {
        match host_and_port.split_once(':') {
            Some((host, _)) => host,
            None => host_and_port,
        }
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_origins_are_recognised() {
        for origin in [
            "http://localhost",
            "http://localhost:6274",
            "https://127.0.0.1:8080",
            "http://[::1]:3000",
            "HTTP://LOCALHOST".to_lowercase().as_str(),
        ] {
            assert!(loopback_origin(origin), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example",
            "null",
            "file://localhost",
            "http://[::1]evil",
        ] {
            assert!(!loopback_origin(origin), "{origin}");
        }
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(same(b"s3cret", b"s3cret"));
        assert!(!same(b"s3cre", b"s3cret"));
        assert!(!same(b"s3cret!", b"s3cret"));
        assert!(!same(b"S3cret", b"s3cret"));
        assert!(!same(b"", b"s3cret"));
    }
}
