//! Group commit for the writes of a worker's steps. Each claimed step has a journal of its own (which
//! also ends its task), but a worker runs many steps at once, and a commit per write per step costs the
//! server a WAL flush and a few round trips each. So the journals of a process's steps hand their
//! writes, as [`Unit`]s, to a few committer tasks of the store, and each committer applies all the units
//! waiting in one transaction, sent in one round trip: the rows of the runs they write locked (in order,
//! so that two committers never deadlock), then the tasks that fence them checked and locked (their
//! leases renewed when due), then the statements of every unit, then the commit. Units that come while
//! a transaction is under way wait for its end (for a moment at most), so that the next carries them all.
//!
//! A unit whose fence no longer holds (its task taken over, its lease lapsed) changes nothing and hears
//! so; the others go on (the check fails the transaction, and the committer applies the units whose
//! fences hold again). A statement that fails fails its transaction: the units that shared it are then
//! applied one by one, so that the failure is only its own unit's. A connection that fails before the
//! transaction was sent changed nothing: each unit's journal may try again; one that fails after may
//! have failed after the commit was applied, and is not tried again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use futures_util::TryStreamExt;
use tokio::sync::{Mutex, Notify, mpsc, oneshot};
use tokio_postgres::types::ToSql;

use super::queries::{BUMP, ms};
use super::{Failure, Inner};
use crate::store::{StoreError, now_ms};

/// A statement's parameters, owned, so that the statements of a transaction can be sent together.
pub(super) type Params = Vec<Box<dyn ToSql + Sync + Send>>;

/// One statement of a unit.
pub(super) struct Op {
    pub sql: &'static str,
    pub params: Params,
}

/// The claimed task that fences a unit: the unit is applied only while the task is still claimed with
/// this token and its lease has not lapsed; then the lease is renewed, to `until`, if given (a journal
/// renews it every third of the lease: a renewal writes a new version of the task's row, with an entry
/// in each of the table's indexes, which every claim then steps over until the table is vacuumed).
pub(super) struct Fence {
    pub run: String,
    pub step: String,
    pub token: String,
    pub until: Option<i64>,
}

/// Writes that are applied together, or not at all.
pub(super) struct Unit {
    pub fence: Option<Fence>,
    /// The run whose row its statements lock (they record it, or finish its steps).
    pub run: String,
    pub ops: Vec<Op>,
}

/// What became of a unit.
pub(super) enum Reply {
    /// Committed: whether the run was asked to stop, and the rows each statement returned.
    Applied {
        cancel_requested: bool,
        rows: Vec<Vec<tokio_postgres::Row>>,
    },
    /// Its fence no longer holds (or its run is gone): nothing of it was applied.
    Fenced,
    /// Not applied, or not known to be: `retryable` when the connection failed before the commit was
    /// sent (nothing of it was kept), `committing` when it failed after (whether it was kept is unknown).
    Failed {
        error: StoreError,
        retryable: bool,
        committing: bool,
    },
}

/// How many committers of a store apply units at once: one gathers the units that wait while the
/// other's transaction is under way, and applies them once it has ended.
const COMMITTERS: usize = 2;
/// How long after the other's transaction began a committer with units stops waiting for its end and
/// applies them anyway: a transaction ends within a few milliseconds unless it waits for a lock (another
/// worker's transaction on the same run, say), and the units that wait meanwhile need not wait for that.
const OVERTAKE: std::time::Duration = std::time::Duration::from_millis(10);
/// The most units one transaction applies.
const MOST_UNITS: usize = 64;

type Waiting = (Unit, oneshot::Sender<Reply>);

/// The committers of a store: they end when it is dropped.
pub(super) struct Committer {
    sender: mpsc::UnboundedSender<Waiting>,
}

impl Committer {
    /// Starts the committers on the current runtime (the store's).
    pub(super) fn spawn(inner: Weak<Inner>) -> Committer {
        Self::spawn_with(inner, OVERTAKE)
    }

    /// The committers, waiting at most `overtake` for each other's transactions.
    fn spawn_with(inner: Weak<Inner>, overtake: std::time::Duration) -> Committer {
        let (sender, receiver) = mpsc::unbounded_channel();
        let receiver = Arc::new(Mutex::new(receiver));
        let flight = Arc::new(Flight {
            under_way: AtomicUsize::new(0),
            since: std::sync::Mutex::new(None),
            ended: Notify::new(),
            overtake,
        });
        for _ in 0..COMMITTERS {
            tokio::spawn(gather(inner.clone(), receiver.clone(), flight.clone()));
        }
        Committer { sender }
    }

