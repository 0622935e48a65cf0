//! The validated workflow: a spec whose references, kinds and graph are known to be sound.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::network::NetworkPolicy;
use crate::source::Sources;
use crate::spec::Spec;
use crate::tools::Registry;

/// A spec that passed validation, with its dependency graphs resolved and its sub-workflows loaded.
#[derive(Debug, Clone)]
pub struct Workflow {
    pub name: String,
    /// The spec file it was read from (for a plan, the path the plan is read as, beside its workflow).
    pub path: std::path::PathBuf,
    pub spec: Arc<Spec>,
    /// For each step (by index in `spec.steps`), the indexes of the steps it depends on.
    pub dependencies: Vec<Vec<usize>>,
    /// Step indexes in a topological order.
    pub order: Vec<usize>,
    /// The step graph of each composite tool (`tools.<name>.steps`), by tool name.
    pub composites: BTreeMap<String, StepGraph>,
    /// The validated sub-workflows this spec calls (as steps or tools), by the path written in the spec.
    pub subworkflows: BTreeMap<String, Arc<Workflow>>,
    /// Every file the workflow was read from (the spec and its sub-workflows).
    pub sources: Sources,
    /// The tools it can call (built-ins and its declared tools), resolved once.
    pub tools: Arc<Registry>,
    /// What its `http` calls may reach (`network.allow`).
    pub network: Arc<NetworkPolicy>,
    /// The hosts the spec names itself (in URLs it writes out, and in `network.allow`), lowercase: an
    /// LLM's request to any other host asks a person first, since its URL could carry data out.
    pub hosts: Arc<std::collections::BTreeSet<String>>,
    /// Its MCP servers (`tools: NAME: { mcp: ... }`), resolved by validation, by tool name.
    pub mcp: BTreeMap<String, Arc<crate::tools::mcp::ServerDef>>,
    /// The Agent Skills each agent may use, found and read by validation.
    pub skills: Arc<crate::skills::Skills>,
}

impl Workflow {
    /// The host of a request `args` describe when the spec does not name it (`None` when it does, or when
    /// the URL has no host to speak of).
    pub fn unnamed_host(&self, args: &serde_json::Value) -> Option<String> {
        let url = url::Url::parse(args.get("url")?.as_str()?).ok()?;
        let listed = match url.host()? {
            url::Host::Ipv4(ip) => self.network.lists(ip.into()),
            url::Host::Ipv6(ip) => self.network.lists(ip.into()),
            url::Host::Domain(_) => false,
        };
        let host = url.host_str()?.trim_end_matches('.').to_ascii_lowercase();
        (!listed && !self.hosts.contains(&host)).then_some(host)
    }
}

/// The hosts `spec` names: of every URL written out (not built by a template) in step and tool
/// arguments, declared HTTP tools, `env` and input defaults, and the host names in `network.allow`.
pub fn named_hosts(spec: &Spec) -> std::collections::BTreeSet<String> {
    let mut hosts = std::collections::BTreeSet::new();
    let mut add = |text: &str| {
        let Some(rest) = text
            .strip_prefix("https://")
            .or_else(|| text.strip_prefix("http://"))
        else {
            return;
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        if authority.contains("{{") || authority.contains("{%") {
            return;
        }
        if let Ok(url) = url::Url::parse(&format!("http://{authority}/"))
            && let Some(host) = url.host_str()
        {
            hosts.insert(host.trim_end_matches('.').to_ascii_lowercase());
        }
    };
    let mut steps: Vec<&crate::spec::Step> = spec.steps.iter().collect();
    for def in spec.tools.values() {
        if let Some(http) = &def.http {
            add(&http.url.value);
        }
        if let Some(inner) = &def.steps {
            steps.extend(inner.value.iter());
        }
    }
    for step in steps {
        let bodies = std::iter::once(step.body()).chain(step.fallback.as_ref().map(|f| f.body()));
        for body in bodies {
            if let Some(args) = body.args {
                args.for_each_str(&mut |s, _| add(s));
            }
        }
    }
    for value in spec.env.values() {
        add(&value.value);
    }
    for schema in spec.inputs.values() {
        schema.for_each_str(&mut |s, _| add(s));
    }
    for allowed in spec.network.iter().flat_map(|n| n.allow.iter()) {
        if crate::network::parse_range(&allowed.value).is_none() {
            hosts.insert(allowed.value.trim_end_matches('.').to_ascii_lowercase());
        }
    }
    hosts
}

/// The dependency graph of one list of steps.
#[derive(Debug, Clone, Default)]
pub struct StepGraph {
    /// For each step (by index in its list), the indexes of the steps it depends on.
    pub dependencies: Vec<Vec<usize>>,
    /// Step indexes in a topological order.
    pub order: Vec<usize>,
}
