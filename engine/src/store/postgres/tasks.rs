//! The task table: the top-level steps of runs submitted to workers (`archon worker`), one row per step
//! once it is ready. A worker claims ready rows in batches under a lease whose token fences the step's
//! journal; claims take turns under an advisory lock, so that the limits they count hold (a run's
//! `max_parallel`, its workflow's `concurrency`, a worker's global limit), take only tasks whose labels the
//! worker has, and share the workers fairly among runs. Whoever finishes a step makes its dependents ready
//! in the same transaction, and any worker returns lapsed leases to ready. Workers register in `workers`
//! while they run, so that a step no live worker can take shows as waiting, with why.
//!
//! A submitted run has no owning process: its row names [`WORKERS`] as its owner's host with a lease that
//! never lapses, so it shows as running (not interrupted) from submission to its end, whoever works on it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::queries::{bump, ms};
use super::{Failure, Inner, NOTIFY_WORK, PostgresStore, Result};
use crate::record::{self, FORMAT_VERSION};
use crate::store::{
    LiveWorker, NewRun, Routing, StoreError, StoreFuture, StoredRun, Task, TaskJournal, Tasks,
    Waiting, WorkerInfo, now_ms,
};

/// The owner's host a submitted run's row names: no process owns it, the workers do.
pub const WORKERS: &str = "archon workers";

async fn submit(inner: &Inner, run: &NewRun, routing: &Routing, ready: &[String]) -> Result<()> {
    let now = ms(now_ms());
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO runs (id, workflow, spec_path, spec_hash, status, inputs, workdir, max_parallel,
            started_at, owner_pid, owner_host, lease_until, format, owner_serves)
         VALUES ($1, $2, $3, $4, 'running', $5, $6, $7, $8, 0, $9, $10, $11, TRUE)",
        &[
            &run.id,
            &run.workflow,
            &run.spec_path,
            &crate::store::spec_hash(&run.files),
            &record::encode(&run.inputs),
            &run.workdir,
            &(run.max_parallel as i64),
            &now,
            &WORKERS,
            &i64::MAX,
            &i64::from(FORMAT_VERSION),
        ],
    )
    .await?;
    if let Some(limit) = routing.workflow_limit {
        tx.execute(
            "UPDATE runs SET workflow_limit = $2 WHERE id = $1",
            &[&run.id, &i64::from(limit)],
        )
        .await?;
    }
    super::queries::insert_files(&tx, &run.id, &run.files).await?;
    for (step, labels) in &routing.labels {
        tx.execute(
            "INSERT INTO step_labels (run_id, step, labels) VALUES ($1, $2, $3)",
            &[&run.id, step, labels],
        )
        .await?;
    }
    tx.execute(
        "INSERT INTO tasks (run_id, step, state, ready_at, labels)
         SELECT $1, step, 'ready', $3, COALESCE(
            (SELECT l.labels FROM step_labels l WHERE l.run_id = $1 AND l.step = s.step), '{}')
         FROM unnest($2::text[]) AS s (step)",
        &[&run.id, &ready, &now],
    )
    .await?;
    tx.batch_execute(NOTIFY_WORK).await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(())
}

async fn claim(inner: &Inner, worker: &str, limit: usize, lease: Duration) -> Result<Vec<Task>> {
    let now = now_ms();
    let client = inner.client().await?;
    // One statement: no transaction is left open between round trips (a worker frozen there would hold
    // the claim lock until the server ends its session). `archon_claim` takes the lock, then claims with
    // a snapshot taken after it (schema.rs, migration 4, as migration 12 replaced it).
    let statement = client
        .prepare_cached("SELECT * FROM archon_claim($1, $2, $3, $4)")
        .await?;
    let leased_at = std::time::Instant::now();
    let rows = client
        .query(
            &statement,
            &[
                &(limit as i64),
                &worker,
                &ms(now.saturating_add(lease.as_millis() as u64)),
                &WORKERS,
            ],
        )
        .await?;
    if !rows.is_empty() {
        bump(&client).await;
    }
    Ok(rows
        .iter()
        .map(|r| Task {
            run_id: r.get(0),
            step: r.get(1),
            token: r.get(2),
            claims: u32::try_from(r.get::<_, i64>(3)).unwrap_or(u32::MAX),
            leased_at,
        })
        .collect())
}