    /// Applies `unit` with whatever else waits.
    pub(super) async fn commit(&self, unit: Unit) -> Reply {
        let (reply, replied) = oneshot::channel();
        if self.sender.send((unit, reply)).is_err() {
            return stopped();
        }
        replied.await.unwrap_or_else(|_| stopped())
    }
}

fn stopped() -> Reply {
    Reply::Failed {
        error: StoreError::new("the run store stopped"),
        retryable: false,
        committing: false,
    }
}

/// The committers' transactions under way.
struct Flight {
    under_way: AtomicUsize,
    /// When the latest of them began.
    since: std::sync::Mutex<Option<tokio::time::Instant>>,
    ended: Notify,
    /// How long after its start a committer stops waiting for another's transaction ([`OVERTAKE`]).
    overtake: std::time::Duration,
}

/// A committer's transaction under way, counted until this is dropped: when it ended, or when its task
/// stopped (the store gone, or a panic).
struct UnderWay(Arc<Flight>);

impl UnderWay {
    fn begin(flight: &Arc<Flight>) -> UnderWay {
        flight.under_way.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut since) = flight.since.lock() {
            *since = Some(tokio::time::Instant::now());
        }
        UnderWay(flight.clone())
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.0.under_way.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

/// Takes every unit that waits (at most [`MOST_UNITS`]) and applies them together, until the store is
/// dropped. While the other committer's transaction is under way, the units that come wait for its end
/// (until [`OVERTAKE`] after it began, and not once a full transaction's worth waits), so that one
/// transaction applies all that came meanwhile: a worker's steps cost the server fewer transactions,
/// each with its locks, its fence checks and its commit.
async fn gather(
    inner: Weak<Inner>,
    receiver: Arc<Mutex<mpsc::UnboundedReceiver<Waiting>>>,
    flight: Arc<Flight>,
) {
    loop {
        let (units, _under_way) = {
            let mut receiver = receiver.lock().await;
            let Some(first) = receiver.recv().await else {
                return;
            };
            // Listening before looking, so that an end in between is not missed.
            let ended = flight.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if flight.under_way.load(Ordering::SeqCst) > 0 && receiver.len() + 1 < MOST_UNITS {
                let since = flight
                    .since
                    .lock()
                    .ok()
                    .and_then(|since| *since)
                    .unwrap_or_else(tokio::time::Instant::now);
                let _ = tokio::time::timeout_at(since + flight.overtake, ended).await;
            }
            let mut units = vec![first];
            while units.len() < MOST_UNITS {
                match receiver.try_recv() {
                    Ok(unit) => units.push(unit),
                    Err(_) => break,
                }
            }
            (units, UnderWay::begin(&flight))
        };
        let Some(inner) = inner.upgrade() else {
            for (_, reply) in units {
                let _ = reply.send(stopped());
            }
            return;
        };
        apply(&inner, units).await;
    }
}

async fn apply(inner: &Inner, units: Vec<Waiting>) {
    let (units, replies): (Vec<Unit>, Vec<oneshot::Sender<Reply>>) = units.into_iter().unzip();
    match transact(inner, &units).await {
        Ok(outcomes) => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(outcome);
            }
        }
        // One unit's statement failed the transaction the others shared: each alone, so that the
        // failure is only its own.
        Err((failure, false)) if units.len() > 1 && !retryable(&failure) => {
            for (unit, reply) in units.iter().zip(replies) {
                let outcome = match transact(inner, std::slice::from_ref(unit)).await {
                    Ok(mut outcomes) => outcomes.pop().unwrap_or_else(stopped),
                    Err((failure, committing)) => failed(inner, failure, committing),
                };
                let _ = reply.send(outcome);
            }
        }
        Err((failure, committing)) => {
            let retryable = !committing && retryable(&failure);
            let error = inner.error(failure);
            for reply in replies {
                let _ = reply.send(Reply::Failed {
                    error: error.clone(),
                    retryable,
                    committing,
                });
            }
        }
    }
}

fn failed(inner: &Inner, failure: Failure, committing: bool) -> Reply {
    let retryable = !committing && retryable(&failure);
    Reply::Failed {
        error: inner.error(failure),
        retryable,
        committing,
    }
}

