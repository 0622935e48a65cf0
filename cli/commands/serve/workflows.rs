//! The workflows `archon serve` offers: every spec under DIR, valid or not, with its diagnostics as
//! `archon validate` renders them; the valid ones can be run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use archon_engine::Workflow;
use archon_engine::redact::Redactor;
use archon_engine::validate::validate_file;
use serde_json::{Value as Json, json};

use super::Refusal;
use crate::output;
use crate::render::{self, Report};

/// One spec file under DIR.
#[derive(Debug)]
pub struct Served {
    /// How the API and the pages name it: its name, or, when several files under DIR have the same
    /// name, its file's path under DIR.
    pub id: String,
    /// The workflow's name (`name:`), or the file's stem when the spec does not read far enough to have one.
    pub name: String,
    pub description: Option<String>,
    /// The spec file, as found under DIR.
    pub path: PathBuf,
    /// The validated workflow, when it has no error: only such a workflow can run.
    pub workflow: Option<Arc<Workflow>>,
    /// Diagnostics as `archon validate` writes them, without color (empty when there is none).
    pub diagnostics: String,
    pub errors: usize,
    pub warnings: usize,
    /// The inputs as one JSON Schema object.
    pub input_schema: Json,
}

/// The served workflows, by name.
#[derive(Debug, Default)]
pub struct Catalog {
    pub workflows: BTreeMap<String, Arc<Served>>,
}