/// Makes ready again the waiting tasks of run `id` whose step has no call left undecided (requests with
/// a key in `expired` are past their timeout: their rule's default decides them), and brings the run back
/// to the workers when it rested `waiting_approval`. In the transaction that decided, or that set the
/// task aside: the two lock the run's row, so a decision made while the step was still running is seen.
pub(super) async fn release_decided(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    expired: &[String],
) -> Result<u64> {
    let released = tx
        .execute(
            "UPDATE tasks t SET state = 'ready', ready_at = $2
             WHERE t.run_id = $1 AND t.state = 'waiting' AND NOT EXISTS (
                SELECT 1 FROM approvals a WHERE a.run_id = t.run_id AND a.decision IS NULL
                    AND NOT (a.key = ANY($3))
                    AND (a.step = t.step OR left(a.step, length(t.step) + 1) IN (t.step || '/', t.step || '[')))",
            &[&id, &ms(now_ms()), &expired],
        )
        .await?;
    if released > 0 {
        tx.batch_execute(NOTIFY_WORK).await?;
        tx.execute(
            "UPDATE runs SET status = 'running', finished_at = NULL, owner_pid = 0, owner_host = $2,
                lease_until = $3, owner_started = NULL, owner_token = NULL, owner_serves = TRUE
             WHERE id = $1 AND status = 'waiting_approval'",
            &[&id, &WORKERS, &i64::MAX],
        )
        .await?;
    }
    Ok(released)
}

/// Rests a submitted run `waiting_approval` once none of its steps is ready or running and one waits
/// for a person; the run's row is locked.
/// `archon_finish` (schema.rs, migration 13) ends with the same statement when a task of the run waits.
async fn settle(tx: &tokio_postgres::Transaction<'_>, id: &str) -> Result<()> {
    tx.execute(
        "UPDATE runs r SET status = 'waiting_approval', finished_at = $2, owner_pid = NULL,
            owner_host = NULL, lease_until = NULL, owner_started = NULL, owner_token = NULL
         WHERE r.id = $1 AND r.status = 'running' AND r.owner_host = $3 AND NOT r.cancel_requested
            AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state = 'waiting')
            AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state IN ('ready', 'claimed'))",
        &[&id, &ms(now_ms()), &WORKERS],
    )
    .await?;
    Ok(())
}

async fn wait_approval(inner: &Inner, task: &Task) -> Result<()> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    tx.query_opt(
        "SELECT 1 FROM runs WHERE id = $1 FOR UPDATE",
        &[&task.run_id],
    )
    .await?;
    let changed = tx
        .execute(
            "UPDATE tasks SET state = 'waiting', token = NULL, lease_until = NULL, worker = NULL
             WHERE run_id = $1 AND step = $2 AND token = $3 AND state = 'claimed'",
            &[&task.run_id, &task.step, &task.token],
        )
        .await?;
    if changed > 0 {
        // Decided while the step still ran: it goes on at once.
        release_decided(&tx, &task.run_id, &[]).await?;
        settle(&tx, &task.run_id).await?;
    }
    tx.commit().await?;
    bump(&client).await;
    Ok(())
}

async fn hand_back(inner: &Inner, id: &str) -> Result<bool> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    let status: Option<String> = tx
        .query_opt("SELECT status FROM runs WHERE id = $1 FOR UPDATE", &[&id])
        .await?
        .map(|r| r.get(0));
    if status.as_deref() != Some("waiting_approval") {
        return Ok(false);
    }
    let ready = tx
        .execute(
            "UPDATE tasks SET state = 'ready', ready_at = $2 WHERE run_id = $1 AND state = 'waiting'",
            &[&id, &ms(now_ms())],
        )
        .await?;
    if ready == 0 {
        return Ok(false);
    }
    tx.batch_execute(NOTIFY_WORK).await?;
    tx.execute(
        "UPDATE runs SET status = 'running', finished_at = NULL, owner_pid = 0, owner_host = $2,
            lease_until = $3, owner_started = NULL, owner_token = NULL, owner_serves = TRUE
         WHERE id = $1",
        &[&id, &WORKERS, &i64::MAX],
    )
    .await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(true)
}

/// Changes the task's state with `sql`; whether it changed. `ready`: it became ready again, which idle
/// workers hear of at once.
async fn set_state(inner: &Inner, task: &Task, sql: &str, ready: bool) -> Result<bool> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    let changed = tx
        .execute(sql, &[&task.run_id, &task.step, &task.token])
        .await?;
    if ready && changed > 0 {
        tx.batch_execute(NOTIFY_WORK).await?;
    }
    tx.commit().await?;
    bump(&client).await;
    Ok(changed > 0)
}

