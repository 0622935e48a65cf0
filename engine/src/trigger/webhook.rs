//! A workflow's webhook: who may deliver (an HMAC-SHA256 signature of the body, a bearer token, or
//! both), which delivery it is, and the input its body becomes.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use hmac::{KeyInit, Mac};
use serde_json::{Map, Value as Json};
use sha2::{Digest, Sha256};

use super::{Firing, FiringKind, FiringOutcome, Timestamp, TriggerError, millis};
use crate::store::{RunStore, StoreError};
use crate::workflow::Workflow;

/// The largest body a delivery may have; a larger one is refused before anything else is checked.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The longest delivery id.
pub const MAX_DELIVERY_ID_BYTES: usize = 128;
/// The headers that carry the body's signature, `sha256=<hex>`: archon's own, then GitHub's.
pub const SIGNATURE_HEADERS: [&str; 2] = ["x-archon-signature", "x-hub-signature-256"];
/// The headers that carry the delivery id: archon's own, then GitHub's.
pub const DELIVERY_HEADERS: [&str; 2] = ["x-archon-delivery", "x-github-delivery"];

/// A secret's value, which never prints.
#[derive(Clone)]
struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A workflow's webhook, ready to check deliveries: its secrets' values read and its input's schema
/// compiled once.
#[derive(Debug)]
pub struct Webhook {
    pub workflow: String,
    pub trigger: String,
    /// The key of the body's HMAC-SHA256.
    secret: Option<Secret>,
    /// The SHA-256 of the bearer token: tokens are compared as digests, in constant time.
    token: Option<Secret>,
    /// The input the body becomes, and its schema.
    input: Option<(String, Box<jsonschema::Validator>)>,
    /// The run's other inputs: the trigger's `inputs` and the defaults.
    inputs: Map<String, Json>,
}

/// One delivery as it came: the raw body and the headers the webhook reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct Delivery<'a> {
    pub body: &'a [u8],
    /// `sha256=<hex>`, from the first of [`SIGNATURE_HEADERS`] present.
    pub signature: Option<&'a str>,
    /// The `Authorization` header.
    pub authorization: Option<&'a str>,
    /// From the first of [`DELIVERY_HEADERS`] present.
    pub id: Option<&'a str>,
}

impl<'a> Delivery<'a> {
    /// A delivery of `body` whose headers `header` looks up by lowercase name.
    pub fn from_headers(body: &'a [u8], header: impl Fn(&str) -> Option<&'a str>) -> Self {
        Delivery {
            body,
            signature: SIGNATURE_HEADERS.iter().find_map(|h| header(h)),
            authorization: header("authorization"),
            id: DELIVERY_HEADERS.iter().find_map(|h| header(h)),
        }
    }
}

/// A delivery that passed every check.
#[derive(Clone, Debug, PartialEq)]
pub struct Verified {
    /// Its delivery id.
    pub delivery: String,
    /// The inputs its run starts with.
    pub inputs: Map<String, Json>,
}

/// Why a delivery is refused. Messages are what the sender is told; none repeats a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    #[error("the body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error(
        "the delivery is not signed: send `X-Archon-Signature: sha256=<hex>` (or `X-Hub-Signature-256`)"
    )]
    MissingSignature,
    #[error("the signature does not match the body")]
    BadSignature,
    #[error("the delivery has no bearer token: send `Authorization: Bearer <token>`")]
    MissingToken,
    #[error("the bearer token is not the webhook's")]
    BadToken,
    #[error("the delivery has no id: send `X-Archon-Delivery` (or `X-GitHub-Delivery`)")]
    MissingDelivery,
    #[error("the delivery id must be 1 to {MAX_DELIVERY_ID_BYTES} visible ASCII characters")]
    BadDelivery,
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error("the body does not match input `{input}`: {message}")]
    Invalid { input: String, message: String },
}

impl WebhookError {
    /// The HTTP status a server answers with.
    pub fn status(&self) -> u16 {
        match self {
            WebhookError::TooLarge { .. } => 413,
            WebhookError::MissingSignature
            | WebhookError::BadSignature
            | WebhookError::MissingToken
            | WebhookError::BadToken => 401,
            WebhookError::MissingDelivery | WebhookError::BadDelivery => 400,
            WebhookError::NotJson(_) | WebhookError::Invalid { .. } => 422,
        }
    }

