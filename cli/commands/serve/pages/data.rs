//! What the pages read that the API module does not give in the shape they need: a run's events and log
//! pieces a page at a time (their run data masked, as the API's), and the workflow a run's graph is drawn from. Reads of the store go through
//! `app.read`, as the API's do.

use std::path::Path;
use std::sync::Arc;

use archon_engine::Workflow;
use archon_engine::session::LogChunk;
use serde_json::Value as Json;

use super::super::app::{ApiError, App};

/// Up to `limit` events of run `id` numbered after `after`, with their numbers, secrets masked; `404` for
/// an unknown run.
pub async fn events(
    app: &Arc<App>,
    id: &str,
    after: i64,
    limit: usize,
) -> Result<Vec<(i64, Json)>, ApiError> {
    let id = id.to_owned();
    let mut events = app
        .read(move |session| {
            super::super::app::known_run(session, &id)?;
            session
                .events_after(&id, after, limit)
                .map_err(|e| ApiError::store(&e))
        })
        .await?;
    for (_, event) in &mut events {
        app.mask_event(event);
    }
    Ok(events)
}

/// Up to `limit` log pieces of run `id` numbered after `after`, secrets masked; `404` for an unknown run.
pub async fn logs(
    app: &Arc<App>,
    id: &str,
    after: i64,
    limit: usize,
) -> Result<Vec<LogChunk>, ApiError> {
    let id = id.to_owned();
    let mut logs = app
        .read(move |session| {
            super::super::app::known_run(session, &id)?;
            session
                .logs_after(&id, after, limit)
                .map_err(|e| ApiError::store(&e))
        })
        .await?;
    for chunk in &mut logs {
        app.mask_log(chunk);
    }
    Ok(logs)
}

/// The workflow a run of `name` from `spec_path` runs, to draw its graph: the served one of that name
/// whose file is the run's, else the served one of that name, else the run's spec file as it is now when
/// it validates (a run started elsewhere). `None` when there is none: the page lists the steps the run
/// recorded instead.
pub async fn workflow_of(app: &Arc<App>, name: &str, spec_path: &str) -> Option<Arc<Workflow>> {
    let run_file = std::fs::canonicalize(spec_path).ok();
    let mut same_name = None;
    for served in app.catalog.workflows.values() {
        let Some(workflow) = &served.workflow else {
            continue;
        };
        if served.name != name {
            continue;
        }
        if run_file.is_some() && std::fs::canonicalize(&served.path).ok() == run_file {
            return Some(workflow.clone());
        }
        same_name.get_or_insert_with(|| workflow.clone());
    }
    if same_name.is_some() {
        return same_name;
    }
    let path = run_file?;
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || {
        let validation = archon_engine::validate::validate_file(Path::new(&path));
        validation.workflow.filter(|w| w.name == name).map(Arc::new)
    })
    .await
    .ok()
    .flatten()
}
