//! The store's reads and its writes outside a run's journal, as async functions on the store's runtime.

use std::collections::HashMap;

use deadpool_postgres::GenericClient;
use indexmap::IndexMap;
use serde_json::{Map, Value as Json};
use tokio_postgres::Row as PgRow;
use tokio_postgres::types::ToSql;

use super::{Failure, Inner, Result};
use crate::record::{self, FORMAT_VERSION, RecordError, Row};
use crate::report::{ApprovalDecision, ApprovalRequest, StepResult};
use crate::store::sqlite::{event_json, my_start_time};
use crate::store::{
    ApprovalRecord, AttemptRecord, CacheEntry, CacheFilter, CacheSummary, Firing, FiringFilter,
    FiringKind, FiringOutcome, LogChunk, NewRun, Owner, Pruned, RunCursor, RunFilter, RunPage,
    RunQuery, RunState, RunSummary, StoreError, StoredRun, TriggerMark, now_ms, spec_hash,
};

/// The columns of a run's summary, as [`summary_of`] reads them.
pub(super) const SUMMARY: &str = "id, workflow, status, started_at, finished_at, owner_pid, owner_host, lease_until, owner_started";

/// The columns [`firing_of`] reads, in its order.
const FIRING: &str =
    "workflow, trigger_name, kind, slot, slot_at, fired_at, run_id, outcome, reason, format";

/// Milliseconds as the store keeps them.
pub(super) fn ms(value: u64) -> i64 {
    value.min(i64::MAX as u64) as i64
}

fn unsigned(value: i64) -> u64 {
    value.max(0) as u64
}

pub(super) fn unknown_run(id: &str) -> StoreError {
    StoreError {
        unknown_run: true,
        ..StoreError::new(format!("no run `{id}` in the run store"))
            .with_hint("`archon runs` lists the runs it holds")
    }
}

/// The error of a read that met rows that do not decode.
fn damaged_rows(inner: &Inner, damage: &[RecordError]) -> Failure {
    let mut message = format!(
        "run store `{}` has {} damaged row{}:",
        inner.shown,
        damage.len(),
        if damage.len() == 1 { "" } else { "s" }
    );
    for error in damage {
        message.push_str("\n  ");
        message.push_str(&error.to_string());
    }
    Failure::Store(StoreError::new(message).with_hint(
        "nothing was changed; `archon runs --check` lists every damaged row in the store",
    ))
}

/// Advances the change counter, once a write has committed (`RunStore::changes`). Prepared once per
/// connection, as every statement a worker sends for each step (a claim bumps it).
pub(super) async fn bump(client: &deadpool_postgres::Client) {
    if let Ok(statement) = client.prepare_cached(BUMP).await {
        let _ = client.query(&statement, &[]).await;
    }
}

/// Advances the change counter (`bump`).
pub(super) const BUMP: &str = "SELECT nextval('archon_changes')";

pub(super) fn owner_of(
    pid: Option<i64>,
    host: Option<String>,
    lease: Option<i64>,
    started: Option<i64>,
) -> Option<Owner> {
    Some(Owner {
        pid: u32::try_from(pid?).ok()?,
        host: host?,
        lease_until: unsigned(lease.unwrap_or(0)),
        started: started.map(unsigned),
    })
}

/// A run's summary from a row of the [`SUMMARY`] columns.
fn summary_of(inner: &Inner, r: &PgRow) -> RunSummary {
    let status: String = r.get(2);
    let owner = owner_of(r.get(5), r.get(6), r.get(7), r.get(8));
    let started_at = unsigned(r.get(3));
    let finished_at = r.get::<_, Option<i64>>(4).map(unsigned);
    let status = RunState::parse(&status).unwrap_or(RunState::Interrupted);
    RunSummary {
        id: r.get(0),
        workflow: r.get(1),
        status: inner.effective_state(status, owner.as_ref()),
        started_at,
        finished_at,
        duration_ms: finished_at.map(|f| f.saturating_sub(started_at)),
    }
}

pub(super) async fn create_run(inner: &Inner, run: &NewRun, token: &str) -> Result<()> {
    let hash = spec_hash(&run.files);
    let inputs = record::encode(&run.inputs);
    let now = now_ms();
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO runs (id, workflow, spec_path, spec_hash, status, inputs, workdir, max_parallel,
            started_at, owner_pid, owner_host, lease_until, owner_started, owner_token, format,
            owner_serves)
         VALUES ($1, $2, $3, $4, 'running', $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        &[
            &run.id,
            &run.workflow,
            &run.spec_path,
            &hash,
            &inputs,
            &run.workdir,
            &(run.max_parallel as i64),
            &ms(now),
            &i64::from(std::process::id()),
            &inner.options.host,
            &ms(now + inner.options.lease.as_millis() as u64),
            &my_start_time(),
            &token,
            &i64::from(FORMAT_VERSION),
            &crate::store::serving(),
        ],
    )
    .await?;
    insert_files(&tx, &run.id, &run.files).await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(())
}

pub(super) async fn insert_files(
    tx: &deadpool_postgres::Transaction<'_>,
    id: &str,
    files: &[(String, String)],
) -> Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    let positions: Vec<i64> = (0..files.len() as i64).collect();
    let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    let texts: Vec<&str> = files.iter().map(|(_, t)| t.as_str()).collect();
    tx.execute(
        "INSERT INTO files (run_id, position, path, text)
         SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::text[])",
        &[&id, &positions, &paths, &texts],
    )
    .await?;
    Ok(())
}

pub(super) async fn claim(
    inner: &Inner,
    id: &str,
    allowed: &[RunState],
    token: &str,
) -> Result<RunState> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    let row = tx
        .query_opt(
            "SELECT status, owner_pid, owner_host, lease_until, owner_started FROM runs
             WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await?;
    let Some(row) = row else {
        return Err(Failure::Store(unknown_run(id)));
    };
    let owner = owner_of(row.get(1), row.get(2), row.get(3), row.get(4));
    if let Some(owner) = owner.filter(|o| inner.is_alive(o)) {
        return Err(Failure::Store(
            StoreError::new(format!(
                "run `{id}` is being run by process `{}` on `{}`",
                owner.pid, owner.host
            ))
            .with_hint("wait for it to finish, or stop it with `archon cancel`"),
        ));
    }
    let status: String = row.get(0);
    let state = inner.effective_state(
        RunState::parse(&status).unwrap_or(RunState::Interrupted),
        None,
    );
    if !allowed.contains(&state) {
        return Err(Failure::Store(StoreError::new(format!(
            "run `{id}` is `{}`",
            state.as_str()
        ))));
    }
    tx.execute(
        "UPDATE runs SET status = 'running', owner_pid = $2, owner_host = $3, lease_until = $4,
            owner_started = $5, owner_token = $6, finished_at = NULL, cancel_requested = FALSE,
            owner_serves = $7
         WHERE id = $1",
        &[
            &id,
            &i64::from(std::process::id()),
            &inner.options.host,
            &ms(now_ms() + inner.options.lease.as_millis() as u64),
            &my_start_time(),
            &token,
            &crate::store::serving(),
        ],
    )
    .await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(state)
}