    /// Whether the sender proved who it is: only such a refusal is recorded (as `refused`, under its
    /// delivery id), so that nobody else can fill the store or take a delivery id first.
    pub fn authenticated(&self) -> bool {
        matches!(
            self,
            WebhookError::NotJson(_) | WebhookError::Invalid { .. }
        )
    }
}

impl Webhook {
    /// The webhook of `workflow`, if it has one, with the values of its secrets read from `env`, else
    /// from `.env` beside the spec (as a run reads secrets).
    pub fn of(
        workflow: &Workflow,
        env: &BTreeMap<String, String>,
    ) -> Result<Option<Webhook>, TriggerError> {
        let Some(def) = workflow.spec.triggers.iter().find(|t| t.webhook.is_some()) else {
            return Ok(None);
        };
        let Some(hook) = &def.webhook else {
            return Ok(None);
        };
        let names: Vec<&str> = [&hook.secret, &hook.token]
            .into_iter()
            .flatten()
            .map(|n| n.value.as_str())
            .collect();
        let dir = workflow.path.parent().unwrap_or(Path::new("."));
        let values = crate::run::secrets::values(names, env, dir).map_err(|message| {
            TriggerError::Secret {
                workflow: workflow.name.clone(),
                message,
            }
        })?;
        let value = |name: &Option<crate::spec::Spanned<String>>| {
            name.as_ref()
                .and_then(|n| values.get(&n.value))
                .and_then(Json::as_str)
                .map(|v| v.as_bytes().to_vec())
        };
        let trigger = def.name();
        let fixed: Map<String, Json> = def
            .inputs
            .iter()
            .map(|(k, v)| (k.value.clone(), v.to_json()))
            .collect();
        let input_name = hook.input.as_ref().map(|i| i.value.clone());
        // The other inputs resolve once: given values, then defaults, each checked against its schema.
        let others = crate::spec::Spec {
            inputs: workflow
                .spec
                .inputs
                .iter()
                .filter(|(k, _)| Some(&k.value) != input_name.as_ref())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            ..crate::spec::Spec::default()
        };
        let inputs = crate::inputs::resolve(&others, fixed, &[]).map_err(|problems| {
            TriggerError::Inputs {
                workflow: workflow.name.clone(),
                trigger: trigger.clone(),
                message: problems
                    .iter()
                    .map(|p| p.message.clone())
                    .collect::<Vec<_>>()
                    .join("; "),
            }
        })?;
        let input = match &input_name {
            Some(name) => {
                let schema = workflow
                    .spec
                    .inputs
                    .get(name.as_str())
                    .map_or(Json::Bool(true), |s| s.to_json());
                let validator =
                    jsonschema::validator_for(&schema).map_err(|e| TriggerError::Inputs {
                        workflow: workflow.name.clone(),
                        trigger: trigger.clone(),
                        message: format!("the schema of input `{name}` does not compile: {e}"),
                    })?;
                Some((name.clone(), Box::new(validator)))
            }
            None => None,
        };
        Ok(Some(Webhook {
            workflow: workflow.name.clone(),
            trigger,
            secret: value(&hook.secret).map(Secret),
            token: value(&hook.token).map(|t| Secret(Sha256::digest(&t).to_vec())),
            input,
            inputs,
        }))
    }