async fn reap(inner: &Inner) -> Result<usize> {
    let now = ms(now_ms());
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    // A lapsed task of a run that has ended was its last, held by a worker that stopped between
    // recording the run's end and marking the task done: nothing is left to run.
    tx.execute(
        "UPDATE tasks t SET state = 'done', token = NULL, lease_until = NULL, worker = NULL
         FROM runs r
         WHERE r.id = t.run_id AND t.state = 'claimed' AND t.lease_until < $1
            AND r.status IN ('succeeded', 'failed', 'cancelled')",
        &[&now],
    )
    .await?;
    let returned = tx
        .execute(
            "UPDATE tasks SET state = 'ready', token = NULL, lease_until = NULL, worker = NULL,
                ready_at = $1
             WHERE state = 'claimed' AND lease_until < $1",
            &[&now],
        )
        .await?;
    let ended = tx
        .query(
            "UPDATE runs r SET status = 'cancelled', finished_at = $1, owner_pid = NULL,
                owner_host = NULL, lease_until = NULL, owner_started = NULL, owner_token = NULL
             WHERE r.status = 'running' AND r.owner_host = $2 AND r.cancel_requested
                AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state = 'claimed')
             RETURNING r.id",
            &[&now, &WORKERS],
        )
        .await?;
    // Workers whose registration lapsed are gone: they no longer count as able to take a step.
    tx.execute("DELETE FROM workers WHERE lease_until < $1", &[&now])
        .await?;
    let ended: Vec<String> = ended.iter().map(|r| r.get(0)).collect();
    if !ended.is_empty() {
        tx.execute("DELETE FROM tasks WHERE run_id = ANY($1)", &[&ended])
            .await?;
    }
    if returned > 0 {
        tx.batch_execute(NOTIFY_WORK).await?;
    }
    tx.commit().await?;
    if returned > 0 || !ended.is_empty() {
        bump(&client).await;
    }
    let released = release_expired(&mut client).await?;
    Ok(returned as usize + released)
}

/// The runs a step of which waits for a person only on requests whose rule's `timeout` has passed at `$1`
/// (and on one at least): nobody decided in time, so the rule's `default` decides them when the step runs
/// again. A request's record (`record::ApprovalRequest`, JSON text) holds its `timeout_ms`, null without
/// one; past it when `requested_at + timeout_ms <= now`, as `session::decisions` counts it for a local
/// resume. A request belongs to the waiting step when it is the step's own, an item's (`step[i]`) or an
/// inner step's (`step/...`), as in `release_decided`. Driven by the `tasks_waiting` partial index: an
/// empty index when nothing waits.
const EXPIRED_RUNS: &str = "SELECT DISTINCT t.run_id FROM tasks t JOIN runs r ON r.id = t.run_id
    WHERE t.state = 'waiting' AND NOT r.cancel_requested
        AND (r.status = 'waiting_approval' OR (r.status = 'running' AND r.owner_host = $2))
        AND EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = t.run_id AND a.decision IS NULL
            AND (a.step = t.step OR left(a.step, length(t.step) + 1) IN (t.step || '/', t.step || '['))
            AND a.requested_at + (a.request::jsonb ->> 'timeout_ms')::numeric <= $1::bigint)
        AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = t.run_id AND a.decision IS NULL
            AND (a.step = t.step OR left(a.step, length(t.step) + 1) IN (t.step || '/', t.step || '['))
            AND NOT COALESCE(a.requested_at + (a.request::jsonb ->> 'timeout_ms')::numeric <= $1::bigint, FALSE))";

/// Makes ready again, run by run, the waiting steps whose every undecided request is past its timeout
/// ([`EXPIRED_RUNS`]): through [`release_decided`] with those requests as expired, in a transaction that
/// locks the run's row as a decision's does, and announces the work. Returns how many steps it made
/// ready. One indexed query when nothing waits.
async fn release_expired(client: &mut deadpool_postgres::Object) -> Result<usize> {
    let now = now_ms();
    let statement = client.prepare_cached(EXPIRED_RUNS).await?;
    let runs: Vec<String> = client
        .query(&statement, &[&ms(now), &WORKERS])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut released = 0;
    for id in runs {
        let tx = client.transaction().await?;
        let open = tx
            .query_opt(
                "SELECT 1 FROM runs WHERE id = $1 AND NOT cancel_requested
                    AND (status = 'waiting_approval' OR (status = 'running' AND owner_host = $2))
                 FOR UPDATE",
                &[&id, &WORKERS],
            )
            .await?;
        if open.is_none() {
            continue;
        }
        // Read again under the lock: a decision may have come since.
        let expired: Vec<String> = tx
            .query(
                "SELECT a.key FROM approvals a WHERE a.run_id = $1 AND a.decision IS NULL
                    AND a.requested_at + (a.request::jsonb ->> 'timeout_ms')::numeric <= $2::bigint",
                &[&id, &ms(now)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        released += release_decided(&tx, &id, &expired).await? as usize;
        tx.commit().await?;
        bump(client).await;
    }
    Ok(released)
}

async fn register(inner: &Inner, worker: &WorkerInfo, lease: Duration) -> Result<()> {
    let now = now_ms();
    let client = inner.client().await?;
    client
        .execute(
            "INSERT INTO workers (name, host, pid, labels, concurrency, global_limit, started_at,
                heartbeat_at, lease_until)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8)
             ON CONFLICT (name) DO UPDATE SET heartbeat_at = $7, lease_until = $8",
            &[
                &worker.name,
                &worker.host,
                &i64::from(worker.pid),
                &worker.labels,
                &(worker.concurrency as i64),
                &worker.global_limit.map(i64::from),
                &ms(now),
                &ms(now.saturating_add(lease.as_millis() as u64)),
            ],
        )
        .await?;
    Ok(())
}