pub(super) async fn release(
    inner: &Inner,
    id: &str,
    status: RunState,
    token: Option<&str>,
) -> Result<()> {
    let client = inner.client().await?;
    client
        .execute(
            "UPDATE runs SET status = $2, owner_pid = NULL, owner_host = NULL, lease_until = NULL,
                owner_started = NULL, owner_token = NULL
             WHERE id = $1 AND owner_token = $3",
            &[&id, &status.as_str(), &token],
        )
        .await?;
    bump(&client).await;
    Ok(())
}

pub(super) async fn forget_results(inner: &Inner, id: &str, steps: &[String]) -> Result<u32> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    let row = tx
        .query_opt(
            "UPDATE runs SET generation = generation + 1, outputs = NULL, error = NULL WHERE id = $1
             RETURNING generation",
            &[&id],
        )
        .await?;
    let Some(row) = row else {
        return Err(Failure::Store(unknown_run(id)));
    };
    for step in steps {
        tx.execute(
            "DELETE FROM results WHERE run_id = $1
                AND (step = $2 OR left(step, length($2) + 1) = $2 || '[')",
            &[&id, step],
        )
        .await?;
    }
    tx.commit().await?;
    bump(&client).await;
    Ok(u32::try_from(row.get::<_, i64>(0)).unwrap_or(u32::MAX))
}

/// Records `decision` on the `pending` requests of a run still waiting for approval, with an event each
/// in its trail; false when the run is no longer waiting. A run submitted to workers takes decisions
/// while its other steps run too; each of its waiting steps left with no undecided call (those in
/// `expired` are past their timeout) is made ready again in the same transaction.
pub(super) async fn decide(
    inner: &Inner,
    id: &str,
    pending: &[ApprovalRequest],
    decision: &ApprovalDecision,
    now: u64,
    expired: &[String],
) -> Result<bool> {
    let text = record::encode(&record::ApprovalDecision::from(decision));
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    // Locked: a process taking the run up waits for the decision, or the decision sees it took it.
    let row = tx
        .query_opt(
            "SELECT status, owner_host FROM runs WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await?;
    let (status, host): (Option<String>, Option<String>) =
        row.map_or((None, None), |r| (r.get(0), r.get(1)));
    let submitted_running = status.as_deref() == Some(RunState::Running.as_str())
        && host.as_deref() == Some(super::WORKERS);
    if status.as_deref() != Some(RunState::WaitingApproval.as_str()) && !submitted_running {
        return Ok(false);
    }
    let mut seq: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = $1",
            &[&id],
        )
        .await?
        .get(0);
    for request in pending {
        let changed = tx
            .execute(
                "UPDATE approvals SET decision = $3, decided_at = $4, format = $5
                 WHERE run_id = $1 AND key = $2 AND decision IS NULL",
                &[
                    &id,
                    &request.key,
                    &text,
                    &ms(now),
                    &i64::from(FORMAT_VERSION),
                ],
            )
            .await?;
        if changed == 0 {
            continue;
        }
        seq += 1;
        let event = crate::store::convert::event_text(&crate::report::RunEvent::ApprovalDecided {
            step: request.step.clone(),
            tool: request.tool.clone(),
            approved: decision.approved,
            by: decision.by.clone(),
            reason: decision.reason.clone(),
        });
        tx.execute(
            "INSERT INTO events (run_id, seq, at, event, format) VALUES ($1, $2, $3, $4, $5)",
            &[&id, &seq, &ms(now), &event, &i64::from(FORMAT_VERSION)],
        )
        .await?;
    }
    super::tasks::release_decided(&tx, id, expired).await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(true)
}

/// Asks a run's owner to stop it; returns the owner (process id and host) when it may be signalled too:
/// it serves only this run.
pub(super) async fn request_cancel(inner: &Inner, id: &str) -> Result<Option<(u32, String)>> {
    let client = inner.client().await?;
    let row = client
        .query_opt(
            "UPDATE runs SET cancel_requested = TRUE WHERE id = $1
             RETURNING owner_pid, owner_host, owner_serves",
            &[&id],
        )
        .await?;
    // The owner's journal hears of it at once, wherever it runs (else at its next heartbeat).
    client
        .execute("SELECT pg_notify('archon_cancel', $1)", &[&id])
        .await?;
    bump(&client).await;
    Ok(row.and_then(|r| {
        let pid = u32::try_from(r.get::<_, Option<i64>>(0)?).ok()?;
        let host: String = r.get::<_, Option<String>>(1)?;
        (!r.get::<_, bool>(2)).then_some((pid, host))
    }))
}

/// Cancels a run nobody owns; false when a live process took it up since it was read.
pub(super) async fn cancel_idle(inner: &Inner, id: &str) -> Result<bool> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    let row = tx
        .query_one(
            "SELECT owner_pid, owner_host, lease_until, owner_started FROM runs WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await?;
    let owner = owner_of(row.get(0), row.get(1), row.get(2), row.get(3));
    if owner.as_ref().is_some_and(|o| inner.is_alive(o)) {
        return Ok(false);
    }
    tx.execute(
        "UPDATE runs SET status = 'cancelled', finished_at = $2, owner_pid = NULL, owner_host = NULL,
            lease_until = NULL, owner_started = NULL, owner_token = NULL
         WHERE id = $1",
        &[&id, &ms(now_ms())],
    )
    .await?;
    // A submitted run's steps that waited for a person are not taken up again.
    tx.execute("DELETE FROM tasks WHERE run_id = $1", &[&id])
        .await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(true)
}

/// The runs `filter` selects, newest first: a page as long as its limit, read in chunks.
pub(super) async fn list_where(inner: &Inner, filter: &RunFilter) -> Result<Vec<RunSummary>> {
    let query = RunQuery {
        status: filter.status.clone(),
        workflow: filter.workflow.clone(),
        since: filter.since,
        until: None,
        after: None,
        limit: filter.limit.unwrap_or(usize::MAX),
    };
    Ok(page(inner, &query).await?.runs)
}

/// The runs whose id starts with `prefix`: a range of the `runs_by_id` index, never a scan.
pub(super) async fn with_prefix(
    inner: &Inner,
    prefix: &str,
    limit: usize,
) -> Result<(Vec<RunSummary>, usize)> {
    let client = inner.client().await?;
    // Byte order, whatever the database's collation: every id that starts with `prefix` sorts between it
    // and it followed by the last code point.
    let end = format!("{prefix}\u{10FFFF}");
    let range = "id COLLATE \"C\" >= $1 AND id COLLATE \"C\" < $2 AND left(id, length($1)) = $1";
    let rows = client
        .query(
            &format!(
                "SELECT {SUMMARY}, COUNT(*) OVER () FROM runs WHERE {range}
                 ORDER BY id COLLATE \"C\" LIMIT $3"
            ),
            &[&prefix, &end, &(limit.min(i64::MAX as usize) as i64)],
        )
        .await?;
    let count = match rows.first() {
        Some(row) => row.get::<_, i64>(9) as usize,
        None if limit == 0 => client
            .query_one(
                &format!("SELECT COUNT(*) FROM runs WHERE {range}"),
                &[&prefix, &end],
            )
            .await?
            .get::<_, i64>(0) as usize,
        None => 0,
    };
    Ok((rows.iter().map(|r| summary_of(inner, r)).collect(), count))
}