/// Whether a failed write may be tried again: the connection failed or was ended (by the server, an
/// administrator, the network) before the transaction's commit was sent, so nothing of it was kept.
pub(super) fn retryable(failure: &Failure) -> bool {
    match failure {
        Failure::Pool(_) => true,
        Failure::Pg(e) => match e.as_db_error() {
            None => true,
            Some(db) => {
                let code = db.code().code();
                // Connection exceptions, and the server ending the session (`pg_terminate_backend`, a
                // shutdown), or the transaction losing a deadlock or serialization race.
                code.starts_with("08")
                    || code.starts_with("57P")
                    || code == "40P01"
                    || code == "40001"
            }
        },
        Failure::Transient(_) => true,
        Failure::Store(_) => false,
    }
}

/// Locks the runs' rows, in order of their ids, for the units' statements: the events and logs of a run
/// are numbered by the server one after its last, so the writers of a run take turns from here to their
/// commit. The run is locked before its tasks, as by every transaction that locks both (a finish, the
/// reaper, a hand back), so that none waits for another in a circle. Not `FOR UPDATE`: that would make
/// the key checks of other transactions' rows (every insert of a run's records checks its run) wait for
/// this commit too.
const LOCK_RUNS: &str =
    "SELECT id, cancel_requested FROM runs WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE";
/// The same for one run (the usual case): a statement the server plans once, not on every call.
const LOCK_RUN: &str = "SELECT id, cancel_requested FROM runs WHERE id = $1 FOR NO KEY UPDATE";
/// Whether the runs of units that write nothing were asked to stop, read without a lock.
const CANCELS: &str = "SELECT id, cancel_requested FROM runs WHERE id = ANY($1)";
/// Locks the fencing tasks still claimed with their tokens and not lapsed (nobody returns such a task to
/// ready while the transaction commits on the lease it checked), renewing the leases of those with an
/// `until`, and fails the transaction, before any unit's statement, unless every one of the `$6` tasks
/// holds (`archon_fences_hold`, migration 9).
const RENEW_TASKS: &str = "WITH f AS (
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
            AS f (run_id, step, token, until)),
    renewed AS (UPDATE tasks t SET lease_until = f.until FROM f
        WHERE t.run_id = f.run_id AND t.step = f.step AND t.state = 'claimed' AND t.token = f.token
            AND t.lease_until >= $5 AND f.until IS NOT NULL
        RETURNING 1),
    held AS (SELECT 1 FROM tasks t JOIN f ON t.run_id = f.run_id AND t.step = f.step
        WHERE t.state = 'claimed' AND t.token = f.token AND t.lease_until >= $5 AND f.until IS NULL
        FOR NO KEY UPDATE OF t)
    SELECT archon_fences_hold($6, (SELECT count(*) FROM renewed) + (SELECT count(*) FROM held))";
/// The error `archon_fences_hold` raises.
const FENCE_LOST: &str = "AR001";
/// Which of the fencing tasks are still claimed with their tokens and not lapsed (read, not locked).
const HOLDING: &str = "SELECT t.run_id, t.step FROM tasks t
    JOIN unnest($1::text[], $2::text[], $3::text[]) AS f (run_id, step, token)
        ON t.run_id = f.run_id AND t.step = f.step AND t.token = f.token
    WHERE t.state = 'claimed' AND t.lease_until >= $4";

/// Applies `units` in one transaction. Should a fence be lost, the units whose fences still hold are
/// applied again without the others (a few times at most, should fences go on being lost meanwhile).
/// Gives what became of each unit, or the failure and whether the commit may have been applied.
async fn transact(inner: &Inner, units: &[Unit]) -> Result<Vec<Reply>, (Failure, bool)> {
    let client = inner.client().await.map_err(|e| (e, false))?;
    let mut holds = vec![true; units.len()];
    let mut tries = 0;
    loop {
        tries += 1;
        let applied = transact_on(&client, units, &holds).await;
        if applied.is_ok() {
            return applied;
        }
        // A transaction a failure left open (or already ended: then the server only warns).
        let _ = client.batch_execute("ROLLBACK").await;
        match applied {
            Err((Failure::Pg(e), false))
                if tries < 4 && e.code().is_some_and(|c| c.code() == FENCE_LOST) =>
            {
                holds = holding(&client, units)
                    .await
                    .map_err(|e| (Failure::from(e), false))?;
            }
            applied => return applied,
        }
    }
}

