//! The task table: the top-level steps of runs submitted to workers (`archon worker`), one row per step
//! once it is ready. A worker claims ready rows in batches (`FOR UPDATE SKIP LOCKED`) under a lease whose
//! token fences the step's journal; whoever finishes a step makes its dependents ready in the same
//! transaction, and any worker returns lapsed leases to ready.
//!
//! A submitted run has no owning process: its row names [`WORKERS`] as its owner's host with a lease that
//! never lapses, so it shows as running (not interrupted) from submission to its end, whoever works on it.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::queries::{bump, ms};
use super::{Inner, PostgresStore, Result};
use crate::record::{self, FORMAT_VERSION};
use crate::store::{Finished, Journal, NewRun, StoreError, Task, Tasks, now_ms};

/// The owner's host a submitted run's row names: no process owns it, the workers do.
pub const WORKERS: &str = "archon workers";

async fn submit(inner: &Inner, run: &NewRun, ready: &[String]) -> Result<()> {
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
    super::queries::insert_files(&tx, &run.id, &run.files).await?;
    tx.execute(
        "INSERT INTO tasks (run_id, step, state, ready_at)
         SELECT $1, step, 'ready', $3 FROM unnest($2::text[]) AS step",
        &[&run.id, &ready, &now],
    )
    .await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(())
}

async fn claim(inner: &Inner, worker: &str, limit: usize, lease: Duration) -> Result<Vec<Task>> {
    let now = now_ms();
    let client = inner.client().await?;
    let rows = client
        .query(
            "WITH picked AS (
                SELECT t.run_id, t.step FROM tasks t JOIN runs r ON r.id = t.run_id
                WHERE t.state = 'ready' AND NOT r.cancel_requested
                ORDER BY t.ready_at, t.run_id, t.step
                LIMIT $1 FOR UPDATE OF t SKIP LOCKED
             )
             UPDATE tasks t SET state = 'claimed', token = $2 || ':' || (t.attempts + 1),
                lease_until = $3, worker = $2, attempts = t.attempts + 1
             FROM picked p WHERE t.run_id = p.run_id AND t.step = p.step
             RETURNING t.run_id, t.step, t.token, t.attempts",
            &[
                &(limit as i64),
                &worker,
                &ms(now.saturating_add(lease.as_millis() as u64)),
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
        })
        .collect())
}

async fn finish(
    inner: &Inner,
    task: &Task,
    dependents: &[(String, Vec<String>)],
    steps: usize,
) -> Result<Finished> {
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
    // Finishers of one run take turns: each sees what the one before it marked done.
    let Some(run) = tx
        .query_opt(
            "SELECT cancel_requested FROM runs WHERE id = $1 FOR UPDATE",
            &[&task.run_id],
        )
        .await?
    else {
        return Ok(Finished::Lost);
    };
    let cancel_requested: bool = run.get(0);
    let held = tx
        .query_opt(
            "SELECT 1 FROM tasks WHERE run_id = $1 AND step = $2 AND token = $3 AND state = 'claimed'",
            &[&task.run_id, &task.step, &task.token],
        )
        .await?;
    if held.is_none() {
        return Ok(Finished::Lost);
    }
    let done: i64 = tx
        .query_one(
            "SELECT count(*) FROM tasks WHERE run_id = $1 AND state = 'done'",
            &[&task.run_id],
        )
        .await?
        .get(0);
    if done as usize + 1 >= steps {
        return Ok(Finished::Last);
    }
    tx.execute(
        "UPDATE tasks SET state = 'done', lease_until = NULL WHERE run_id = $1 AND step = $2",
        &[&task.run_id, &task.step],
    )
    .await?;
    let mut ready = Vec::new();
    if !cancel_requested {
        let now = ms(now_ms());
        for (step, needs) in dependents {
            let ended: i64 = tx
                .query_one(
                    "SELECT count(*) FROM tasks WHERE run_id = $1 AND step = ANY($2) AND state = 'done'",
                    &[&task.run_id, needs],
                )
                .await?
                .get(0);
            if ended as usize != needs.len() {
                continue;
            }
            let added = tx
                .execute(
                    "INSERT INTO tasks (run_id, step, state, ready_at) VALUES ($1, $2, 'ready', $3)
                     ON CONFLICT (run_id, step) DO NOTHING",
                    &[&task.run_id, step, &now],
                )
                .await?;
            if added > 0 {
                ready.push(step.clone());
            }
        }
    }
    settle(&tx, &task.run_id).await?;
    tx.commit().await?;
    bump(&client).await;
    Ok(Finished::Done(ready))
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

async fn set_state(inner: &Inner, task: &Task, sql: &str) -> Result<()> {
    let client = inner.client().await?;
    client
        .execute(sql, &[&task.run_id, &task.step, &task.token])
        .await?;
    bump(&client).await;
    Ok(())
}

async fn reap(inner: &Inner) -> Result<usize> {
    let now = ms(now_ms());
    let mut client = inner.client().await?;
    let tx = client.transaction().await?;
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
    let ended: Vec<String> = ended.iter().map(|r| r.get(0)).collect();
    if !ended.is_empty() {
        tx.execute("DELETE FROM tasks WHERE run_id = ANY($1)", &[&ended])
            .await?;
    }
    tx.commit().await?;
    if returned > 0 || !ended.is_empty() {
        bump(&client).await;
    }
    Ok(returned as usize)
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
    fn submit(&self, run: &NewRun, ready: &[String]) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let (run, ready) = (run.clone(), ready.to_vec());
        self.run(async move { submit(&inner, &run, &ready).await })
    }

    fn claim_tasks(
        &self,
        worker: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<Task>, StoreError> {
        let inner = self.inner.clone();
        let worker = worker.to_owned();
        self.run(async move { claim(&inner, &worker, limit, lease).await })
    }

    fn task_journal(
        &self,
        task: &Task,
        lease: Duration,
        cancel: CancellationToken,
    ) -> Result<Arc<dyn Journal>, StoreError> {
        let inner = self.inner.clone();
        let task = task.clone();
        let start = self.run(async move {
            super::journal::Writer::start_task(inner, task.run_id, task.step, task.token, lease)
                .await
        })?;
        Ok(Arc::new(super::journal::PgJournal::spawn(
            start,
            cancel,
            super::runtime()?,
        )))
    }

    fn finish(
        &self,
        task: &Task,
        dependents: &[(String, Vec<String>)],
        steps: usize,
    ) -> Result<Finished, StoreError> {
        let inner = self.inner.clone();
        let (task, dependents) = (task.clone(), dependents.to_vec());
        self.run(async move { finish(&inner, &task, &dependents, steps).await })
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
            )
            .await
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
            )
            .await
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