pub(super) async fn page(inner: &Inner, query: &RunQuery) -> Result<RunPage> {
    let since = ms(query.since.unwrap_or(0));
    let until = ms(query.until.unwrap_or(u64::MAX));
    let states: Option<Vec<String>> = (!query.status.is_empty())
        .then(|| query.status.iter().map(|s| s.as_str().to_owned()).collect());
    let (after_start, after_id) = match &query.after {
        Some(c) => (Some(ms(c.started_at)), Some(c.id.clone())),
        None => (None, None),
    };
    let mut client = inner.client().await?;
    let tx = snapshot(&mut client).await?;
    let settled: i64 = tx
        .query_one(
            "SELECT COUNT(*) FROM runs WHERE started_at >= $1 AND started_at < $2
             AND ($3::text IS NULL OR workflow = $3) AND status != 'running'
             AND ($4::text[] IS NULL OR status = ANY($4))",
            &[&since, &until, &query.workflow, &states],
        )
        .await?
        .get(0);
    let running = tx
        .query(
            &format!(
                "SELECT {SUMMARY} FROM runs WHERE status = 'running' AND started_at >= $1
                 AND started_at < $2 AND ($3::text IS NULL OR workflow = $3)"
            ),
            &[&since, &until, &query.workflow],
        )
        .await?
        .iter()
        .filter(|r| query.selects(&summary_of(inner, r)))
        .count();
    // Read in chunks, newest first, until the page and one more run are found: a `running` row whose
    // owner died is `interrupted`, which only this process can tell, so a chunk may hold fewer.
    let statement = tx
        .prepare(&format!(
            "SELECT {SUMMARY} FROM runs WHERE started_at >= $1 AND started_at < $2
             AND ($3::text IS NULL OR workflow = $3)
             AND ($4::text[] IS NULL OR status = 'running' OR status = ANY($4))
             AND ($5::bigint IS NULL OR started_at < $5 OR (started_at = $5 AND id < $6))
             ORDER BY started_at DESC, id DESC LIMIT $7"
        ))
        .await?;
    let chunk = (query.limit.saturating_add(1)).clamp(16, 1024) as i64;
    let (mut after_start, mut after_id) = (after_start, after_id);
    let mut runs: Vec<RunSummary> = Vec::new();
    let mut next = None;
    'chunks: loop {
        let rows = tx
            .query(
                &statement,
                &[
                    &since,
                    &until,
                    &query.workflow,
                    &states,
                    &after_start,
                    &after_id,
                    &chunk,
                ],
            )
            .await?;
        for row in &rows {
            let run = summary_of(inner, row);
            (after_start, after_id) = (Some(ms(run.started_at)), Some(run.id.clone()));
            if !query.selects(&run) {
                continue;
            }
            if runs.len() == query.limit {
                next = runs.last().map(|last| RunCursor {
                    started_at: last.started_at,
                    id: last.id.clone(),
                });
                break 'chunks;
            }
            runs.push(run);
        }
        if (rows.len() as i64) < chunk {
            break;
        }
    }
    tx.commit().await?;
    Ok(RunPage {
        runs,
        total: settled as usize + running,
        next,
    })
}

pub(super) async fn summary(inner: &Inner, id: &str) -> Result<Option<RunSummary>> {
    let client = inner.client().await?;
    let row = client
        .query_opt(&format!("SELECT {SUMMARY} FROM runs WHERE id = $1"), &[&id])
        .await?;
    Ok(row.map(|r| summary_of(inner, &r)))
}

pub(super) async fn changed_since(inner: &Inner, since: u64) -> Result<Vec<RunSummary>> {
    let client = inner.client().await?;
    let rows = client
        .query(
            &format!(
                "SELECT {SUMMARY} FROM runs WHERE started_at >= $1 OR finished_at >= $1
                 OR status IN ('running', 'waiting_approval')
                 ORDER BY started_at DESC, id DESC"
            ),
            &[&ms(since)],
        )
        .await?;
    Ok(rows.iter().map(|r| summary_of(inner, r)).collect())
}

pub(super) async fn changes(inner: &Inner) -> Result<u64> {
    let client = inner.client().await?;
    let row = client
        .query_one("SELECT last_value, is_called FROM archon_changes", &[])
        .await?;
    let (value, called): (i64, bool) = (row.get(0), row.get(1));
    Ok(if called { unsigned(value) } else { 0 })
}

pub(super) async fn last_event(inner: &Inner, id: &str) -> Result<i64> {
    let client = inner.client().await?;
    Ok(client
        .query_one(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = $1",
            &[&id],
        )
        .await?
        .get(0))
}

pub(super) async fn events_after(
    inner: &Inner,
    id: &str,
    after: i64,
    limit: usize,
) -> Result<Vec<(i64, Json)>> {
    let client = inner.client().await?;
    let rows = client
        .query(
            "SELECT seq, at, format, event FROM events WHERE run_id = $1 AND seq > $2
             ORDER BY seq LIMIT $3",
            &[&id, &after, &(limit.min(i64::MAX as usize) as i64)],
        )
        .await?;
    let mut damage = Vec::new();
    let mut events = Vec::with_capacity(rows.len());
    for r in &rows {
        let seq: i64 = r.get(0);
        let row = seq.to_string();
        let at = Row {
            run: id,
            table: "events",
            row: &row,
        };
        match record::decode::<record::Event>(at, r.get(2), r.get::<_, &str>(3)) {
            Ok(event) => events.push((seq, event_json(event, r.get(1)))),
            Err(e) => damage.push(e),
        }
    }
    if !damage.is_empty() {
        return Err(damaged_rows(inner, &damage));
    }
    Ok(events)
}

pub(super) async fn logs_after(
    inner: &Inner,
    id: &str,
    after: i64,
    limit: usize,
) -> Result<Vec<LogChunk>> {
    let client = inner.client().await?;
    let rows = client
        .query(
            "SELECT seq, step, attempt, source, stream, text, at FROM logs
             WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            &[&id, &after, &(limit.min(i64::MAX as usize) as i64)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| LogChunk {
            seq: r.get(0),
            step: r.get(1),
            attempt: u32::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            source: r.get(3),
            stream: if r.get::<_, &str>(4) == "stderr" {
                crate::tools::Stream::Stderr
            } else {
                crate::tools::Stream::Stdout
            },
            text: r.get(5),
            at_ms: unsigned(r.get(6)),
        })
        .collect())
}

