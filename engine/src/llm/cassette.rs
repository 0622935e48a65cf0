//! Record and replay: a [`Recorder`] wraps a provider and appends every request with its response (or
//! error) to a cassette; a [`Replayer`] answers from a cassette with no network, and fails loudly on a
//! request that matches no recorded one, naming the first difference.
//!
//! A cassette is JSON Lines: a header `{"archon_cassette": 1}`, then one exchange per line. It holds the
//! canonical requests and responses, never API keys (those travel only in HTTP headers); a run's recorder
//! masks secret values in both before they are written ([`Recorder::scrubbing`]).

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::{BoxFuture, ChatRequest, ChatResponse, LlmError, Provider};

/// The cassette format version.
pub const CASSETTE_VERSION: u32 = 1;

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    pub provider: String,
    pub request: ChatRequest,
    pub response: Result<ChatResponse, String>,
}

/// Masks what an exchange holds, as JSON, before it is written.
pub type Scrub = Arc<dyn Fn(&mut Json) + Send + Sync>;

/// Appends every exchange of the wrapped provider to a cassette file.
pub struct Recorder {
    inner: Arc<dyn Provider>,
    file: Arc<Mutex<std::fs::File>>,
    scrub: Option<Scrub>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("inner", &self.inner)
            .field("scrubbing", &self.scrub.is_some())
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// Starts (or truncates) the cassette at `path`, shared by every provider of a run.
    pub fn open(path: &Path) -> Result<Arc<Mutex<std::fs::File>>, LlmError> {
        let mut file = std::fs::File::create(path).map_err(|e| {
            LlmError::fatal(format!(
                "cannot write cassette `{}`: {}",
                path.display(),
                e.to_string().to_lowercase()
            ))
        })?;
        writeln!(
            file,
            "{}",
            serde_json::json!({ "archon_cassette": CASSETTE_VERSION })
        )
        .map_err(|e| LlmError::fatal(format!("cannot write cassette `{}`: {e}", path.display())))?;
        Ok(Arc::new(Mutex::new(file)))
    }

    pub fn new(inner: Arc<dyn Provider>, file: Arc<Mutex<std::fs::File>>) -> Self {
        Recorder {
            inner,
            file,
            scrub: None,
        }
    }

    /// The same recorder, passing every exchange (request, response or error) through `scrub` before it
    /// is written.
    pub fn scrubbing(self, scrub: Scrub) -> Self {
        Recorder {
            scrub: Some(scrub),
            ..self
        }
    }
}

impl Provider for Recorder {
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Embeddings go to the provider and are not recorded: a replayed run has none.
    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, LlmError>> {
        self.inner.embed(model, inputs)
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            let response = self.inner.complete(request).await;
            let exchange = Exchange {
                provider: self.name().to_owned(),
                request: request.clone(),
                response: response.clone().map_err(|e| e.message),
            };
            let mut value = serde_json::to_value(&exchange).unwrap_or(Json::Null);
            if let Some(scrub) = &self.scrub {
                scrub(&mut value);
            }
            let line = value.to_string();
            let written = self.file.lock().map_err(|_| ()).and_then(|mut f| {
                writeln!(f, "{line}")
                    .and_then(|()| f.flush())
                    .map_err(|_| ())
            });
            if written.is_err() {
                return Err(LlmError::fatal(format!(
                    "provider `{}`: the exchange could not be written to the cassette",
                    self.name()
                )));
            }
            response
        })
    }
}

/// Answers from a cassette, without the network.
#[derive(Debug)]
pub struct Replayer {
    name: String,
    /// This provider's exchanges, and whether each was used.
    exchanges: Mutex<Vec<(Exchange, bool)>>,
    /// Requests match whatever model they name: a provider of kind `auto` records the model of
    /// whichever vendor the environment chose.
    any_model: bool,
}