/// The live workers, oldest first, each with the tasks it holds (claimed by it, lease not lapsed).
async fn workers(inner: &Inner) -> Result<Vec<LiveWorker>> {
    let now = ms(now_ms());
    let client = inner.client().await?;
    let rows = client
        .query(
            "SELECT w.name, w.host, w.pid, w.labels, w.concurrency, w.global_limit, w.started_at,
                w.heartbeat_at, w.lease_until,
                (SELECT count(*) FROM tasks t
                 WHERE t.state = 'claimed' AND t.worker = w.name AND t.lease_until >= $1)
             FROM workers w WHERE w.lease_until >= $1
             ORDER BY w.started_at, w.name",
            &[&now],
        )
        .await?;
    let unsigned = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(rows
        .iter()
        .map(|r| LiveWorker {
            name: r.get(0),
            host: r.get(1),
            pid: u32::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            labels: r.get(3),
            concurrency: usize::try_from(r.get::<_, i64>(4)).unwrap_or(0),
            global_limit: r
                .get::<_, Option<i64>>(5)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            steps: usize::try_from(r.get::<_, i64>(9)).unwrap_or(0),
            started_at: unsigned(r.get(6)),
            last_seen_at: unsigned(r.get(7)),
            lease_until: unsigned(r.get(8)),
        })
        .collect())
}

/// Why each ready task of run `id` waits: no live worker has its labels, or a limit holds it back.
async fn waiting(inner: &Inner, id: &str) -> Result<Vec<Waiting>> {
    let now = ms(now_ms());
    let client = inner.client().await?;
    let Some(run) = client
        .query_opt(
            "SELECT r.workflow, r.max_parallel, r.workflow_limit,
                (SELECT count(*) FROM tasks t WHERE t.run_id = r.id AND t.state = 'claimed'),
                (SELECT count(*) FROM tasks t JOIN runs o ON o.id = t.run_id
                 WHERE o.workflow = r.workflow AND t.state = 'claimed')
             FROM runs r WHERE r.id = $1 AND r.status = 'running' AND r.owner_host = $2",
            &[&id, &WORKERS],
        )
        .await?
    else {
        return Ok(Vec::new());
    };
    let (workflow, max_parallel, workflow_limit, running, workflow_running): (
        String,
        i64,
        Option<i64>,
        i64,
        i64,
    ) = (run.get(0), run.get(1), run.get(2), run.get(3), run.get(4));
    let workers: Vec<Vec<String>> = client
        .query(
            "SELECT labels FROM workers WHERE lease_until >= $1",
            &[&now],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let ready = client
        .query(
            "SELECT step, labels FROM tasks WHERE run_id = $1 AND state = 'ready'
             ORDER BY ready_at, step LIMIT 1000",
            &[&id],
        )
        .await?;
    let ticked = |labels: &[String]| {
        labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Ok(ready
        .iter()
        .map(|row| {
            let step: String = row.get(0);
            let labels: Vec<String> = row.get(1);
            let able = workers
                .iter()
                .any(|have| labels.iter().all(|l| have.contains(l)));
            let reason = if labels.is_empty() && workers.is_empty() {
                "no live worker".to_owned()
            } else if !able {
                format!(
                    "no live worker has {} {}",
                    if labels.len() == 1 { "label" } else { "labels" },
                    ticked(&labels)
                )
            } else if running >= max_parallel {
                format!("the run has `{running}` steps running, its `max_parallel`")
            } else if workflow_limit.is_some_and(|limit| workflow_running >= limit) {
                format!(
                    "workflow `{workflow}` has `{workflow_running}` steps running, its `concurrency`"
                )
            } else {
                "no worker has taken it yet".to_owned()
            };
            Waiting { step, reason }
        })
        .collect())
}

async fn interrupt(inner: &Inner, task: &Task, error: &str) -> Result<()> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    let changed = tx
        .execute(
            "UPDATE runs SET status = 'interrupted', error = $4, owner_pid = NULL, owner_host = NULL,
                lease_until = NULL, owner_started = NULL, owner_token = NULL
             WHERE id = $1 AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = $1 AND t.step = $2
                AND t.token = $3 AND t.state = 'claimed')",
            &[&task.run_id, &task.step, &task.token, &error],
        )
        .await?;
    if changed > 0 {
        tx.execute("DELETE FROM tasks WHERE run_id = $1", &[&task.run_id])
            .await?;
    }
    tx.commit().await?;
    bump(&client).await;
    Ok(())
}