pub(super) async fn files(inner: &Inner, id: &str) -> Result<Vec<(String, String)>> {
    let client = inner.client().await?;
    let rows = client
        .query(
            "SELECT path, text FROM files WHERE run_id = $1 ORDER BY position",
            &[&id],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

pub(super) async fn replace_files(
    inner: &Inner,
    id: &str,
    files: &[(String, String)],
) -> Result<()> {
    let hash = spec_hash(files);
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    tx.execute("DELETE FROM files WHERE run_id = $1", &[&id])
        .await?;
    insert_files(&tx, id, files).await?;
    tx.execute(
        "UPDATE runs SET spec_hash = $2 WHERE id = $1",
        &[&id, &hash],
    )
    .await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(())
}

pub(super) async fn load(
    inner: &Inner,
    id: &str,
    blobs: bool,
    only: Option<&[String]>,
) -> Result<StoredRun> {
    let mut client = inner.client().await?;
    let mut damage = Vec::new();
    let run = if only.is_some() {
        // A worker's read of the steps it claimed together: nobody else writes their records while
        // their tasks are claimed, and their dependencies' results were final before they were made
        // ready, so the reads need no snapshot of their own (and no round trips to begin and end one).
        load_run(inner, &client, id, &mut damage, blobs, only).await?
    } else {
        // One snapshot, even while the run's writer commits.
        let tx = snapshot(&mut client).await?;
        let run = load_run(inner, &tx, id, &mut damage, blobs, only).await?;
        tx.commit().await?;
        run
    };
    if !damage.is_empty() {
        return Err(damaged_rows(inner, &damage));
    }
    run.ok_or_else(|| Failure::Store(unknown_run(id)))
}

/// A read-only transaction whose reads all see one snapshot, whatever commits meanwhile.
async fn snapshot(
    client: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>> {
    Ok(client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?)
}

/// Decodes a stored result from its format, its record and its blobs (name and bytes, when kept apart).
fn decode_result(
    at: Row<'_>,
    format: i64,
    text: &str,
    output: (Option<&str>, Option<&[u8]>),
    long_text: (Option<&str>, Option<&[u8]>),
) -> Result<record::StepResult, RecordError> {
    let mut result = record::decode::<record::StepResult>(at, format, text)?;
    let at = Row {
        table: "blobs",
        ..at
    };
    if output.0.is_some() {
        result.output = match output.1 {
            Some(bytes) => record::decode_from(at, bytes)?,
            None => record::decode(at, FORMAT_VERSION.into(), b"")?,
        };
    }
    if long_text.0.is_some() {
        let read = long_text.1.map(|bytes| {
            String::from_utf8(bytes.to_vec())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        });
        result.text = record::text(at, read)?;
    }
    Ok(result)
}

/// The rows of `table` (results, attempts or checkpoints) of run `$1` whose step is one of the names in
/// `$2` or one of their `foreach` items (`step[i]`), looked up name by name in the table's index on
/// `(run_id, split_part(step, '[', 1))`. The planner may not take a filter on the whole array for the
/// index: it does not know how many rows a run has (a table's statistics lag behind a run that is
/// growing, and a run may be much larger than most), and reading all of a run's rows for each step would
/// make a large run's steps cost in proportion to its size. `OFFSET 0` keeps each name's lookup apart.
///
/// The names are counted by `generate_subscripts`, whose rows the planner does not estimate from its
/// argument (it would from `unnest`'s): the plan for a few names then costs what the plan for any names
/// costs, so the server keeps the statement's one generic plan instead of planning it anew on every
/// call (a custom plan for one or two names always looked cheaper), which took more of its time than
/// running it. (Finding the i-th name walks the names before it: steps claimed together with thousands
/// of `needs` between them would feel that.)
fn steps_of(table: &str) -> String {
    format!(
        "(SELECT s.* FROM generate_subscripts($2::text[], 1) AS n (i) CROSS JOIN LATERAL
            (SELECT * FROM {table}
             WHERE run_id = $1 AND split_part(step, '[', 1) = ($2::text[])[n.i] OFFSET 0) s)"
    )
}

/// The reads of a run's results, attempts and checkpoints: with `filtered`, of the steps named in `$2`
/// alone (and their `foreach` items); with `blobs`, the results' long outputs and texts too.
fn step_reads(blobs: bool, filtered: bool) -> [String; 3] {
    let from = |table: &str| {
        if filtered {
            steps_of(table)
        } else {
            table.to_owned()
        }
    };
    let results = format!(
        "SELECT r.step, r.format, r.result, {} FROM {} r {} WHERE r.run_id = $1 ORDER BY r.ord",
        if blobs {
            "r.output_blob, b.data, r.text_blob, t.data"
        } else {
            "NULL::text, NULL::bytea, NULL::text, NULL::bytea"
        },
        from("results"),
        if blobs {
            "LEFT JOIN blobs b ON b.hash = r.output_blob LEFT JOIN blobs t ON t.hash = r.text_blob"
        } else {
            ""
        },
    );
    let attempts = format!(
        "SELECT step, attempt, generation, fallback, status, error, started_at, ended_at, pgid,
            pgid_started, host
         FROM {} a WHERE run_id = $1 ORDER BY started_at, ord",
        from("attempts"),
    );
    let checkpoints = format!(
        "SELECT step, format, state FROM {} c
         WHERE run_id = $1 AND generation = (SELECT generation FROM runs WHERE id = $1)",
        from("checkpoints"),
    );
    [results, attempts, checkpoints]
}

/// Reads run `id`; every row that does not decode goes to `damage` (and the run read is incomplete).
/// With `only`, the results, attempts and checkpoints are those of the named steps and their `foreach`
/// items (`step[i]`) alone.
async fn load_run(
    inner: &Inner,
    client: &impl GenericClient,
    id: &str,
    damage: &mut Vec<RecordError>,
    blobs: bool,
    only: Option<&[String]>,
) -> Result<Option<StoredRun>> {
    // The five reads are sent together (one round trip); the server answers them in order, in the
    // caller's snapshot. Each is prepared once per connection, with the steps' filter or without it, so
    // that the server plans it once rather than on every call.
    let [results, attempts, checkpoints] = step_reads(blobs, only.is_some());
    let run = client
        .prepare_cached(
            "SELECT id, workflow, spec_path, spec_hash, status, inputs, workdir, max_parallel,
                started_at, finished_at, outputs, error, owner_pid, owner_host, lease_until,
                owner_started, generation, format
             FROM runs WHERE id = $1",
        )
        .await?;
    let results = client.prepare_cached(&results).await?;
    let attempts = client.prepare_cached(&attempts).await?;
    let approvals = client
        .prepare_cached(
            "SELECT key, format, request, requested_at, decision, decided_at FROM approvals
             WHERE run_id = $1 ORDER BY requested_at, ord",
        )
        .await?;
    let checkpoints = client.prepare_cached(&checkpoints).await?;
    // Each name once: a name given twice would give its rows twice.
    let names: Option<Vec<&str>> = only.map(|only| {
        let mut names: Vec<&str> = only.iter().map(String::as_str).collect();
        names.sort_unstable();
        names.dedup();
        names
    });
    let with_steps: [&(dyn ToSql + Sync); 2] = [&id, &names];
    let steps_params: &[&(dyn ToSql + Sync)] = match only {
        Some(_) => &with_steps,
        None => &with_steps[..1],
    };
    let (row, result_rows, attempt_rows, approval_rows, checkpoint_rows) =
        futures_util::future::try_join5(
            client.query_opt(&run, &[&id]),
            client.query(&results, steps_params),
            client.query(&attempts, steps_params),
            client.query(&approvals, &[&id]),
            client.query(&checkpoints, steps_params),
        )
        .await?;
    let Some(r) = row else {
        return Ok(None);
    };
    let format: i64 = r.get(17);
    let at = |row: &'static str| Row {
        run: id,
        table: "runs",
        row,
    };
    let status = match record::decode_value::<record::RunState>(
        at("status"),
        format,
        Json::String(r.get(4)),
    ) {
        Ok(status) => RunState::from(status),
        Err(e) => {
            damage.push(e);
            RunState::Interrupted
        }
    };
    let inputs = record::decode::<record::Object>(at("inputs"), format, r.get::<_, &str>(5))
        .unwrap_or_else(|e| {
            damage.push(e);
            Map::new()
        });
    let outputs = match r.get::<_, Option<&str>>(10) {
        None => Map::new(),
        Some(text) => {
            record::decode::<record::Object>(at("outputs"), format, text).unwrap_or_else(|e| {
                damage.push(e);
                Map::new()
            })
        }
    };
    let owner = owner_of(r.get(12), r.get(13), r.get(14), r.get(15));
    let generation = u32::try_from(r.get::<_, i64>(16)).unwrap_or(0);
    let mut run = StoredRun {
        id: r.get(0),
        workflow: r.get(1),
        spec_path: r.get(2),
        spec_hash: r.get(3),
        status: inner.effective_state(status, owner.as_ref()),
        inputs,
        workdir: r.get(6),
        max_parallel: r.get::<_, i64>(7).max(0) as usize,
        started_at: unsigned(r.get(8)),
        finished_at: r.get::<_, Option<i64>>(9).map(unsigned),
        generation,
        outputs,
        error: r.get(11),
        results: IndexMap::new(),
        attempts: Vec::new(),
        checkpoints: HashMap::new(),
        approvals: Vec::new(),
        owner: owner.filter(|o| inner.is_alive(o)),
    };

    let rows = result_rows;
    for r in &rows {
        let step: String = r.get(0);
        let at = Row {
            run: id,
            table: "results",
            row: &step,
        };
        match decode_result(
            at,
            r.get(1),
            r.get(2),
            (r.get(3), r.get(4)),
            (r.get(5), r.get(6)),
        ) {
            Ok(result) => {
                run.results.insert(step, StepResult::from(result));
            }
            Err(e) => damage.push(e),
        }
    }

    let rows = attempt_rows;
    // A process group is this host's to look at and stop only when the attempt ran here.
    let here = |r: &PgRow| r.get::<_, Option<&str>>(10) == Some(inner.options.host.as_str());
    run.attempts = rows
        .iter()
        .map(|r| AttemptRecord {
            step: r.get(0),
            attempt: u32::try_from(r.get::<_, i64>(1)).unwrap_or(0),
            generation: u32::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            fallback: r.get(3),
            status: r.get(4),
            error: r.get(5),
            started_at: unsigned(r.get(6)),
            ended_at: r.get::<_, Option<i64>>(7).map(unsigned),
            pgid: r
                .get::<_, Option<i64>>(8)
                .and_then(|p| u32::try_from(p).ok())
                .filter(|_| here(r)),
            pgid_started: r.get::<_, Option<i64>>(9).map(unsigned).filter(|_| here(r)),
        })
        .collect();

    let rows = approval_rows;
    for r in &rows {
        let key: String = r.get(0);
        let format: i64 = r.get(1);
        let at = Row {
            run: id,
            table: "approvals",
            row: &key,
        };
        let request = record::decode::<record::ApprovalRequest>(at, format, r.get::<_, &str>(2));
        let decision = match r.get::<_, Option<&str>>(4) {
            None => Ok(None),
            Some(text) => record::decode::<record::ApprovalDecision>(at, format, text).map(Some),
        };
        match (request, decision) {
            (Ok(request), Ok(decision)) => run.approvals.push(ApprovalRecord {
                request: request.into(),
                requested_at: unsigned(r.get(3)),
                decision: decision.map(Into::into),
                decided_at: r.get::<_, Option<i64>>(5).map(unsigned),
            }),
            (request, decision) => damage.extend(request.err().into_iter().chain(decision.err())),
        }
    }

    let rows = checkpoint_rows;
    for r in &rows {
        let step: String = r.get(0);
        let at = Row {
            run: id,
            table: "checkpoints",
            row: &step,
        };
        match record::decode::<record::Checkpoint>(at, r.get(1), r.get::<_, &str>(2)) {
            Ok(state) => {
                run.checkpoints.insert(step, state);
            }
            Err(e) => damage.push(e),
        }
    }
    Ok(Some(run))
}

/// Decodes every row of every run, cached result and firing; returns what does not decode.
pub(super) async fn check(inner: &Inner) -> Result<Vec<String>> {
    let mut client = inner.client().await?;
    let tx = snapshot(&mut client).await?;
    let mut damage = Vec::new();
    let rows = tx
        .query(
            "SELECT c.run_id, c.key, c.format, c.result, c.output_blob, b.data, c.text_blob, t.data
             FROM cache c LEFT JOIN blobs b ON b.hash = c.output_blob
                LEFT JOIN blobs t ON t.hash = c.text_blob
             ORDER BY c.created_at, c.key",
            &[],
        )
        .await?;
    for r in &rows {
        let (run, key): (&str, &str) = (r.get(0), r.get(1));
        let at = Row {
            run,
            table: "cache",
            row: key,
        };
        if let Err(e) = decode_result(
            at,
            r.get(2),
            r.get(3),
            (r.get(4), r.get(5)),
            (r.get(6), r.get(7)),
        ) {
            damage.push(e);
        }
    }
    let rows = tx
        .query(
            &format!("SELECT {FIRING}, inputs FROM firings ORDER BY fired_at, ord"),
            &[],
        )
        .await?;
    for r in &rows {
        if let Err(e) = firing_of(r, true) {
            damage.push(e);
        }
    }
    let ids: Vec<String> = tx
        .query("SELECT id FROM runs ORDER BY started_at, id", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for id in ids {
        load_run(inner, &tx, &id, &mut damage, true, None).await?;
        let rows = tx
            .query(
                "SELECT seq, format, event FROM events WHERE run_id = $1 ORDER BY seq",
                &[&id],
            )
            .await?;
        for r in &rows {
            let row = r.get::<_, i64>(0).to_string();
            let at = Row {
                run: &id,
                table: "events",
                row: &row,
            };
            if let Err(e) = record::decode::<record::Event>(at, r.get(1), r.get::<_, &str>(2)) {
                damage.push(e);
            }
        }
    }
    tx.commit().await?;
    Ok(damage.iter().map(ToString::to_string).collect())
}

fn cache_summary(r: &PgRow) -> CacheSummary {
    CacheSummary {
        key: r.get(0),
        workflow: r.get(1),
        step: r.get(2),
        run_id: r.get(3),
        source: r.get(4),
        created_at: unsigned(r.get(5)),
        expires_at: r.get::<_, Option<i64>>(6).map(unsigned),
        size: unsigned(r.get(7)),
    }
}

/// The columns of a cache entry, its blobs joined; `cache_where` decodes the rows.
const CACHE_ENTRIES: &str =
    "SELECT c.key, c.workflow, c.step, c.run_id, c.source, c.created_at, c.expires_at,
        c.size, c.format, c.result, c.output_blob, b.data, c.text_blob, t.data
     FROM cache c LEFT JOIN blobs b ON b.hash = c.output_blob
        LEFT JOIN blobs t ON t.hash = c.text_blob";

pub(super) async fn cache_entries(
    inner: &Inner,
    workflows: &[String],
    now: u64,
) -> Result<Vec<CacheEntry>> {
    cache_where(
        inner,
        "c.workflow = ANY($1) AND (c.expires_at IS NULL OR c.expires_at > $2)",
        &[&workflows, &ms(now)],
    )
    .await
}

/// The entries of one step (`RunStore::step_cache_entries`), found in the index on
/// `(workflow, step)` of migration 11: a worker's step reads its own, not every entry of its workflow.
pub(super) async fn step_cache_entries(
    inner: &Inner,
    (workflow, step): (&str, &str),
    others: &[String],
    now: u64,
) -> Result<Vec<CacheEntry>> {
    cache_where(
        inner,
        "((c.workflow = $1 AND c.step = $2) OR c.workflow = ANY($3))
            AND (c.expires_at IS NULL OR c.expires_at > $4)",
        &[&workflow, &step, &others, &ms(now)],
    )
    .await
}

/// The cache entries `filter` selects (over `CACHE_ENTRIES`, as `c`), decoded; a row that does not
/// decode fails the read, with a hint.
async fn cache_where(
    inner: &Inner,
    filter: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<CacheEntry>> {
    let client = inner.client().await?;
    let rows = client
        .query(&format!("{CACHE_ENTRIES} WHERE {filter}"), params)
        .await?;
    let mut entries = Vec::new();
    let mut damage = Vec::new();
    for r in &rows {
        let summary = cache_summary(r);
        let at = Row {
            run: &summary.run_id,
            table: "cache",
            row: &summary.key,
        };
        match decode_result(
            at,
            r.get(8),
            r.get(9),
            (r.get(10), r.get(11)),
            (r.get(12), r.get(13)),
        ) {
            Ok(result) => entries.push(CacheEntry {
                summary,
                result: StepResult::from(result),
            }),
            Err(e) => damage.push(e),
        }
    }
    if !damage.is_empty() {
        return Err(match damaged_rows(inner, &damage) {
            Failure::Store(e) => Failure::Store(e.with_hint(
                "`archon cache clear` removes the cached results; runs go on without them",
            )),
            other => other,
        });
    }
    Ok(entries)
}

pub(super) async fn cache_list(inner: &Inner) -> Result<Vec<CacheSummary>> {
    let client = inner.client().await?;
    let rows = client
        .query(
            "SELECT key, workflow, step, run_id, source, created_at, expires_at, size
             FROM cache ORDER BY created_at DESC, key",
            &[],
        )
        .await?;
    Ok(rows.iter().map(cache_summary).collect())
}

/// Deletes the blobs no result or cached result names any more (of `candidates`, or all).
async fn drop_unused_blobs(
    client: &impl GenericClient,
    candidates: Option<&[String]>,
) -> Result<u64> {
    let row = client
        .query_one(
            "WITH gone AS (
                DELETE FROM blobs WHERE ($1::text[] IS NULL OR hash = ANY($1))
                    AND NOT EXISTS (SELECT 1 FROM results WHERE output_blob = blobs.hash OR text_blob = blobs.hash)
                    AND NOT EXISTS (SELECT 1 FROM cache WHERE output_blob = blobs.hash OR text_blob = blobs.hash)
                RETURNING octet_length(hash) + octet_length(data) AS size)
             SELECT COALESCE(SUM(size), 0)::bigint FROM gone",
            &[&candidates],
        )
        .await?;
    Ok(unsigned(row.get(0)))
}

pub(super) async fn cache_clear(inner: &Inner, filter: &CacheFilter, now: u64) -> Result<usize> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    let removed = tx
        .execute(
            "DELETE FROM cache WHERE ($1::text IS NULL OR workflow = $1) AND ($2::text IS NULL OR step = $2)
                AND (NOT $3 OR (expires_at IS NOT NULL AND expires_at <= $4))",
            &[&filter.workflow, &filter.step, &filter.expired, &ms(now)],
        )
        .await?;
    drop_unused_blobs(&tx, None).await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(removed as usize)
}

pub(super) async fn prune(inner: &Inner, finished_before: u64, dry_run: bool) -> Result<Pruned> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    let before = ms(finished_before);
    let runs: Vec<RunSummary> = tx
        .query(
            &format!(
                "SELECT {SUMMARY} FROM runs
                 WHERE status IN ('succeeded', 'failed', 'cancelled') AND finished_at < $1
                 ORDER BY started_at, id FOR UPDATE"
            ),
            &[&before],
        )
        .await?
        .iter()
        .map(|r| summary_of(inner, r))
        .collect();
    let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    let mut bytes = 0_u64;
    if !ids.is_empty() {
        let blobs: Vec<String> = tx
            .query(
                "SELECT DISTINCT b FROM results, unnest(ARRAY[output_blob, text_blob]) AS b
                 WHERE run_id = ANY($1) AND b IS NOT NULL",
                &[&ids],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for table in super::schema::RUN_TABLES.iter().chain(&["firings"]) {
            let row = tx
                .query_one(
                    &format!(
                        "WITH gone AS (DELETE FROM {table} t WHERE run_id = ANY($1) RETURNING {ROW_BYTES_EACH})
                         SELECT COALESCE(SUM(size), 0)::bigint FROM gone"
                    ),
                    &[&ids],
                )
                .await?;
            bytes += unsigned(row.get(0));
        }
        let row = tx
            .query_one(
                &format!(
                    "WITH gone AS (DELETE FROM runs t WHERE id = ANY($1) RETURNING {ROW_BYTES_EACH})
                     SELECT COALESCE(SUM(size), 0)::bigint FROM gone"
                ),
                &[&ids],
            )
            .await?;
        bytes += unsigned(row.get(0));
        bytes += drop_unused_blobs(&tx, Some(&blobs)).await?;
    }
    // Firings without a run (skipped, refused) recorded before the cut-off; each trigger's last slot
    // stays in `triggers`.
    let row = tx
        .query_one(
            &format!(
                "WITH gone AS (DELETE FROM firings t WHERE run_id IS NULL AND fired_at < $1
                    RETURNING {ROW_BYTES_EACH})
                 SELECT COALESCE(SUM(size), 0)::bigint, count(*)::bigint FROM gone"
            ),
            &[&before],
        )
        .await?;
    bytes += unsigned(row.get(0));
    let firings = unsigned(row.get(1));
    if dry_run || (bytes == 0 && firings == 0) {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
        bump(&client).await;
    }
    Ok(Pruned {
        runs,
        bytes,
        firings,
        dry_run,
    })
}

