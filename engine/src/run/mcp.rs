//! MCP servers outside and inside a run: a server's definition rendered into the configuration the pool
//! starts ([`render_server`]), and every server of a workflow started and listed once, for `archon mcp
//! list` and `archon tools --refresh` ([`list_servers`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value as Json, json};

use super::redact::Redactor;
use super::render::{Renderer, context_value};
use crate::tools::mcp::{
    DefValue, McpTool, ServerConfig, ServerDef, Servers, ServersOptions, Transport, TransportDef,
};
use crate::workflow::Workflow;

/// The templates of a server's definition, in order: each is rendered by the caller (with the run's
/// renderer and context) and the results given to [`render_server`].
pub(crate) fn templates(def: &ServerDef) -> Vec<&str> {
    let values: Vec<&DefValue> = match &def.transport {
        TransportDef::Stdio { argv, env, cwd } => argv
            .iter()
            .chain(env.iter().map(|(_, v)| v))
            .chain(cwd.iter())
            .collect(),
        TransportDef::Http { url, headers } => std::iter::once(url)
            .chain(headers.iter().map(|(_, v)| v))
            .collect(),
    };
    values
        .into_iter()
        .filter_map(|v| match v {
            DefValue::Template(t) => Some(t.as_str()),
            DefValue::Literal(_) => None,
        })
        .collect()
}

/// A server's definition as the pool starts it: its templates replaced by `rendered` (what
/// [`templates`] listed, rendered, in the same order), its literals (from an `mcpServers` file) with
/// `${VAR}` taken from `env`, its `cwd` inside `workdir`.
pub(crate) fn render_server(
    def: &ServerDef,
    workdir: &Path,
    env: &BTreeMap<String, String>,
    rendered: Vec<String>,
) -> Result<ServerConfig, String> {
    let mut rendered = rendered.into_iter();
    let mut value = |v: &DefValue| -> Result<String, String> {
        match v {
            DefValue::Template(_) => rendered
                .next()
                .ok_or_else(|| "a template was not rendered".to_owned()),
            DefValue::Literal(text) => crate::tools::mcp::import::expand(text, env),
        }
    };
    let transport = match &def.transport {
        TransportDef::Stdio { argv, env, cwd } => {
            let args = argv.iter().map(&mut value).collect::<Result<Vec<_>, _>>()?;
            if args.first().is_none_or(String::is_empty) {
                return Err("its `command` is empty".to_owned());
            }
            let vars = env
                .iter()
                .map(|(k, v)| Ok((k.clone(), value(v)?)))
                .collect::<Result<Vec<_>, String>>()?;
            let cwd = match cwd {
                Some(cwd) => {
                    let dir = value(cwd)?;
                    crate::tools::builtin::confine(workdir, &dir).map_err(|e| e.message)?
                }
                None => workdir.to_path_buf(),
            };
            Transport::Stdio {
                argv: args,
                env: vars,
                cwd,
            }
        }
        TransportDef::Http { url, headers } => {
            let url = value(url)?;
            let headers = headers
                .iter()
                .map(|(k, v)| Ok((k.clone(), value(v)?)))
                .collect::<Result<Vec<_>, String>>()?;
            Transport::Http { url, headers }
        }
    };
    Ok(ServerConfig {
        name: def.name.clone(),
        transport,
        tools: def
            .tools
            .as_ref()
            .map(|t| t.iter().map(|p| p.as_str().to_owned()).collect()),
        limits: def.limits,
    })
}

/// The values of archon's environment that `workflow`'s `mcpServers` files pass to a server's `env`,
/// `headers` or `url` through `${VAR}`: tokens, as a rule, and masked like declared secrets (a variable
/// in `args` or `cwd`, a path as a rule, is not).
pub(crate) fn imported_secrets(workflow: &Workflow, env: &BTreeMap<String, String>) -> Vec<String> {
    let mut values = Vec::new();
    for def in workflow.mcp.values() {
        let carried: Vec<&DefValue> = match &def.transport {
            TransportDef::Stdio { env, .. } => env.iter().map(|(_, v)| v).collect(),
            TransportDef::Http { url, headers } => std::iter::once(url)
                .chain(headers.iter().map(|(_, v)| v))
                .collect(),
        };
        for value in carried {
            let DefValue::Literal(text) = value else {
                continue;
            };
            for (name, _) in crate::tools::mcp::import::references(text).unwrap_or_default() {
                if let Some(value) = env.get(&name).filter(|v| !v.is_empty()) {
                    values.push(value.clone());
                }
            }
        }
    }
    values
}

/// What listing one server found.
#[derive(Debug)]
pub struct Listed {
    /// The server's name in the spec.
    pub server: String,
    /// Its definition (whose `key` names its cached list).
    pub def: Arc<ServerDef>,
    /// Its tools after its `tools` filter, or why it could not be started or listed (secrets masked).
    pub tools: Result<Vec<McpTool>, String>,
}

/// Starts every MCP server of `workflow` (in `workdir`, with the process environment `env`), lists its
/// tools and stops it. Templates see `env`, `secrets` and the inputs' defaults (a template that needs an
/// input without one fails that server). When `cancel` fires, the server being started is given up and
/// every server stopped.
pub async fn list_servers(
    workflow: &Workflow,
    workdir: &Path,
    env: BTreeMap<String, String>,
    cancel: &tokio_util::sync::CancellationToken,
) -> Vec<Listed> {
    let spec = &workflow.spec;
    let dir = workflow.path.parent().unwrap_or(Path::new(""));
    let secrets = super::secrets::values(spec.secrets.iter().map(|s| s.value.as_str()), &env, dir);
    let inputs = crate::inputs::resolve(spec, Map::new(), &[]).unwrap_or_default();
    let redactor = Arc::new(Redactor::new(
        secrets
            .iter()
            .flat_map(|s| s.values())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .chain(imported_secrets(workflow, &env)),
    ));
    let mut ctx = Map::new();
    ctx.insert("inputs".into(), Json::Object(inputs));
    ctx.insert(
        "env".into(),
        Json::Object(
            env.iter()
                .map(|(k, v)| (k.clone(), Json::String(v.clone())))
                .collect(),
        ),
    );
    ctx.insert("run".into(), json!({ "id": "", "workflow": workflow.name }));
    ctx.insert(
        "secrets".into(),
        Json::Object(secrets.clone().unwrap_or_default()),
    );
    let ctx = context_value(ctx);
    let renderer = Renderer::new(None);
    let servers = Servers::new(ServersOptions {
        withheld: spec.secrets.iter().map(|s| s.value.clone()).collect(),
        network: workflow.network.clone(),
        redactor: redactor.clone(),
        on_spawn: Arc::new(|_| {}),
    });
    let mut listed = Vec::new();
    for (name, def) in &workflow.mcp {
        let tools = async {
            secrets.as_ref().map_err(Clone::clone)?;
            let mut rendered = Vec::new();
            for t in templates(def) {
                rendered.push(renderer.text(t, &ctx).await.map_err(|e| e.message)?);
            }
            let config = render_server(def, workdir, &env, rendered)?;
            let tools = servers
                .tools(&config, cancel)
                .await
                .map_err(|e| e.message)?;
            Ok::<_, String>(tools.to_vec())
        };
        listed.push(Listed {
            server: name.clone(),
            def: def.clone(),
            tools: tools.await.map_err(|e| redactor.text(&e).into_owned()),
        });
    }
    servers.shutdown().await;
    listed
}