impl Tasks for PostgresStore {
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        super::runtime()
            .ok()
            .map(|runtime| runtime.handle().clone())
    }

    fn submit(&self, run: &NewRun, routing: &Routing, ready: &[String]) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let (run, routing, ready) = (run.clone(), routing.clone(), ready.to_vec());
        self.run(async move { submit(&inner, &run, &routing, &ready).await })
    }

    fn register_worker(
        &self,
        worker: &WorkerInfo,
        lease: Duration,
        stop: CancellationToken,
    ) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let first = worker.clone();
        self.run(async move { register(&inner, &first, lease).await })?;
        // Renewed every third of the lease until the worker stops; a renewal that fails (the database is
        // away) is tried again at the next.
        let inner = self.inner.clone();
        let name = worker.name.clone();
        let worker = worker.clone();
        let renewal = super::runtime()?.spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(lease / 3) => {}
                }
                let _ = register(&inner, &worker, lease).await;
            }
        });
        if let Ok(mut renewals) = self.inner.renewals.lock() {
            renewals.insert(name, renewal);
        }
        Ok(())
    }

    /// Once the worker's renewal has ended (its `stop` was cancelled): a renewal still under way would
    /// otherwise register the worker again after the delete.
    fn deregister_worker(&self, name: &str) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let name = name.to_owned();
        let renewal = self
            .inner
            .renewals
            .lock()
            .ok()
            .and_then(|mut r| r.remove(&name));
        self.run(async move {
            if let Some(renewal) = renewal {
                let _ = tokio::time::timeout(super::CONNECT_TIMEOUT, renewal).await;
            }
            let client = inner.client().await?;
            client
                .execute("DELETE FROM workers WHERE name = $1", &[&name])
                .await?;
            Ok(())
        })
    }

    fn workers(&self) -> Result<Vec<LiveWorker>, StoreError> {
        let inner = self.inner.clone();
        self.run(async move { workers(&inner).await })
    }

    fn waiting(&self, run_id: &str) -> Result<Vec<Waiting>, StoreError> {
        let inner = self.inner.clone();
        let id = run_id.to_owned();
        self.run(async move { waiting(&inner, &id).await })
    }

    fn claim_tasks(&self, worker: &str, limit: usize, lease: Duration) -> StoreFuture<Vec<Task>> {
        let inner = self.inner.clone();
        let worker = worker.to_owned();
        self.spawn(async move { claim(&inner, &worker, limit, lease).await })
    }

    fn load_steps(&self, id: &str, steps: &[String]) -> StoreFuture<StoredRun> {
        let inner = self.inner.clone();
        let (id, steps) = (id.to_owned(), steps.to_vec());
        self.spawn(async move { super::queries::load(&inner, &id, true, Some(&steps)).await })
    }

    fn task_journal(
        &self,
        task: &Task,
        stored: &StoredRun,
        lease: Duration,
        cancel: CancellationToken,
    ) -> StoreFuture<Arc<dyn TaskJournal>> {
        let inner = self.inner.clone();
        let task = task.clone();
        // The highest attempt of the step and of each of its `foreach` items (`step[i]`).
        let mut last_attempt: HashMap<String, u32> = HashMap::new();
        for attempt in &stored.attempts {
            if attempt.step.split('[').next() == Some(task.step.as_str()) {
                let last = last_attempt.entry(attempt.step.clone()).or_insert(0);
                *last = (*last).max(attempt.attempt);
            }
        }
        let known = super::journal::Known {
            generation: stored.generation,
            last_attempt,
        };
        self.spawn(async move {
            let start = super::journal::Writer::start_task(inner, task, lease, known).await?;
            let journal: Arc<dyn TaskJournal> = Arc::new(super::journal::PgJournal::spawn(
                start,
                cancel,
                super::runtime().map_err(Failure::Store)?,
            ));
            Ok(journal)
        })
    }

    fn complete(&self, task: &Task) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let task = task.clone();
        self.run(async move {
            set_state(
                &inner,
                &task,
                "UPDATE tasks SET state = 'done', lease_until = NULL
                 WHERE run_id = $1 AND step = $2 AND token = $3",
                false,
            )
            .await
            .map(|_| ())
        })
    }

    fn release_task(&self, task: &Task) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let task = task.clone();
        self.run(async move {
            set_state(
                &inner,
                &task,
                "UPDATE tasks SET state = 'ready', token = NULL, lease_until = NULL, worker = NULL
                 WHERE run_id = $1 AND step = $2 AND token = $3 AND state = 'claimed'",
                true,
            )
            .await
            .map(|_| ())
        })
    }

    fn reap(&self) -> Result<usize, StoreError> {
        let inner = self.inner.clone();
        self.run(async move { reap(&inner).await })
    }

    fn interrupt(&self, task: &Task, error: &str) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let (task, error) = (task.clone(), error.to_owned());
        self.run(async move { interrupt(&inner, &task, &error).await })
    }

    fn work_signal(&self) -> Arc<tokio::sync::Notify> {
        PostgresStore::work_signal(self)
    }

    fn wait_approval(&self, task: &Task) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let task = task.clone();
        self.run(async move { wait_approval(&inner, &task).await })
    }

    fn hand_back(&self, run_id: &str) -> Result<bool, StoreError> {
        let inner = self.inner.clone();
        let id = run_id.to_owned();
        self.run(async move { hand_back(&inner, &id).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::testing::{connect, drop_schema, store};

    /// A run of 300 steps: 297 done (through ready and claimed, so that the indexes of ready and claimed
    /// tasks keep an entry for each until a vacuum), `a` and `b` claimed, `c` ready.
    const RUN_AND_TASKS: &str =
        "INSERT INTO runs (id, workflow, spec_path, spec_hash, status, inputs,
            workdir, max_parallel, started_at, owner_host, format)
        VALUES ('r', 'w', 'w.yaml', '', 'running', '{}', '/', 4, 0, 'archon workers', 1);
        INSERT INTO tasks (run_id, step, state, ready_at)
            SELECT 'r', 's' || n, 'ready', n FROM generate_series(1, 297) AS n;
        UPDATE tasks SET state = 'claimed', token = 't', lease_until = 4000000000000;
        UPDATE tasks SET state = 'done', lease_until = NULL;
        INSERT INTO tasks (run_id, step, state, ready_at, token, lease_until)
        VALUES ('r', 'a', 'claimed', 1000, 'ta', 4000000000000),
            ('r', 'b', 'claimed', 1000, 'tb', 4000000000000),
            ('r', 'c', 'ready', 1000, NULL, NULL);
        ANALYZE tasks";

    /// Index entries and rows of the task table this session read, not yet reported: what one statement
    /// read is the difference before and after it.
    const TASKS_READ: &str = "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid))::bigint
        FROM pg_class c WHERE c.oid = 'tasks'::regclass
            OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'tasks'::regclass)";

    /// A claim counts the claimed tasks by their index without reading, on every claim, the entries
    /// every task claimed since the last vacuum left there: a bitmap scan never marks an entry whose row
    /// nobody sees any more, and read all 297 here, with their rows, each time (the planner chose one on
    /// this table, never analysed). A plain index scan reads them once and marks them.
    #[test]
    fn a_claim_reads_the_tasks_claimed_now_not_every_task_claimed_since_the_last_vacuum() {
        let Some((store, schema)) = store() else {
            return;
        };
        let within = schema.clone();
        let (claimed, reads) = super::super::runtime()
            .expect("runtime")
            .block_on(async move {
                let mut client = connect(&within).await;
                // As a busy store has them: no statistics since the table was created.
                assert!(RUN_AND_TASKS.ends_with("ANALYZE tasks"));
                let setup = client.transaction().await.expect("begin");
                setup
                    .batch_execute(RUN_AND_TASKS.trim_end_matches("ANALYZE tasks"))
                    .await
                    .expect("run and tasks");
                setup
                    .batch_execute(
                        "UPDATE runs SET max_parallel = 8;
                        INSERT INTO tasks (run_id, step, state, ready_at) VALUES ('r', 'd', 'ready', 1001);
                        INSERT INTO workers (name, host, pid, labels, concurrency, started_at,
                            heartbeat_at, lease_until)
                        VALUES ('w', 'h', 1, '{}', 8, 0, 0, 4000000000000)",
                    )
                    .await
                    .expect("a worker");
                let xid: String = setup
                    .query_one("SELECT pg_current_xact_id()::text", &[])
                    .await
                    .expect("xid")
                    .get(0);
                setup.commit().await.expect("commit");
                // An entry is marked once no transaction can see its row: until every session of the
                // database that began before the setup committed (another test's, say) has ended.
                let older = "SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND pid <> pg_backend_pid()
                        AND greatest(age(backend_xmin), age(backend_xid))
                            >= age((($1::text::bigint) % 4294967296)::text::xid)";
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                loop {
                    let n: i64 = client.query_one(older, &[&xid]).await.expect("older").get(0);
                    if n == 0 {
                        break;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{n} sessions began before the setup committed and go on"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let claim = "SELECT step || ' ' || token
                    FROM archon_claim(1, 'w', 4000000000000, 'archon workers')";
                let mut claimed: Vec<String> = Vec::new();
                let mut reads: Vec<i64> = Vec::new();
                for _ in 0..3 {
                    // In one transaction, so that the session's counts are not reported (and reset)
                    // between the two reads.
                    client.batch_execute("BEGIN").await.expect("begin");
                    let before: i64 = client.query_one(TASKS_READ, &[]).await.expect("read").get(0);
                    let rows = client.query(claim, &[]).await.expect("claim");
                    claimed.extend(rows.iter().map(|r| r.get::<_, String>(0)));
                    let after: i64 = client.query_one(TASKS_READ, &[]).await.expect("read").get(0);
                    client.batch_execute("COMMIT").await.expect("commit");
                    reads.push(after - before);
                }
                (claimed, reads)
            });
        // The first claim reads the entries, marking them; the claims after it step over them.
        assert_eq!(claimed, ["c w:1", "d w:1"]);
        assert!(reads[0] >= 297, "{reads:?}");
        assert!(reads[1..].iter().all(|n| (0..=8).contains(n)), "{reads:?}");
        drop(store);
        drop_schema(&schema);
    }

    /// A finish tells whether its step is the run's last from the count of done tasks kept for the run
    /// (`run_progress`): it reads a few rows of the task table whatever the run's size, not the entries
    /// the indexes of the run's pending tasks keep for every task that left the state (its predecessor
    /// read all 297 here). Every task marked done is counted, once, whatever marked it.
    #[test]
    fn a_finish_knows_the_last_step_without_reading_the_runs_pending_tasks() {
        let Some((store, schema)) = store() else {
            return;
        };
        let within = schema.clone();
        let (outcomes, read) = super::super::runtime()
            .expect("runtime")
            .block_on(async move {
                let client = connect(&within).await;
                client.batch_execute(RUN_AND_TASKS).await.expect("run and tasks");
                let finish =
                    "SELECT outcome FROM archon_finish('r', $1, $2, 300, '[]', 0, 'archon workers')";
                let read = TASKS_READ;
                let mut outcomes: Vec<String> = Vec::new();
                let mut reads: Vec<i64> = Vec::new();
                for (step, token) in [("a", "ta"), ("b", "tb"), ("c", "tc")] {
                    if step == "c" {
                        client
                            .batch_execute(
                                "UPDATE tasks SET state = 'claimed', token = 'tc' WHERE step = 'c'",
                            )
                            .await
                            .expect("c claimed");
                    }
                    // The server's counts are the session's, not yet reported: the finish's are the
                    // difference.
                    let before: i64 = client.query_one(read, &[]).await.expect("read").get(0);
                    let row = client.query_one(finish, &[&step, &token]).await.expect("finish");
                    outcomes.push(row.get(0));
                    let after: i64 = client.query_one(read, &[]).await.expect("read").get(0);
                    reads.push(after - before);
                }
                (outcomes, reads)
            });
        // The run's end recorded, its last task is marked done (twice: counted once).
        let task = Task {
            run_id: "r".to_owned(),
            step: "c".to_owned(),
            token: "tc".to_owned(),
            claims: 1,
            leased_at: std::time::Instant::now(),
        };
        let tasks = crate::store::RunStore::tasks(&store).expect("a task table");
        tasks.complete(&task).expect("complete");
        tasks.complete(&task).expect("complete again");
        let within = schema.clone();
        let done: Vec<String> = super::super::runtime()
            .expect("runtime")
            .block_on(async move {
                connect(&within)
                    .await
                    .query(
                        "SELECT p.tasks_done || ' ' || count(*) FILTER (WHERE t.state = 'done')
                         FROM run_progress p JOIN tasks t ON t.run_id = p.run_id GROUP BY p.tasks_done",
                        &[],
                    )
                    .await
                    .expect("done")
                    .iter()
                    .map(|r| r.get(0))
                    .collect()
            });
        assert_eq!(outcomes, ["done", "done", "last"]);
        assert!(read.iter().all(|&n| n <= 8), "{read:?}");
        assert_eq!(done, ["300 300"]);
        drop(store);
        drop_schema(&schema);
    }

    /// A finish that waits for the run's row (another finisher, or a step set aside for a person, holds
    /// it) sees what that transaction did once it commits: the step it marked done (so that this one is
    /// the run's last), or the step it set waiting for a person (so that the run rests waiting).
    #[test]
    fn a_finish_that_waits_for_its_run_sees_what_the_holder_committed() {
        let Some((store, schema)) = store() else {
            return;
        };
        let within = schema.clone();
        let (outcomes, status) = super::super::runtime()
            .expect("runtime")
            .block_on(async move {
                let client = connect(&within).await;
                client.batch_execute(RUN_AND_TASKS).await.expect("run and tasks");
                let mut outcomes = Vec::new();
                // 299 steps: 297 done, `a` and `b` claimed; the holder marks `a` done. Then 301 steps:
                // the holder marks `c` done, `b` waiting for a person, and adds `d`, claimed.
                for (holder_does, finish, steps) in [
                    ("UPDATE tasks SET state = 'done' WHERE step = 'a'", "b", 299_i64),
                    (
                        "UPDATE tasks SET state = 'done' WHERE step = 'c';
                         UPDATE tasks SET state = 'waiting', token = NULL WHERE step = 'b';
                         INSERT INTO tasks (run_id, step, state, ready_at, token, lease_until)
                         VALUES ('r', 'd', 'claimed', 1000, 'td', 4000000000000)",
                        "d",
                        301,
                    ),
                ] {
                    let holder = connect(&within).await;
                    holder
                        .batch_execute(&format!(
                            "BEGIN; SELECT 1 FROM runs WHERE id = 'r' FOR NO KEY UPDATE; {holder_does}"
                        ))
                        .await
                        .expect("the holder's transaction");
                    let finisher = connect(&within).await;
                    let pid: i32 = finisher
                        .query_one("SELECT pg_backend_pid()", &[])
                        .await
                        .expect("the finisher's session")
                        .get(0);
                    let token = format!("t{finish}");
                    let finished = tokio::spawn(async move {
                        finisher
                            .query_one(
                                "SELECT outcome FROM archon_finish('r', $1, $2, $3, '[]', 0, 'archon workers')",
                                &[&finish, &token, &steps],
                            )
                            .await
                            .map(|row| row.get::<_, String>(0))
                    });
                    // Once the server says the finish waits for a lock, the holder commits.
                    let deadline = std::time::Instant::now() + Duration::from_secs(30);
                    loop {
                        let waiting: bool = client
                            .query_one(
                                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                 WHERE pid = $1 AND wait_event_type = 'Lock')",
                                &[&pid],
                            )
                            .await
                            .expect("activity")
                            .get(0);
                        if waiting {
                            break;
                        }
                        assert!(
                            std::time::Instant::now() < deadline,
                            "the finish never waited for the holder"
                        );
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    holder.batch_execute("COMMIT").await.expect("the holder commits");
                    outcomes.push(finished.await.expect("the finish").expect("finished"));
                }
                let status: String = client
                    .query_one("SELECT status FROM runs WHERE id = 'r'", &[])
                    .await
                    .expect("the run")
                    .get(0);
                (outcomes, status)
            });
        assert_eq!(outcomes, ["last", "done"]);
        assert_eq!(status, "waiting_approval");
        drop(store);
        drop_schema(&schema);
    }

    /// Whether a session waits for the claims' lock of the current schema.
    const CLAIM_WAITS: &str = "SELECT count(*) FROM pg_locks
        WHERE locktype = 'advisory' AND NOT granted AND classid = 1095910223 AND objsubid = 2
            AND objid::text::bigint = hashtext(current_schema())::bigint & 4294967295";

    /// A worker's claim that waits for the server does not hold up the thread it was made on: here it
    /// waits for the claims' lock, which a transaction holds until a task on the same (and only)
    /// thread ends it. A claim that blocked its thread would leave that transaction open until the
    /// server ended it (`idle_in_transaction_session_timeout`), and its `COMMIT` would fail.
    #[test]
    fn a_claim_that_waits_for_the_server_does_not_hold_up_its_thread() {
        let Some((store, schema)) = store() else {
            return;
        };
        assert_eq!(store.workers().expect("the tables made").len(), 0);
        let within = schema.clone();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                let watcher = connect(&within).await;
                let holder = connect(&within).await;
                holder
                    .batch_execute(
                        "SET idle_in_transaction_session_timeout = '20s'; BEGIN;
                        SELECT pg_advisory_xact_lock(1095910223, hashtext(current_schema()))",
                    )
                    .await
                    .expect("the claims' lock held");
                let claim = store.claim_tasks("w", 1, Duration::from_secs(30));
                let release = async {
                    // Once the claim waits for the lock (or once the server ended the transaction).
                    while !holder.is_closed() {
                        let waiting: i64 = watcher
                            .query_one(CLAIM_WAITS, &[])
                            .await
                            .expect("locks")
                            .get(0);
                        if waiting > 0 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    holder.batch_execute("COMMIT").await
                };
                let (claimed, released) = tokio::join!(claim, release);
                assert_eq!(
                    released.map_err(|e| e.to_string()),
                    Ok(()),
                    "the holder's transaction was ended by the server, not by its task"
                );
                assert_eq!(claimed.expect("claimed").len(), 0);
            });
        drop(store);
        drop_schema(&schema);
    }
}