/// The size of each deleted row, as `RETURNING` gives it.
const ROW_BYTES_EACH: &str = "pg_column_size(t.*) AS size";

/// A firing from a row of [`FIRING`] columns (and `inputs` after them when `with_inputs`).
fn firing_of(r: &PgRow, with_inputs: bool) -> Result<Firing, RecordError> {
    let workflow: String = r.get(0);
    let trigger: String = r.get(1);
    let slot: String = r.get(3);
    let run_id: Option<String> = r.get(6);
    let format: i64 = r.get(9);
    let name = format!("{workflow}/{trigger}/{slot}");
    let at = Row {
        run: run_id.as_deref().unwrap_or("-"),
        table: "firings",
        row: &name,
    };
    let kind = FiringKind::parse(r.get(2));
    let outcome = FiringOutcome::parse(r.get(7));
    let (Some(kind), Some(outcome)) = (kind, outcome) else {
        return Err(RecordError::Text {
            run: at.run.to_owned(),
            table: "firings",
            row: name,
            problem: "has an unknown kind or outcome",
        });
    };
    let inputs = if with_inputs {
        record::decode::<Map<String, Json>>(at, format, r.get::<_, &str>(10))?
    } else {
        Map::new()
    };
    Ok(Firing {
        workflow,
        trigger,
        kind,
        slot,
        slot_at: unsigned(r.get(4)),
        fired_at: unsigned(r.get(5)),
        run_id,
        outcome,
        reason: r.get(8),
        inputs,
    })
}