impl Replayer {
    /// Reads every exchange of a cassette.
    pub fn read(path: &Path) -> Result<Vec<Exchange>, LlmError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            LlmError::fatal(format!(
                "cannot read cassette `{}`: {}",
                path.display(),
                e.to_string().to_lowercase()
            ))
        })?;
        let mut lines = text.lines().enumerate();
        let header: Option<Json> = lines.next().and_then(|(_, l)| serde_json::from_str(l).ok());
        if header
            .as_ref()
            .and_then(|h| h.get("archon_cassette"))
            .and_then(Json::as_u64)
            != Some(u64::from(CASSETTE_VERSION))
        {
            return Err(LlmError::fatal(format!(
                "`{}` is not an archon cassette (version {CASSETTE_VERSION})",
                path.display()
            )));
        }
        lines
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(n, line)| {
                serde_json::from_str(line).map_err(|e| {
                    LlmError::fatal(format!("cassette `{}` line {}: {e}", path.display(), n + 1))
                })
            })
            .collect()
    }

    /// A replayer for provider `name` over the exchanges recorded for it.
    pub fn new(name: impl Into<String>, exchanges: &[Exchange]) -> Self {
        let name = name.into();
        Replayer {
            exchanges: Mutex::new(
                exchanges
                    .iter()
                    .filter(|e| e.provider == name)
                    .map(|e| (e.clone(), false))
                    .collect(),
            ),
            name,
            any_model: false,
        }
    }

    /// The same replayer, matching requests whatever model they name.
    pub fn any_model(self) -> Self {
        Replayer {
            any_model: true,
            ..self
        }
    }

    fn matches(&self, recorded: &ChatRequest, request: &ChatRequest) -> bool {
        if self.any_model {
            recorded.model != request.model
                && ChatRequest {
                    model: request.model.clone(),
                    ..recorded.clone()
                } == *request
                || recorded == request
        } else {
            recorded == request
        }
    }
}

impl Provider for Replayer {
    fn name(&self) -> &str {
        &self.name
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            let mut exchanges = self
                .exchanges
                .lock()
                .map_err(|_| LlmError::fatal(format!("provider `{}` failed earlier", self.name)))?;
            if let Some((exchange, used)) = exchanges
                .iter_mut()
                .find(|(e, used)| !*used && self.matches(&e.request, request))
            {
                *used = true;
                return exchange.response.clone().map_err(LlmError::fatal);
            }
            let next = exchanges.iter().find(|(_, used)| !*used).map(|(e, _)| e);
            let why = match next {
                None => "every recorded exchange was used".to_owned(),
                Some(next) => {
                    let (a, b) = (
                        serde_json::to_value(&next.request).unwrap_or(Json::Null),
                        serde_json::to_value(request).unwrap_or(Json::Null),
                    );
                    match first_difference(&a, &b, "request") {
                        Some(diff) => format!("the next recorded request differs at {diff}"),
                        None => "no recorded request matches".to_owned(),
                    }
                }
            };
            Err(LlmError::fatal(format!(
                "provider `{}`: replay: this request was not recorded: {why}",
                self.name
            )))
        })
    }
}

/// Where two JSON values first differ, as a path.
fn first_difference(recorded: &Json, asked: &Json, path: &str) -> Option<String> {
    match (recorded, asked) {
        (Json::Object(a), Json::Object(b)) => {
            for (key, value) in a {
                let inner = format!("{path}.{key}");
                match b.get(key) {
                    Some(other) => {
                        if let Some(diff) = first_difference(value, other, &inner) {
                            return Some(diff);
                        }
                    }
                    None => return Some(format!("`{inner}` (missing)")),
                }
            }
            b.keys()
                .find(|k| !a.contains_key(*k))
                .map(|k| format!("`{path}.{k}` (not recorded)"))
        }
        (Json::Array(a), Json::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                if let Some(diff) = first_difference(x, y, &format!("{path}[{i}]")) {
                    return Some(diff);
                }
            }
            (a.len() != b.len())
                .then(|| format!("`{path}` ({} items recorded, {} asked)", a.len(), b.len()))
        }
        _ if recorded == asked => None,
        _ => Some(format!("`{path}`")),
    }
}