/// Which units' fences hold (a unit without a fence always does).
async fn holding(
    client: &deadpool_postgres::Object,
    units: &[Unit],
) -> Result<Vec<bool>, tokio_postgres::Error> {
    let fences: Vec<&Fence> = units.iter().filter_map(|u| u.fence.as_ref()).collect();
    let runs: Vec<&str> = fences.iter().map(|f| f.run.as_str()).collect();
    let steps: Vec<&str> = fences.iter().map(|f| f.step.as_str()).collect();
    let tokens: Vec<&str> = fences.iter().map(|f| f.token.as_str()).collect();
    let rows = client
        .query(HOLDING, &[&runs, &steps, &tokens, &ms(now_ms())])
        .await?;
    let held: HashSet<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    Ok(units
        .iter()
        .map(|unit| {
            unit.fence
                .as_ref()
                .is_none_or(|f| held.contains(&(f.run.clone(), f.step.clone())))
        })
        .collect())
}

/// Sends one statement of a unit, and gives its rows; notes in `failed` a statement that could not be
/// sent, so that the commit behind it is not sent either.
async fn send(
    client: &deadpool_postgres::Object,
    statement: &tokio_postgres::Statement,
    op: &Op,
    failed: &AtomicBool,
) -> Result<Vec<tokio_postgres::Row>, Failure> {
    let sent = client
        .query_raw(
            statement,
            op.params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)),
        )
        .await;
    match sent {
        Ok(rows) => Ok(rows.try_collect::<Vec<_>>().await?),
        Err(e) => {
            failed.store(true, Ordering::SeqCst);
            Err(e.into())
        }
    }
}