fn collect_firings(inner: &Inner, rows: &[PgRow], with_inputs: bool) -> Result<Vec<Firing>> {
    let mut firings = Vec::with_capacity(rows.len());
    let mut damage = Vec::new();
    for row in rows {
        match firing_of(row, with_inputs) {
            Ok(f) => firings.push(f),
            Err(e) => damage.push(e),
        }
    }
    if damage.is_empty() {
        Ok(firings)
    } else {
        Err(damaged_rows(inner, &damage))
    }
}

/// Records a firing unless its slot is taken, durable when it returns (a commit with
/// `synchronous_commit` on); says whether it was new.
pub(super) async fn record_firing(inner: &Inner, f: &Firing) -> Result<bool> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    let params: [&(dyn ToSql + Sync); 11] = [
        &f.workflow,
        &f.trigger,
        &f.slot,
        &f.kind.as_str(),
        &ms(f.slot_at),
        &ms(f.fired_at),
        &f.run_id,
        &f.outcome.as_str(),
        &f.reason,
        &record::encode(&f.inputs),
        &i64::from(FORMAT_VERSION),
    ];
    let inserted = tx
        .execute(
            "INSERT INTO firings (workflow, trigger_name, slot, kind, slot_at, fired_at, run_id, outcome,
                reason, inputs, format)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (workflow, trigger_name, slot) DO NOTHING",
            &params,
        )
        .await?
        == 1;
    if inserted && f.kind == FiringKind::Cron {
        tx.execute(
            "INSERT INTO triggers (workflow, trigger_name, armed_at, last_slot_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (workflow, trigger_name) DO UPDATE
                SET last_slot_at = GREATEST(COALESCE(triggers.last_slot_at, 0), excluded.last_slot_at)",
            &[&f.workflow, &f.trigger, &ms(f.fired_at), &ms(f.slot_at)],
        )
        .await?;
    }
    tx.commit().await?;
    bump(&client).await;
    Ok(inserted)
}