impl Catalog {
    /// Validates every spec under `dir` (walked as `archon validate` walks directories). Two valid
    /// workflows of the same name are both made invalid (see [`refuse_shared_names`]); a directory
    /// without any spec, or that does not exist, is refused.
    pub fn load(dir: &Path) -> anyhow::Result<Result<Catalog, Refusal>> {
        // A path that is not there would be served as one spec that cannot be read: refused instead.
        if let Err(e) = std::fs::metadata(dir) {
            return Ok(Err(Refusal {
                message: format!(
                    "cannot read `{}`: {}",
                    dir.display(),
                    super::app::tidy(&e.to_string())
                ),
                hint: String::new(),
            }));
        }
        let found = super::super::validate::collect(&[dir.to_path_buf()])?;
        let mut catalog = Catalog::default();
        let mut invalid = 0;
        let mut all = Vec::new();
        for file in &found.files {
            let validation = validate_file(file);
            let mut report = Report::default();
            report.add(file, validation.diagnostics.clone(), &validation.sources);
            let mut text = Vec::new();
            if report.errors() + report.warnings() > 0 {
                let _ = render::write_text(&report, false, &mut text);
            }
            let (errors, warnings) = (report.errors(), report.warnings());
            let workflow = validation.workflow.filter(|_| errors == 0).map(Arc::new);
            if workflow.is_none() {
                invalid += 1;
            }
            let name = match &workflow {
                Some(w) => w.name.clone(),
                None => file.file_stem().map_or_else(
                    || file.display().to_string(),
                    |s| s.to_string_lossy().into_owned(),
                ),
            };
            let input_schema = workflow.as_deref().map_or_else(
                || json!({"type": "object"}),
                |w| Json::Object(crate::commands::serving::input_schema(w)),
            );
            let description = workflow.as_ref().and_then(|w| w.spec.description.clone());
            all.push(Served {
                id: String::new(),
                name,
                description,
                path: file.clone(),
                workflow,
                diagnostics: String::from_utf8_lossy(&text).into_owned(),
                errors,
                warnings,
                input_schema,
            });
        }
        let invalid = invalid + refuse_shared_names(&mut all, dir);
        // A valid workflow is known by its name (unique among them now); a spec that does not validate by
        // the name it has, unless another file has it too: then by its file's path under DIR.
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for served in &all {
            *count.entry(served.name.as_str()).or_default() += 1;
        }
        let valid: std::collections::BTreeSet<String> = all
            .iter()
            .filter(|s| s.workflow.is_some())
            .map(|s| s.name.clone())
            .collect();
        let own: Vec<bool> = all
            .iter()
            .map(|s| s.workflow.is_some() || count[s.name.as_str()] == 1)
            .collect();
        for (mut served, own) in all.into_iter().zip(own) {
            served.id = if own && !(served.workflow.is_none() && valid.contains(&served.name)) {
                served.name.clone()
            } else {
                under(dir, &served.path)
            };
            catalog
                .workflows
                .insert(served.id.clone(), Arc::new(served));
        }
        if catalog.workflows.is_empty() {
            return Ok(Err(Refusal {
                message: format!("no workflow to serve in `{}`", dir.display()),
                hint: "`archon init` writes a starter workflow; `archon validate DIR` shows what is found"
                    .to_owned(),
            }));
        }
        let mut text = format!(
            "serving {} workflow{}",
            catalog.workflows.len(),
            if catalog.workflows.len() == 1 {
                ""
            } else {
                "s"
            }
        );
        if invalid > 0 {
            let _ = write!(text, " ({invalid} with errors: shown, not run)");
        }
        text.push('\n');
        output::stderr(&output::printable(&text));
        Ok(Ok(catalog))
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Served>> {
        self.workflows.get(name)
    }

    /// The values of every secret a served workflow (or one of its sub-workflows) declares, as a run of it
    /// would read them now (environment, else `.env` beside the spec): what no response may contain.
    pub fn secret_values(&self) -> Redactor {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        let mut values = Vec::new();
        for served in self.workflows.values() {
            let Some(workflow) = &served.workflow else {
                continue;
            };
            let mut stack: Vec<&Workflow> = vec![workflow];
            while let Some(w) = stack.pop() {
                let dir = w
                    .sources
                    .iter()
                    .next()
                    .and_then(|f| f.path.parent())
                    .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
                for name in &w.spec.secrets {
                    let one =
                        archon_engine::run::secrets::values([name.value.as_str()], &env, &dir);
                    if let Ok(found) = one {
                        values.extend(found.into_iter().filter_map(|(_, v)| match v {
                            Json::String(s) => Some(s),
                            _ => None,
                        }));
                    }
                }
                stack.extend(w.subworkflows.values().map(|s| &**s));
            }
        }
        Redactor::new(values)
    }
}

/// `path` under `dir`, as the pages and the API show it.
fn under(dir: &Path, path: &Path) -> String {
    path.strip_prefix(dir).unwrap_or(path).display().to_string()
}

/// Makes every valid workflow whose name another valid one under `dir` has too a spec with an error that
/// names the other files: which one a run, a trigger or a webhook delivery of that name means would be a
/// guess, so none of them runs (and their triggers do not fire) until each has a name of its own. Says
/// so on standard error; returns how many were valid before.
fn refuse_shared_names(all: &mut [Served], dir: &Path) -> usize {
    let mut by_name: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, served) in all.iter().enumerate() {
        if served.workflow.is_some() {
            by_name.entry(served.name.clone()).or_default().push(i);
        }
    }
    let mut refused = 0;
    for (name, files) in by_name.into_iter().filter(|(_, files)| files.len() > 1) {
        let paths: Vec<String> = files.iter().map(|&i| under(dir, &all[i].path)).collect();
        for (n, &i) in files.iter().enumerate() {
            let others: Vec<String> = paths
                .iter()
                .enumerate()
                .filter(|(m, _)| *m != n)
                .map(|(_, p)| format!("`{p}`"))
                .collect();
            let served = &mut all[i];
            served.workflow = None;
            served.errors += 1;
            served.input_schema = json!({"type": "object"});
            let _ = write!(
                served.diagnostics,
                "{}error: the workflow name `{name}` is also the name of {}\n  = hint: give each workflow a name of its own: none of them runs, and their triggers do not fire, until then\n",
                if served.diagnostics.is_empty() {
                    ""
                } else {
                    "\n"
                },
                others.join(", ")
            );
            refused += 1;
        }
        output::stderr(&output::printable(&format!(
            "warning: {} name their workflow `{name}`: none of them runs, and their triggers do not fire\n",
            paths
                .iter()
                .map(|p| format!("`{p}`"))
                .collect::<Vec<_>>()
                .join(" and ")
        )));
    }
    refused
}