    /// The checks a delivery's headers alone decide, made before its body is read: a signature that
    /// reads as one (when the webhook has a secret), the right token (when it has one), a valid id.
    pub fn verify_headers(&self, delivery: &Delivery<'_>) -> Result<(), WebhookError> {
        if self.secret.is_some() {
            self.signature(delivery)?;
        }
        if let Some(Secret(digest)) = &self.token {
            let given = delivery
                .authorization
                .and_then(|a| {
                    let (scheme, token) = a.trim().split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
                })
                .ok_or(WebhookError::MissingToken)?;
            if !same(&Sha256::digest(given.as_bytes()), digest) {
                return Err(WebhookError::BadToken);
            }
        }
        let id = delivery.id.ok_or(WebhookError::MissingDelivery)?.trim();
        if id.is_empty()
            || id.len() > MAX_DELIVERY_ID_BYTES
            || !id.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(WebhookError::BadDelivery);
        }
        Ok(())
    }

    /// The signature a delivery carries, as bytes.
    fn signature(&self, delivery: &Delivery<'_>) -> Result<Vec<u8>, WebhookError> {
        let given = delivery.signature.ok_or(WebhookError::MissingSignature)?;
        let hex = given
            .trim()
            .strip_prefix("sha256=")
            .ok_or(WebhookError::BadSignature)?;
        from_hex(hex).ok_or(WebhookError::BadSignature)
    }

    /// Checks a delivery, in this order: its size, its signature and its token (each when the webhook
    /// has one), its id, then its body against the input's schema.
    pub fn verify(&self, delivery: &Delivery<'_>) -> Result<Verified, WebhookError> {
        if delivery.body.len() > MAX_BODY_BYTES {
            return Err(WebhookError::TooLarge {
                limit: MAX_BODY_BYTES,
            });
        }
        self.verify_headers(delivery)?;
        if let Some(Secret(key)) = &self.secret {
            let signature = self.signature(delivery)?;
            let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key)
                .map_err(|_| WebhookError::BadSignature)?;
            mac.update(delivery.body);
            mac.verify_slice(&signature)
                .map_err(|_| WebhookError::BadSignature)?;
        }
        let id = delivery.id.unwrap_or_default().trim();
        let mut inputs = self.inputs.clone();
        if let Some((name, validator)) = &self.input {
            let body: Json = serde_json::from_slice(delivery.body)
                .map_err(|e| WebhookError::NotJson(e.to_string()))?;
            if let Some(error) = validator.iter_errors(&body).next() {
                let path = error.instance_path().to_string();
                let at = if path.is_empty() {
                    String::new()
                } else {
                    format!("at `{path}`: ")
                };
                return Err(WebhookError::Invalid {
                    input: name.clone(),
                    message: format!("{at}{}", error.masked()),
                });
            }
            inputs.insert(name.clone(), body);
        }
        Ok(Verified {
            delivery: id.to_owned(),
            inputs,
        })
    }
}

/// What became of a delivery that was recorded or seen before.
#[derive(Clone, Debug, PartialEq)]
pub enum Received {
    /// A new delivery: its firing is recorded and its run is to start with `firing.run_id`.
    Fired(Firing),
    /// A delivery with this id was recorded before: nothing starts.
    Replayed { delivery: String },
}

/// Why a delivery starts nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// The delivery was refused (and, when its sender was authenticated, recorded as refused).
    #[error(transparent)]
    Refused(#[from] WebhookError),
    /// The store could not record it: the sender should deliver it again.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks a delivery and records its firing in `store` before its run exists; a delivery id already
/// recorded is a replay and fires nothing.
pub fn receive(
    store: &dyn RunStore,
    hook: &Webhook,
    delivery: &Delivery<'_>,
    now: Timestamp,
) -> Result<Received, ReceiveError> {
    let at = millis(now);
    let mut firing = Firing {
        workflow: hook.workflow.clone(),
        trigger: hook.trigger.clone(),
        kind: FiringKind::Webhook,
        slot: String::new(),
        slot_at: at,
        fired_at: at,
        run_id: None,
        outcome: FiringOutcome::Refused,
        reason: None,
        inputs: Map::new(),
    };
    match hook.verify(delivery) {
        Ok(verified) => {
            firing.slot = verified.delivery;
            firing.inputs = verified.inputs;
            firing.run_id = Some(crate::store::new_run_id());
            firing.outcome = FiringOutcome::Started;
            if store.record_firing(&firing)? {
                Ok(Received::Fired(firing))
            } else {
                Ok(Received::Replayed {
                    delivery: firing.slot,
                })
            }
        }
        Err(refused) if refused.authenticated() => {
            // Verification checks the id before the body: an authenticated refusal has one.
            firing.slot = delivery.id.unwrap_or_default().trim().to_owned();
            firing.reason = Some(refused.to_string());
            if store.record_firing(&firing)? {
                Err(refused.into())
            } else {
                Ok(Received::Replayed {
                    delivery: firing.slot,
                })
            }
        }
        Err(refused) => Err(refused.into()),
    }
}

/// Bytes from lowercase or uppercase hex; `None` unless every pair reads.
fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Whether two digests are equal, looking at every byte whatever the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The signature a sender puts in `X-Archon-Signature` for `body` under `secret`: `sha256=<hex>`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = match hmac::Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        // HMAC takes keys of any length.
        Err(_) => return String::new(),
    };
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_reads_pairs_and_signatures_are_lowercase_hex() {
        assert_eq!(from_hex("00ffA0"), Some(vec![0, 255, 160]));
        assert_eq!(from_hex("0"), None);
        assert_eq!(from_hex("zz"), None);
        // RFC 4231, test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
