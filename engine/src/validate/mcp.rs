//! MCP servers (`tools: NAME: { mcp: ... }`): each is resolved to a [`ServerDef`] — its transport from
//! `command`/`url` or from the `mcpServers` file `from` names, its `tools` globs, its limits and the key
//! of its cached tool list — and, when the validator has a state directory, the tool list kept there by
//! `archon mcp list` is loaded so that calls to the server's tools are checked without starting it.

use std::path::Path;
use std::sync::Arc;

use globset::Glob;

use crate::diagnostic::{Diagnostic, codes};
use crate::source::Span;
use crate::spec::{Duration, McpServer, Spanned, Template};
use crate::tools::mcp::cache::{self, CachedTools};
use crate::tools::mcp::import::{self, ImportError};
use crate::tools::mcp::{DefValue, Limits, ServerDef, TransportDef};
use crate::validate::refs::Scope;
use crate::validate::{Checker, suggest};

impl Checker<'_> {
    /// Resolves every MCP server the spec declares into `self.mcp`, and loads their cached tool lists.
    pub(super) fn check_mcp_servers(&mut self) {
        for (name, def) in &self.spec.tools {
            if let Some(mcp) = &def.mcp {
                self.check_mcp_server(name, mcp);
            }
        }
    }

    fn check_mcp_server(&mut self, name: &Spanned<String>, mcp: &Spanned<McpServer>) {
        let given = [mcp.command.is_some(), mcp.url.is_some(), mcp.from.is_some()];
        if given.iter().filter(|g| **g).count() != 1 {
            self.push(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    mcp.span,
                    "an `mcp` server needs exactly one of `command`, `url` or `from`",
                )
                .with_hint("`command` starts a local server; `url` connects to one over HTTP; `from` reads one from an `mcpServers` JSON file"),
            );
            return;
        }
        if let (Some(server), None) = (&mcp.server, &mcp.from) {
            self.push(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    server.span,
                    "`server` names an entry of the `mcpServers` file `from` reads, and there is no `from`",
                )
                .with_hint(self.syntax(
                    "add `from:` with the file (such as `from: .mcp.json`), or remove `server:`",
                    "add `from` with the file (such as `from = \".mcp.json\"`), or remove `server`",
                )),
            );
        }
        self.check_mcp_templates(mcp);
        if mcp.command.as_ref().is_some_and(Vec::is_empty) {
            self.push(Diagnostic::error(
                codes::INVALID_VALUE,
                mcp.span,
                "`command` needs at least the program to run",
            ));
        }
        let tools_ok = self.check_mcp_globs(mcp);
        let limits = self.check_mcp_limits(mcp);

        let Some(transport) = self.mcp_transport(name, mcp) else {
            return;
        };
        let spec_env = mcp.env.keys().next().map(|k| (k.span, "env"));
        let spec_cwd = mcp.cwd.as_ref().map(|c| (c.span, "cwd"));
        let spec_headers = mcp.headers.keys().next().map(|k| (k.span, "headers"));
        let mut exclusive_ok = true;
        match &transport {
            TransportDef::Http { .. } => {
                for (span, field) in [spec_env, spec_cwd].into_iter().flatten() {
                    exclusive_ok = false;
                    self.push(
                        Diagnostic::error(
                            codes::INVALID_VALUE,
                            span,
                            format!("`{field}` applies only to a server started as a process, and this one is reached over HTTP"),
                        )
                        .with_hint(format!("remove `{field}`, or start the server with `command`")),
                    );
                }
            }
            TransportDef::Stdio { .. } => {
                if let Some((span, field)) = spec_headers {
                    exclusive_ok = false;
                    self.push(
                        Diagnostic::error(
                            codes::INVALID_VALUE,
                            span,
                            format!("`{field}` apply only to a server reached over HTTP, and this one is started as a process"),
                        )
                        .with_hint("remove `headers`, or reach the server with `url`; a process takes secrets in `env`"),
                    );
                }
            }
        }
        let (Some(limits), true, true) = (limits, tools_ok, exclusive_ok) else {
            return;
        };
        let tools: Option<Vec<crate::spec::Pattern>> = mcp
            .tools
            .as_ref()
            .map(|t| t.iter().map(|p| p.value.clone()).collect());
        let key = cache::key(&transport, tools.as_deref());
        if let Some(dir) = self.mcp_cache.clone() {
            let listed = cache::read(&dir, &key).map(Arc::new);
            if let (Some(list), Some(patterns)) = (&listed, &mcp.tools) {
                self.check_mcp_globs_listed(&name.value, patterns, list);
            }
            if listed.is_none() {
                self.mcp_unlisted.push(
                    Diagnostic::warning(
                        codes::MCP_NOT_LISTED,
                        name.span,
                        format!(
                            "the tools of MCP server `{}` have not been listed yet: calls to them are not checked",
                            name.value
                        ),
                    )
                    .with_hint(format!(
                        "run `archon mcp list {}` to start it and keep its tool list",
                        self.file.path.display()
                    )),
                );
            }
            self.mcp_lists.insert(name.value.clone(), listed);
        }
        self.mcp.insert(
            name.value.clone(),
            Arc::new(ServerDef {
                name: name.value.clone(),
                transport,
                tools,
                limits,
                key,
            }),
        );
    }

    /// Templates of a server's definition: secrets only in `env` and `headers`, never in its command
    /// line (which other users of the machine can read), URL or directory.
    fn check_mcp_templates(&mut self, mcp: &McpServer) {
        for arg in mcp.command.iter().flatten() {
            self.template(arg, &Scope::new("an MCP server's command"));
        }
        if let Some(url) = &mcp.url {
            self.template(url, &Scope::new("an MCP server's URL"));
        }
        if let Some(cwd) = &mcp.cwd {
            self.template(cwd, &Scope::new("an MCP server's `cwd`"));
        }
        for value in mcp.env.values() {
            self.template(
                value,
                &Scope::new("an MCP server's environment").secrets(true),
            );
        }
        for value in mcp.headers.values() {
            self.template(value, &Scope::new("an MCP server's headers").secrets(true));
        }
    }

    /// The `tools` globs; returns whether every one is valid.
    fn check_mcp_globs(&mut self, mcp: &McpServer) -> bool {
        let mut ok = true;
        for pattern in mcp.tools.iter().flatten() {
            if let Err(err) = Glob::new(pattern.value.as_str()) {
                ok = false;
                self.push(Diagnostic::error(
                    codes::INVALID_GLOB,
                    pattern.span,
                    format!(
                        "invalid glob `{}`: {}",
                        pattern.value,
                        err.kind().to_string().to_lowercase()
                    ),
                ));
            }
        }
        ok
    }

    /// Warns of each `tools` glob that matches none of the tools the server listed: the kept list holds
    /// every tool some glob matched, so a glob that matches none of them matched none of the server's.
    fn check_mcp_globs_listed(
        &mut self,
        server: &str,
        patterns: &[Spanned<crate::spec::Pattern>],
        list: &CachedTools,
    ) {
        for pattern in patterns {
            let Ok(glob) = Glob::new(pattern.value.as_str()) else {
                continue;
            };
            let matcher = glob.compile_matcher();
            if list.tools.iter().any(|t| matcher.is_match(&t.name)) {
                continue;
            }
            let names: Vec<&str> = list.tools.iter().map(|t| t.name.as_str()).collect();
            self.push(
                Diagnostic::warning(
                    codes::PATTERN_MATCHES_NOTHING,
                    pattern.span,
                    format!(
                        "`{}` matches none of the tools MCP server `{server}` listed",
                        pattern.value.as_str()
                    ),
                )
                .with_hint_opt(
                    (!names.is_empty())
                        .then(|| format!("the tools its `tools` keep: {}", suggest::list(&names))),
                ),
            );
        }
    }

    /// `startup_timeout`, `call_timeout`, `max_call_timeout` and `restarts` over [`Limits::default`].
    fn check_mcp_limits(&mut self, mcp: &McpServer) -> Option<Limits> {
        let defaults = Limits::default();
        let startup = self.mcp_duration(mcp.startup_timeout.as_ref(), defaults.startup_timeout)?;
        let call = self.mcp_duration(mcp.call_timeout.as_ref(), defaults.call_timeout);
        let max = self.mcp_duration(mcp.max_call_timeout.as_ref(), defaults.max_call_timeout);
        let (call, max) = (call?, max?);
        if call > max {
            let at = mcp
                .call_timeout
                .as_ref()
                .or(mcp.max_call_timeout.as_ref())
                .map_or(Span::new(self.file.id, 0, 0), |d| d.span);
            let shown = |d: Option<&Duration>, value: std::time::Duration| match d {
                Some(d) => format!("`{}`", d.value.text.trim()),
                None => format!("`{}`, the default", humantime::format_duration(value)),
            };
            let mut diagnostic = Diagnostic::error(
                codes::INVALID_VALUE,
                at,
                format!(
                    "`call_timeout` ({}) is longer than `max_call_timeout` ({})",
                    shown(mcp.call_timeout.as_ref(), call),
                    shown(mcp.max_call_timeout.as_ref(), max)
                ),
            )
            .with_hint("`call_timeout` bounds a call without news from the server, `max_call_timeout` a call in all: make `call_timeout` the shorter");
            if let (Some(_), Some(m)) = (&mcp.call_timeout, &mcp.max_call_timeout) {
                diagnostic = diagnostic.with_label(m.span, "`max_call_timeout` given here");
            }
            self.push(diagnostic);
            return None;
        }
        Some(Limits {
            startup_timeout: startup,
            call_timeout: call,
            max_call_timeout: max,
            restarts: mcp.restarts.as_ref().map_or(defaults.restarts, |r| r.value),
        })
    }

    fn mcp_duration(
        &mut self,
        written: Option<&Duration>,
        default: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let Some(duration) = written else {
            return Some(default);
        };
        if !self.check_duration(duration) {
            return None;
        }
        let value = duration.value.get()?;
        if value.is_zero() {
            self.push(Diagnostic::error(
                codes::INVALID_VALUE,
                duration.span,
                format!("`{}` leaves no time at all", duration.value.text.trim()),
            ));
            return None;
        }
        Some(value)
    }

    /// The server's transport: from `command` (with `env`, `cwd`) or `url` (with `headers`) as templates,
    /// or from the `from` file's entry as literals, with the spec's `env`, `cwd` or `headers` added.
    fn mcp_transport(&mut self, name: &Spanned<String>, mcp: &McpServer) -> Option<TransportDef> {
        let templates =
            |map: &indexmap::IndexMap<Spanned<String>, Template>| -> Vec<(String, DefValue)> {
                map.iter()
                    .map(|(k, v)| (k.value.clone(), DefValue::Template(v.value.clone())))
                    .collect()
            };
        if let Some(command) = &mcp.command {
            return Some(TransportDef::Stdio {
                argv: command
                    .iter()
                    .map(|a| DefValue::Template(a.value.clone()))
                    .collect(),
                env: templates(&mcp.env),
                cwd: mcp
                    .cwd
                    .as_ref()
                    .map(|c| DefValue::Template(c.value.clone())),
            });
        }
        if let Some(url) = &mcp.url {
            return Some(TransportDef::Http {
                url: DefValue::Template(url.value.clone()),
                headers: templates(&mcp.headers),
            });
        }
        let from = mcp.from.as_ref()?;
        let entry = mcp
            .server
            .as_ref()
            .map_or(name.value.as_str(), |s| s.value.as_str());
        let base = self.file.path.parent().unwrap_or(Path::new(""));
        let path = base.join(&from.value);
        match import::import(&path, entry) {
            Ok(TransportDef::Stdio { argv, mut env, cwd }) => {
                // The spec's own values come last, so they win over the file's.
                let spec_env = templates(&mcp.env);
                env.retain(|(k, _)| !spec_env.iter().any(|(s, _)| s == k));
                env.extend(spec_env);
                Some(TransportDef::Stdio {
                    argv,
                    env,
                    cwd: mcp
                        .cwd
                        .as_ref()
                        .map(|c| DefValue::Template(c.value.clone()))
                        .or(cwd),
                })
            }
            Ok(TransportDef::Http { url, mut headers }) => {
                let spec_headers = templates(&mcp.headers);
                headers
                    .retain(|(k, _)| !spec_headers.iter().any(|(s, _)| s.eq_ignore_ascii_case(k)));
                headers.extend(spec_headers);
                Some(TransportDef::Http { url, headers })
            }
            Err(ImportError::NotFound) => {
                self.push(
                    Diagnostic::error(
                        codes::FILE_NOT_FOUND,
                        from.span,
                        format!("MCP servers file `{}` does not exist", from.value),
                    )
                    .with_hint(format!(
                        "paths are relative to this spec's directory; looked for `{}`",
                        path.display()
                    )),
                );
                None
            }
            Err(ImportError::Unreadable(reason)) => {
                self.push(Diagnostic::error(
                    codes::INVALID_MCP_FILE,
                    from.span,
                    format!("cannot read `{}`: {reason}", from.value),
                ));
                None
            }
            Err(ImportError::Invalid { message, hint }) => {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_MCP_FILE,
                        from.span,
                        format!("`{}`: {message}", from.value),
                    )
                    .with_hint_opt(hint),
                );
                None
            }
            Err(ImportError::NoEntry { names }) => {
                let at = mcp.server.as_ref().map_or(from.span, |s| s.span);
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                self.push(
                    Diagnostic::error(
                        codes::UNKNOWN_MCP_SERVER,
                        at,
                        format!("`{}` has no server `{entry}`", from.value),
                    )
                    .with_hint_opt(suggest::did_you_mean(entry, names.iter().copied()))
                    .with_hint_opt(
                        (!names.is_empty())
                            .then(|| format!("its servers are {}", suggest::list(&names))),
                    )
                    .with_hint_opt(mcp.server.is_none().then(|| {
                        self.syntax(
                            "the entry read is the tool's name unless `server:` names another",
                            "the entry read is the tool's name unless `server` names another",
                        )
                        .to_owned()
                    })),
                );
                None
            }
        }
    }

    /// The tool list kept for MCP server `server`, if validation has one.
    pub(super) fn mcp_listed(&self, server: &str) -> Option<Arc<CachedTools>> {
        self.mcp_lists.get(server).cloned().flatten()
    }

    /// Every `server.tool` of the servers whose lists are kept, and whether some server has none (so
    /// that names not listed may still exist).
    pub(super) fn mcp_listed_names(&self) -> (Vec<String>, bool) {
        let mut names = Vec::new();
        let mut unknown = false;
        for (name, def) in &self.spec.tools {
            if def.mcp.is_none() {
                continue;
            }
            match self.mcp_listed(&name.value) {
                Some(list) => names.extend(
                    list.tools
                        .iter()
                        .map(|t| format!("{}.{}", name.value, t.name)),
                ),
                None => unknown = true,
            }
        }
        (names, unknown)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::tools::mcp::{DefValue, Limits, TransportDef, cache};
    use crate::validate::validate_file as validate;

    fn t(s: &str) -> DefValue {
        DefValue::Template(s.to_owned())
    }

    fn l(s: &str) -> DefValue {
        DefValue::Literal(s.to_owned())
    }

    #[test]
    fn servers_resolve_to_their_definitions_with_limits_and_keys() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            dir.path().join(".mcp.json"),
            r#"{"mcpServers": {
                "fs": {"command": "fs-server", "args": ["--root", "${ROOT:-.}"], "env": {"A": "1", "B": "2"}},
                "docs": {"type": "http", "url": "https://docs.example/mcp", "headers": {"Authorization": "Bearer x"}}
            }}"#,
        )
        .expect("written");
        let spec = dir.path().join("w.yaml");
        std::fs::write(
            &spec,
            r#"name: w
secrets: [TOKEN]
tools:
  github:
    mcp:
      command: [github-mcp-server, stdio]
      env: { GITHUB_TOKEN: "{{ secrets.TOKEN }}" }
      tools: ["get_*"]
      call_timeout: 2m
      max_call_timeout: 20m
      restarts: 0
  files:
    mcp: { from: .mcp.json, server: fs, env: { B: "{{ env.HOME }}" } }
  docs:
    mcp: { from: .mcp.json, headers: { authorization: "Bearer {{ secrets.TOKEN }}" } }
steps:
  - id: a
    tool: echo
    with: { message: hi }
"#,
        )
        .expect("written");
        let validation = validate(&spec);
        assert!(
            validation.diagnostics.is_empty(),
            "{:?}",
            validation.diagnostics
        );
        let workflow = validation.workflow.expect("valid");
        let github = &workflow.mcp["github"];
        assert_eq!(
            github.transport,
            TransportDef::Stdio {
                argv: vec![t("github-mcp-server"), t("stdio")],
                env: vec![("GITHUB_TOKEN".to_owned(), t("{{ secrets.TOKEN }}"))],
                cwd: None,
            }
        );
        assert_eq!(
            github.limits,
            Limits {
                call_timeout: Duration::from_secs(120),
                max_call_timeout: Duration::from_secs(1200),
                restarts: 0,
                ..Limits::default()
            }
        );
        let globs: Vec<&str> = github.tools.iter().flatten().map(|p| p.as_str()).collect();
        assert_eq!(globs, ["get_*"]);
        assert_eq!(
            github.key,
            cache::key(&github.transport, github.tools.as_deref())
        );
        // The spec's `env` comes after the file's, replacing its value of the same name.
        assert_eq!(
            workflow.mcp["files"].transport,
            TransportDef::Stdio {
                argv: vec![l("fs-server"), l("--root"), l("${ROOT:-.}")],
                env: vec![
                    ("A".to_owned(), l("1")),
                    ("B".to_owned(), t("{{ env.HOME }}"))
                ],
                cwd: None,
            }
        );
        assert_eq!(workflow.mcp["files"].limits, Limits::default());
        // Header names compare without case.
        assert_eq!(
            workflow.mcp["docs"].transport,
            TransportDef::Http {
                url: l("https://docs.example/mcp"),
                headers: vec![("authorization".to_owned(), t("Bearer {{ secrets.TOKEN }}"))],
            }
        );
        let keys: std::collections::BTreeSet<&str> =
            workflow.mcp.values().map(|d| d.key.as_str()).collect();
        assert_eq!(keys.len(), 3, "each server has its own key");
    }
}