pub(super) async fn last_firing(
    inner: &Inner,
    workflow: &str,
    trigger: &str,
) -> Result<Option<Firing>> {
    let client = inner.client().await?;
    let rows = client
        .query(
            &format!(
                "SELECT {FIRING} FROM firings WHERE workflow = $1 AND trigger_name = $2
                 ORDER BY slot_at DESC, ord DESC LIMIT 1"
            ),
            &[&workflow, &trigger],
        )
        .await?;
    Ok(collect_firings(inner, &rows, false)?.into_iter().next())
}

pub(super) async fn firings(inner: &Inner, filter: &FiringFilter) -> Result<Vec<Firing>> {
    let client = inner.client().await?;
    let limit = filter.limit.map(|l| l.min(i64::MAX as usize) as i64);
    let rows = client
        .query(
            &format!(
                "SELECT {FIRING} FROM firings
                 WHERE ($1::text IS NULL OR workflow = $1) AND ($2::text IS NULL OR trigger_name = $2)
                 ORDER BY fired_at DESC, ord DESC LIMIT $3"
            ),
            &[&filter.workflow, &filter.trigger, &limit],
        )
        .await?;
    collect_firings(inner, &rows, false)
}

pub(super) async fn unstarted_firings(inner: &Inner) -> Result<Vec<Firing>> {
    let client = inner.client().await?;
    let rows = client
        .query(
            &format!(
                "SELECT {FIRING}, inputs FROM firings f
                 WHERE f.run_id IS NOT NULL AND f.outcome IN ('started', 'queued')
                    AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = f.run_id)
                 ORDER BY f.fired_at, f.ord"
            ),
            &[],
        )
        .await?;
    collect_firings(inner, &rows, true)
}

/// `RunStore::skip_unstarted_firing`: one conditional update.
pub(super) async fn skip_unstarted_firing(
    inner: &Inner,
    run_id: &str,
    reason: &str,
) -> Result<bool> {
    let client = inner.client().await?;
    let changed = client
        .execute(
            "UPDATE firings SET outcome = 'skipped', reason = $2, run_id = NULL
             WHERE run_id = $1 AND outcome IN ('started', 'queued')
                AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = $1)",
            &[&run_id, &reason],
        )
        .await?;
    if changed > 0 {
        bump(&client).await;
    }
    Ok(changed > 0)
}