/// Applies the units that `holds` in one transaction, sent in one round trip: `BEGIN`, the lock on the
/// runs the units write, the renewal of their fences (which fails the transaction unless every one
/// holds), their statements, `COMMIT`, and the change counter's bump. A run's row is held from its lock to
/// the commit, with no round trip in between; a transaction that only renews leases takes no turn on it.
async fn transact_on(
    client: &deadpool_postgres::Object,
    units: &[Unit],
    holds: &[bool],
) -> Result<Vec<Reply>, (Failure, bool)> {
    // Everything is sent at once: a connection known to be closed sends nothing, and the units may be
    // tried again on another.
    if client.is_closed() {
        return Err((
            Failure::Transient(StoreError::new(
                "the connection to the run store was closed",
            )),
            false,
        ));
    }
    let now = ms(now_ms());
    // Each statement prepared once per connection (no round trip once it is).
    let mut statements: HashMap<&'static str, tokio_postgres::Statement> = HashMap::new();
    let mut sqls = vec![LOCK_RUNS, LOCK_RUN, CANCELS, RENEW_TASKS, BUMP];
    for unit in units {
        sqls.extend(unit.ops.iter().map(|op| op.sql));
    }
    for sql in sqls {
        if !statements.contains_key(sql) {
            let statement = client
                .prepare_cached(sql)
                .await
                .map_err(|e| (e.into(), false))?;
            statements.insert(sql, statement);
        }
    }
    let applying: Vec<&Unit> = units
        .iter()
        .zip(holds)
        .filter(|(_, holds)| **holds)
        .map(|(unit, _)| unit)
        .collect();
    let fences: Vec<&Fence> = applying.iter().filter_map(|u| u.fence.as_ref()).collect();
    let fenced_runs: Vec<&str> = fences.iter().map(|f| f.run.as_str()).collect();
    let fenced_steps: Vec<&str> = fences.iter().map(|f| f.step.as_str()).collect();
    let tokens: Vec<&str> = fences.iter().map(|f| f.token.as_str()).collect();
    let untils: Vec<Option<i64>> = fences.iter().map(|f| f.until).collect();
    let expected = fences.len() as i64;
    // The runs the units write, locked in order; the others' only read.
    let mut written: Vec<&str> = applying
        .iter()
        .filter(|unit| !unit.ops.is_empty())
        .map(|unit| unit.run.as_str())
        .collect();
    written.sort_unstable();
    written.dedup();
    let mut read: Vec<&str> = applying
        .iter()
        .map(|unit| unit.run.as_str())
        .filter(|run| written.binary_search(run).is_err())
        .collect();
    read.sort_unstable();
    read.dedup();
    let failed = AtomicBool::new(false);
    let begin = async { Ok::<_, Failure>(client.batch_execute("BEGIN").await?) };
    let lock = async {
        Ok::<_, Failure>(match written.as_slice() {
            [] => Vec::new(),
            [run] => client.query(&statements[LOCK_RUN], &[run]).await?,
            runs => client.query(&statements[LOCK_RUNS], &[&runs]).await?,
        })
    };
    let cancels = async {
        Ok::<_, Failure>(if read.is_empty() {
            Vec::new()
        } else {
            client.query(&statements[CANCELS], &[&read]).await?
        })
    };
    let renew = async {
        if fences.is_empty() {
            return Ok::<_, Failure>(());
        }
        client
            .query(
                &statements[RENEW_TASKS],
                &[
                    &fenced_runs,
                    &fenced_steps,
                    &tokens,
                    &untils,
                    &now,
                    &expected,
                ],
            )
            .await?;
        Ok(())
    };
    let sent = applying
        .iter()
        .flat_map(|unit| unit.ops.iter())
        .map(|op| send(client, &statements[op.sql], op, &failed))
        .collect::<Vec<_>>();
    let ops = futures_util::future::try_join_all(sent);
    // The server applies the commit after the statements, and only when none failed: a statement that
    // fails ends the transaction, and its commit is a rollback. One that could not be sent at all
    // (checked here, after every statement was first polled, so sent or not) stops the commit.
    let commit = async {
        if failed.load(Ordering::SeqCst) {
            return Err(Failure::Store(StoreError::new(
                "a statement of the transaction could not be sent",
            )));
        }
        Ok(client.batch_execute("COMMIT").await?)
    };
    // Once the commit is applied, whoever follows the store looks again (`bump`).
    let bumped = async {
        if !written.is_empty() {
            let _ = client.query(&statements[BUMP], &[]).await;
        }
        Ok::<_, Failure>(())
    };
    let ((_, lock_rows, cancel_rows, _), (rows, _, _)) = futures_util::future::try_join(
        futures_util::future::try_join4(begin, lock, cancels, renew),
        futures_util::future::try_join3(ops, commit, bumped),
    )
    .await
    .map_err(|e| {
        // A statement the server refused was not applied, nor the commit behind it; a connection that
        // failed may have failed after the commit was applied.
        let committing = matches!(&e, Failure::Pg(e) if e.as_db_error().is_none());
        (e, committing)
    })?;
    let cancels: HashMap<String, bool> = lock_rows
        .iter()
        .chain(&cancel_rows)
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut rows = rows.into_iter();
    Ok(units
        .iter()
        .zip(holds)
        .map(|(unit, holds)| {
            if *holds {
                Reply::Applied {
                    cancel_requested: cancels.get(&unit.run).copied().unwrap_or(false),
                    rows: rows.by_ref().take(unit.ops.len()).collect(),
                }
            } else {
                Reply::Fenced
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::testing::{connect, drop_schema, store};

    const EVENT: &str = "INSERT INTO events (run_id, seq, at, event, format)
        SELECT $1, COALESCE(MAX(seq), 0) + 1, 0, $2, 1 FROM events WHERE run_id = $1";

    fn unit(step: &str, token: &str, ops: Vec<Op>) -> Unit {
        Unit {
            fence: Some(Fence {
                run: "r".to_owned(),
                step: step.to_owned(),
                token: token.to_owned(),
                until: Some(i64::MAX - 1),
            }),
            run: "r".to_owned(),
            ops,
        }
    }

    fn event(text: &str) -> Op {
        Op {
            sql: EVENT,
            params: vec![Box::new("r".to_owned()), Box::new(text.to_owned())],
        }
    }

    fn what(reply: &Reply) -> String {
        match reply {
            Reply::Applied { .. } => "applied".to_owned(),
            Reply::Fenced => "fenced".to_owned(),
            Reply::Failed {
                error,
                retryable,
                committing,
            } => format!(
                "failed ({}, retryable {retryable}, committing {committing})",
                error.message
            ),
        }
    }

    /// The run's events, each as its number and text.
    async fn events(client: &deadpool_postgres::Object) -> Vec<String> {
        client
            .query("SELECT seq || ' ' || event FROM events ORDER BY seq", &[])
            .await
            .expect("events")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Applies `units` as one batch; gives what became of each.
    async fn applied(inner: &Inner, units: Vec<Unit>) -> Vec<String> {
        let mut waiting = Vec::new();
        let mut replied = Vec::new();
        for unit in units {
            let (reply, heard) = oneshot::channel();
            waiting.push((unit, reply));
            replied.push(heard);
        }
        apply(inner, waiting).await;
        let mut replies = Vec::new();
        for heard in replied {
            replies.push(what(&heard.await.expect("a reply")).replace(&inner.shown, "URL"));
        }
        replies
    }

    /// Returns once a transaction waits for one of session `holder`'s (fails after 30 s).
    async fn waits_for(client: &deadpool_postgres::Object, holder: i32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let waiting: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_locks w JOIN pg_locks h
                        ON h.locktype = 'transactionid' AND h.transactionid = w.transactionid
                        AND h.granted AND h.pid = $1
                     WHERE NOT w.granted AND w.locktype = 'transactionid'",
                    &[&holder],
                )
                .await
                .expect("locks")
                .get(0);
            if waiting > 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no transaction waited for the other writer"
            );
            tokio::task::yield_now().await;
        }
    }

    const RUN_AND_TASKS: &str =
        "INSERT INTO runs (id, workflow, spec_path, spec_hash, status, inputs,
            workdir, max_parallel, started_at, format)
        VALUES ('r', 'w', 'w.yaml', '', 'running', '{}', '/', 4, 0, 1);
        INSERT INTO tasks (run_id, step, state, ready_at, token, lease_until)
        VALUES ('r', 'a', 'claimed', 0, 'ta', 4000000000000),
            ('r', 'b', 'claimed', 0, 'tb', 4000000000000),
            ('r', 'c', 'claimed', 0, 'tc', 4000000000000),
            ('r', 'd', 'claimed', 0, 'td', 1),
            ('r', 'e', 'claimed', 0, 'te', 4000000000000),
            ('r', 'f', 'claimed', 0, 'tf', 1)";

    /// While another transaction writes a run's records (it holds the run's row, as a committer of
    /// another worker does), a step's lease is renewed without waiting for it, and a write of the run's
    /// records waits, then goes on once that transaction commits.
    #[test]
    fn a_renewal_does_not_wait_for_the_writers_of_its_run_and_a_write_does() {
        let Some((store, schema)) = store() else {
            return;
        };
        let inner = store.inner.clone();
        let within = schema.clone();
        let (renewed, written, events) = super::super::runtime()
            .expect("runtime")
            .block_on(async move {
                let schema = within;
                let client = inner.client().await.expect("connection");
                client.batch_execute(RUN_AND_TASKS).await.expect("run and tasks");
                let mut other = connect(&schema).await;
                let writer = other.transaction().await.expect("a transaction");
                writer
                    .batch_execute(
                        "SELECT 1 FROM runs WHERE id = 'r' FOR NO KEY UPDATE;
                         INSERT INTO events (run_id, seq, at, event, format) VALUES ('r', 1, 0, 'other', 1)",
                    )
                    .await
                    .expect("the other writer's");
                let other_pid: i32 = writer
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await
                    .expect("its session")
                    .get(0);
                // Would wait for the other transaction, which commits only after.
                let renewed = tokio::time::timeout(
                    std::time::Duration::from_secs(30),
                    applied(&inner, vec![unit("a", "ta", Vec::new())]),
                )
                .await
                .expect("the renewal waited for the other writer");
                let write = tokio::spawn({
                    let inner = inner.clone();
                    async move { applied(&inner, vec![unit("b", "tb", vec![event("b")])]).await }
                });
                // The write waits for the other transaction: the server says so.
                waits_for(&client, other_pid).await;
                writer.commit().await.expect("the other writer commits");
                let written = write.await.expect("the write");
                let events = events(&client).await;
                (renewed, written, events)
            });
        assert_eq!(renewed, ["applied"]);
        assert_eq!(written, ["applied"]);
        // Numbered after the other writer's.
        assert_eq!(events, ["1 other", "2 b"]);
        drop(store);
        drop_schema(&schema);
    }

    #[test]
    fn one_transaction_applies_the_units_that_hold_and_a_failing_unit_fails_only_itself() {
        let Some((store, schema)) = store() else {
            return;
        };
        let inner = store.inner.clone();
        let (replies, events, leases) =
            super::super::runtime()
                .expect("runtime")
                .block_on(async move {
                    let client = inner.client().await.expect("connection");
                    client
                        .batch_execute(RUN_AND_TASKS)
                        .await
                        .expect("run and tasks");
                    let units = vec![
                        unit("a", "ta", vec![event("a1"), event("a2")]),
                        // Another worker holds `b` now.
                        unit("b", "not b's", vec![event("b")]),
                        // The statement fails: the transaction all four shared is given up.
                        unit(
                            "c",
                            "tc",
                            vec![Op {
                                sql: "SELECT 1 / $1::int",
                                params: vec![Box::new(0_i32)],
                            }],
                        ),
                        // The lease lapsed.
                        unit("d", "td", vec![event("d")]),
                        // Checked, not renewed.
                        Unit {
                            fence: Some(Fence {
                                until: None,
                                ..unit("e", "te", Vec::new()).fence.expect("a fence")
                            }),
                            ..unit("e", "te", vec![event("e")])
                        },
                        // Checked: the lease lapsed.
                        Unit {
                            fence: Some(Fence {
                                until: None,
                                ..unit("f", "tf", Vec::new()).fence.expect("a fence")
                            }),
                            ..unit("f", "tf", vec![event("f")])
                        },
                    ];
                    let replies = applied(&inner, units).await;
                    let events = events(&client).await;
                    let leases: Vec<String> = client
                        .query(
                            "SELECT step || ' ' || lease_until FROM tasks ORDER BY step",
                            &[],
                        )
                        .await
                        .expect("tasks")
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                    (replies, events, leases)
                });
        assert_eq!(
            replies,
            [
                "applied",
                "fenced",
                "failed (run store `URL`: division by zero, retryable false, committing false)",
                "fenced",
                "applied",
                "fenced",
            ]
        );
        // Numbered by the server, in order; nothing of the units that did not hold.
        assert_eq!(events, ["1 a1", "2 a2", "3 e"]);
        // Only the leases that held were renewed.
        assert_eq!(
            leases,
            [
                "a 9223372036854775806",
                "b 4000000000000",
                "c 4000000000000",
                "d 1",
                "e 4000000000000",
                "f 1"
            ]
        );
        drop(store);
        drop_schema(&schema);
    }

    /// Run `s`, with claimed tasks `g` and `h`, beside run `r` of [`RUN_AND_TASKS`].
    const OTHER_RUN: &str = "INSERT INTO runs (id, workflow, spec_path, spec_hash, status, inputs,
            workdir, max_parallel, started_at, format)
        VALUES ('s', 'w', 'w.yaml', '', 'running', '{}', '/', 4, 0, 1);
        INSERT INTO tasks (run_id, step, state, ready_at, token, lease_until)
        VALUES ('s', 'g', 'claimed', 0, 'tg', 4000000000000),
            ('s', 'h', 'claimed', 0, 'th', 4000000000000)";

    /// A unit of run `s` writing event `text`, fenced by `step`.
    fn unit_of_s(step: &str, token: &str, text: &str) -> Unit {
        Unit {
            fence: Some(Fence {
                run: "s".to_owned(),
                ..unit(step, token, Vec::new()).fence.expect("a fence")
            }),
            run: "s".to_owned(),
            ops: vec![Op {
                sql: EVENT,
                params: vec![Box::new("s".to_owned()), Box::new(text.to_owned())],
            }],
        }
    }

    /// What became of the units whose replies come to `replied`, once it is known.
    async fn heard(replied: Vec<oneshot::Receiver<Reply>>) -> Vec<String> {
        let mut replies = Vec::new();
        for reply in replied {
            replies.push(what(&reply.await.expect("a reply")));
        }
        replies
    }

    /// Hands `units` to `committer` at once, in order; gives where each one's reply comes.
    fn hand(committer: &Committer, units: Vec<Unit>) -> Vec<oneshot::Receiver<Reply>> {
        units
            .into_iter()
            .map(|unit| {
                let (reply, replied) = oneshot::channel();
                committer.sender.send((unit, reply)).expect("committers");
                replied
            })
            .collect()
    }

    /// Session `other` holds run `r`'s row (as a committer of another worker would), so that a
    /// transaction writing `r` waits; returns the transaction's client and the session's process.
    async fn hold_r(schema: &str) -> (tokio_postgres::Client, i32) {
        let other = connect(schema).await;
        other
            .batch_execute("BEGIN; SELECT 1 FROM runs WHERE id = 'r' FOR NO KEY UPDATE")
            .await
            .expect("run `r` held");
        let pid: i32 = other
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("its session")
            .get(0);
        (other, pid)
    }

    /// The transaction (`xmin`) that wrote each event, numbered in the order of their ids, which the
    /// server gives a transaction at its first write or row lock (not at `BEGIN`): `1 a` then `2 g`, and
    /// event `g` was written by a transaction that took no lock before `a`'s had written.
    async fn writers(client: &deadpool_postgres::Object) -> Vec<String> {
        client
            .query(
                "SELECT dense_rank() OVER (ORDER BY xmin::text::bigint) || ' ' || event
                 FROM events ORDER BY xmin::text::bigint, event",
                &[],
            )
            .await
            .expect("events")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Committers whose transaction for unit `a` of run `r` waits for session `other`, which holds the
    /// run's row (commit it to let the unit go), with where `a`'s reply comes and a connection.
    struct Stuck {
        committer: Committer,
        other: tokio_postgres::Client,
        first: Vec<oneshot::Receiver<Reply>>,
        client: deadpool_postgres::Object,
    }

    /// Runs `r` and `s` in the store's schema, committers that wait `overtake` at most for each other,
    /// and unit `a` of run `r` handed to them and waiting for session `other`.
    async fn stuck(inner: &Arc<Inner>, schema: &str, overtake: std::time::Duration) -> Stuck {
        let client = inner.client().await.expect("connection");
        client.batch_execute(RUN_AND_TASKS).await.expect("run r");
        client.batch_execute(OTHER_RUN).await.expect("run s");
        let committer = Committer::spawn_with(Arc::downgrade(inner), overtake);
        let (other, pid) = hold_r(schema).await;
        let first = hand(&committer, vec![unit("a", "ta", vec![event("a")])]);
        waits_for(&client, pid).await;
        Stuck {
            committer,
            other,
            first,
            client,
        }
    }

    /// While one committer's transaction is under way, the units that come wait for its end, and one
    /// transaction then applies all of them.
    #[test]
    fn units_that_come_while_a_transaction_is_under_way_wait_for_it_and_go_together() {
        let Some((store, schema)) = store() else {
            return;
        };
        let inner = store.inner.clone();
        let within = schema.clone();
        let (replies, writers) = super::super::runtime()
            .expect("runtime")
            .block_on(async move {
                // Long enough that only the other transaction's end lets them go.
                let Stuck {
                    committer,
                    other,
                    first,
                    client,
                } = stuck(&inner, &within, std::time::Duration::from_secs(3600)).await;
                // Run `s` is free, but `a`'s transaction is under way.
                let then = hand(
                    &committer,
                    vec![unit_of_s("g", "tg", "g"), unit_of_s("h", "th", "h")],
                );
                other.batch_execute("COMMIT").await.expect("released");
                let mut replies = heard(first).await;
                replies.extend(
                    tokio::time::timeout(std::time::Duration::from_secs(30), heard(then))
                        .await
                        .expect("the units that waited were never applied"),
                );
                (replies, writers(&client).await)
            });
        assert_eq!(replies, ["applied", "applied", "applied"]);
        assert_eq!(writers, ["1 a", "2 g", "2 h"]);
        drop(store);
        drop_schema(&schema);
    }

    /// A transaction that waits (here for a lock another worker holds) holds up the units that come
    /// after it for a moment only: the other committer applies them while it still waits.
    #[test]
    fn a_transaction_that_waits_does_not_hold_up_the_units_after_it() {
        let Some((store, schema)) = store() else {
            return;
        };
        let inner = store.inner.clone();
        let within = schema.clone();
        let (replies, writers) = super::super::runtime()
            .expect("runtime")
            .block_on(async move {
                let Stuck {
                    committer,
                    other,
                    first,
                    client,
                } = stuck(&inner, &within, std::time::Duration::from_millis(50)).await;
                let then = hand(&committer, vec![unit_of_s("g", "tg", "g")]);
                // Applied while `a`'s transaction still waits.
                let mut replies =
                    tokio::time::timeout(std::time::Duration::from_secs(30), heard(then))
                        .await
                        .expect("run `s`'s unit waited for the transaction of run `r`");
                other.batch_execute("COMMIT").await.expect("released");
                replies.extend(heard(first).await);
                (replies, writers(&client).await)
            });
        assert_eq!(replies, ["applied", "applied"]);
        // `g`'s transaction wrote first: `a`'s had not written yet.
        assert_eq!(writers, ["1 g", "2 a"]);
        drop(store);
        drop_schema(&schema);
    }
}