pub(super) async fn arm_trigger(
    inner: &Inner,
    workflow: &str,
    trigger: &str,
    now: u64,
) -> Result<TriggerMark> {
    let client = inner.client().await?;
    client
        .execute(
            "INSERT INTO triggers (workflow, trigger_name, armed_at) VALUES ($1, $2, $3)
             ON CONFLICT (workflow, trigger_name) DO NOTHING",
            &[&workflow, &trigger, &ms(now)],
        )
        .await?;
    let row = client
        .query_one(
            "SELECT armed_at, last_slot_at FROM triggers WHERE workflow = $1 AND trigger_name = $2",
            &[&workflow, &trigger],
        )
        .await?;
    bump(&client).await;
    Ok(TriggerMark {
        armed_at: unsigned(row.get(0)),
        last_slot_at: row.get::<_, Option<i64>>(1).map(unsigned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Tasks;
    use crate::store::postgres::testing::{connect, drop_schema, store};

    /// A run of 3,000 steps, one of them a `foreach` (`m[0]`, `m[1]`), each with a result, an attempt and
    /// a checkpoint; the tables never analysed, as while a run grows faster than the server looks.
    const LARGE_RUN: &str = "
        INSERT INTO runs (id, workflow, spec_path, spec_hash, status, inputs, workdir, max_parallel,
            started_at, format)
        VALUES ('r', 'w', 'w.yaml', '', 'running', '{}', '/', 4, 0, 1);
        CREATE TEMPORARY TABLE names AS
            SELECT 's' || i AS step FROM generate_series(1, 2998) AS i UNION ALL VALUES ('m[0]'), ('m[1]');
        INSERT INTO results (run_id, step, generation, status, result, finished_at, format)
            SELECT 'r', step, 0, 'succeeded', '{\"status\":\"succeeded\",\"output\":null,\"text\":\"\",\
                \"outputs\":{},\"error\":null,\"attempts\":1,\"exit_code\":null,\"duration_ms\":0,\
                \"fallback\":false}', 0, 1
            FROM names;
        INSERT INTO attempts (run_id, step, attempt, generation, fallback, status, started_at)
            SELECT 'r', step, 1, 0, false, 'succeeded', 0 FROM names;
        INSERT INTO checkpoints (run_id, step, generation, state, at, format)
            SELECT 'r', step, 0, '{}', 0, 1 FROM names;";

    /// What the server plans for one read, as `EXPLAIN` says without costs.
    fn plan(rows: &[tokio_postgres::Row]) -> String {
        rows.iter()
            .map(|r| r.get::<_, String>(0).trim().to_owned())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_steps_records_are_read_by_its_name_not_by_reading_the_whole_run() {
        let Some((store, schema)) = store() else {
            return;
        };
        let within = schema.clone();
        let plans = super::super::runtime()
            .expect("runtime")
            .block_on(async move {
                // A connection of its own: the store's keep their prepared statements.
                let client = connect(&within).await;
                client.batch_execute(LARGE_RUN).await.expect("a large run");
                // The plan a connection keeps for a statement it prepared: the one made without the
                // values.
                client
                    .batch_execute("SET plan_cache_mode = force_generic_plan")
                    .await
                    .expect("generic plans");
                let mut plans = Vec::new();
                for (i, read) in step_reads(true, true).iter().enumerate() {
                    client
                        .batch_execute(&format!("PREPARE read{i} (text, text[]) AS {read}"))
                        .await
                        .expect("prepared");
                    let rows = client
                        .query(
                            &format!("EXPLAIN (COSTS OFF) EXECUTE read{i} ('r', '{{m,s7}}')"),
                            &[],
                        )
                        .await
                        .expect("explained");
                    plans.push(plan(&rows));
                }
                // Left to choose, the server keeps each read's generic plan after its first five
                // calls, instead of planning it anew on every call (as it did while a custom plan for
                // a few names looked cheaper than the generic one): five custom plans, and six generic
                // ones with the one explained above.
                client
                    .batch_execute("SET plan_cache_mode = auto")
                    .await
                    .expect("the server's choice");
                for i in 0..3 {
                    for _ in 0..10 {
                        client
                            .batch_execute(&format!("EXECUTE read{i} ('r', '{{m,s7}}')"))
                            .await
                            .expect("read");
                    }
                }
                let kept = client
                    .query(
                        "SELECT name, custom_plans, generic_plans FROM pg_prepared_statements
                         WHERE name LIKE 'read%' ORDER BY name",
                        &[],
                    )
                    .await
                    .expect("prepared statements")
                    .iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2)))
                    .collect::<Vec<(String, i64, i64)>>();
                (plans, kept)
            });
        let (plans, kept) = plans;
        assert_eq!(
            kept,
            [
                ("read0".to_owned(), 5, 6),
                ("read1".to_owned(), 5, 6),
                ("read2".to_owned(), 5, 6)
            ]
        );
        // Each name is looked up in the index, and only the rows of those steps are read. A filter on
        // the whole array (`= ANY($2)`) may be planned so too, or as a scan of all of the run's rows
        // with a filter, as the server's estimates of the run's size go: a benchmark's 2,000-step run
        // was read whole for each step that way. The results' blobs are looked up by their hash too.
        let scans = |plan: &str, table: &str| {
            let lines: Vec<&str> = plan.lines().collect();
            lines
                .iter()
                .enumerate()
                .filter(|(_, line)| {
                    line.contains(" Scan ") && line.ends_with(&format!(" on {table}"))
                })
                .flat_map(|(i, line)| {
                    [
                        line.to_string(),
                        lines.get(i + 1).unwrap_or(&"").to_string(),
                    ]
                })
                .collect::<Vec<_>>()
        };
        for (plan, table) in plans.iter().zip(["results", "attempts", "checkpoints"]) {
            assert_eq!(
                scans(plan, table),
                [
                    format!("->  Index Scan using {table}_by_step on {table}"),
                    "Index Cond: ((run_id = $1) AND (split_part(step, '['::text, 1) = ($2)[n.i]))"
                        .to_owned(),
                ],
                "{plan}"
            );
        }
        assert_eq!(
            plans[0]
                .lines()
                .filter(|line| line.contains(" on blobs "))
                .collect::<Vec<_>>(),
            [
                "->  Index Scan using blobs_pkey on blobs b",
                "->  Index Scan using blobs_pkey on blobs t"
            ],
            "{}",
            plans[0]
        );
        // And what the worker reads is those steps' records, each once.
        let read = store.load_steps("r", &["s7".to_owned(), "m".to_owned(), "s7".to_owned()]);
        let run = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(read)
            .expect("read");
        assert_eq!(
            run.results.keys().collect::<Vec<_>>(),
            ["s7", "m[0]", "m[1]"]
        );
        let mut attempts: Vec<&str> = run.attempts.iter().map(|a| a.step.as_str()).collect();
        attempts.sort_unstable();
        assert_eq!(attempts, ["m[0]", "m[1]", "s7"]);
        let mut checkpoints: Vec<&String> = run.checkpoints.keys().collect();
        checkpoints.sort_unstable();
        assert_eq!(checkpoints, ["m[0]", "m[1]", "s7"]);
        // A read for more steps (one that starts like `s7`, too), cut to these: what a worker gives
        // each of several steps it claimed together is what it would have read for that step alone.
        let wider = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(store.load_steps("r", &["s70".to_owned(), "s7".to_owned(), "m".to_owned()]))
            .expect("read");
        assert_eq!(wider.results.len(), 4);
        let cut = wider.of_steps(&["s7".to_owned(), "m".to_owned()]);
        assert_eq!(
            serde_json::to_value(&cut).expect("serialised"),
            serde_json::to_value(&run).expect("serialised")
        );
        assert_eq!(cut.checkpoints, run.checkpoints);
        drop(store);
        drop_schema(&schema);
    }
}
