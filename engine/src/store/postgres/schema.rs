//! The store's tables on PostgreSQL: an ordered list of migrations, applied on first use in one transaction
//! that holds an advisory lock (two processes starting together migrate once), the version applied kept in
//! `archon_schema_version`. Tables go into the connection's current schema (`search_path`).

use super::{Failure, Inner, Result};
use crate::store::StoreError;

/// The schema, one migration per version. Timestamps are milliseconds since the epoch (`BIGINT`);
/// records are the store's own versioned JSON text (`TEXT`, decoded as SQLite's are, with a `format`
/// column), large outputs `BYTEA` in `blobs`. `ord` columns keep the order rows were written in.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    spec_path TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    inputs TEXT NOT NULL,
    workdir TEXT NOT NULL,
    max_parallel BIGINT NOT NULL,
    started_at BIGINT NOT NULL,
    finished_at BIGINT,
    outputs TEXT,
    error TEXT,
    generation BIGINT NOT NULL DEFAULT 0,
    owner_pid BIGINT,
    owner_host TEXT,
    owner_started BIGINT,
    owner_token TEXT,
    lease_until BIGINT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    -- The owner serves several runs at once (`archon serve`): `cancel` never signals it.
    owner_serves BOOLEAN NOT NULL DEFAULT FALSE,
    format BIGINT NOT NULL
);
CREATE INDEX runs_by_start ON runs (started_at, id);
-- Run ids by prefix, in byte order whatever the database's collation.
CREATE INDEX runs_by_id ON runs (id COLLATE "C");
CREATE TABLE files (
    run_id TEXT NOT NULL REFERENCES runs (id),
    position BIGINT NOT NULL,
    path TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (run_id, position)
);
CREATE TABLE blobs (
    hash TEXT PRIMARY KEY,
    data BYTEA NOT NULL
);
CREATE TABLE attempts (
    run_id TEXT NOT NULL REFERENCES runs (id),
    step TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    generation BIGINT NOT NULL,
    fallback BOOLEAN NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    started_at BIGINT NOT NULL,
    ended_at BIGINT,
    pgid BIGINT,
    pgid_started BIGINT,
    -- Where the attempt ran: its process group means something on that host only.
    host TEXT,
    ord BIGSERIAL,
    PRIMARY KEY (run_id, step, attempt)
);
CREATE TABLE results (
    run_id TEXT NOT NULL REFERENCES runs (id),
    step TEXT NOT NULL,
    generation BIGINT NOT NULL,
    status TEXT NOT NULL,
    result TEXT NOT NULL,
    output_blob TEXT REFERENCES blobs (hash),
    text_blob TEXT REFERENCES blobs (hash),
    finished_at BIGINT NOT NULL,
    format BIGINT NOT NULL,
    ord BIGSERIAL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (id),
    seq BIGINT NOT NULL,
    at BIGINT NOT NULL,
    event TEXT NOT NULL,
    format BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE checkpoints (
    run_id TEXT NOT NULL REFERENCES runs (id),
    step TEXT NOT NULL,
    generation BIGINT NOT NULL,
    state TEXT NOT NULL,
    at BIGINT NOT NULL,
    format BIGINT NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE approvals (
    run_id TEXT NOT NULL REFERENCES runs (id),
    key TEXT NOT NULL,
    step TEXT NOT NULL,
    request TEXT NOT NULL,
    requested_at BIGINT NOT NULL,
    decision TEXT,
    decided_at BIGINT,
    format BIGINT NOT NULL,
    ord BIGSERIAL,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE logs (
    run_id TEXT NOT NULL REFERENCES runs (id),
    seq BIGINT NOT NULL,
    step TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    source TEXT NOT NULL,
    stream TEXT NOT NULL,
    text TEXT NOT NULL,
    at BIGINT NOT NULL,
    format BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX logs_by_step ON logs (run_id, step, attempt);
CREATE TABLE cache (
    key TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    step TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    result TEXT NOT NULL,
    output_blob TEXT,
    text_blob TEXT,
    size BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    format BIGINT NOT NULL
);
CREATE INDEX cache_by_workflow ON cache (workflow);
CREATE TABLE firings (
    workflow TEXT NOT NULL,
    trigger_name TEXT NOT NULL,
    slot TEXT NOT NULL,
    kind TEXT NOT NULL,
    slot_at BIGINT NOT NULL,
    fired_at BIGINT NOT NULL,
    run_id TEXT,
    outcome TEXT NOT NULL,
    reason TEXT,
    inputs TEXT NOT NULL,
    format BIGINT NOT NULL,
    ord BIGSERIAL,
    PRIMARY KEY (workflow, trigger_name, slot)
);
CREATE INDEX firings_by_run ON firings (run_id);
CREATE TABLE triggers (
    workflow TEXT NOT NULL,
    trigger_name TEXT NOT NULL,
    armed_at BIGINT NOT NULL,
    last_slot_at BIGINT,
    PRIMARY KEY (workflow, trigger_name)
);
CREATE SEQUENCE archon_changes;
"#,
    r#"
-- The steps of runs submitted to workers (`archon run --submit`, `archon worker`): one row per top-level
-- step once it is ready; `token` is the lease of the worker that claimed it, until `lease_until`.
CREATE TABLE tasks (
    run_id TEXT NOT NULL REFERENCES runs (id),
    step TEXT NOT NULL,
    state TEXT NOT NULL,
    token TEXT,
    lease_until BIGINT,
    worker TEXT,
    attempts BIGINT NOT NULL DEFAULT 0,
    ready_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE INDEX tasks_ready ON tasks (ready_at, run_id, step) WHERE state = 'ready';
CREATE INDEX tasks_claimed ON tasks (lease_until) WHERE state = 'claimed';
"#,
    r#"
-- A worker reads the results, attempts and checkpoints of one step and those it needs (with their
-- `foreach` items, `step[i]`), not the whole run's.
CREATE INDEX results_by_step ON results (run_id, split_part(step, '[', 1));
CREATE INDEX attempts_by_step ON attempts (run_id, split_part(step, '[', 1));
CREATE INDEX checkpoints_by_step ON checkpoints (run_id, split_part(step, '[', 1));
"#,
    r#"
-- Routing and limits: the labels a worker needs to run each step of a submitted run (`runs_on`), kept
-- for steps not yet ready in `step_labels` and copied onto the task when it becomes ready; the workflow's
-- limit on steps running at once across its runs (`concurrency`); the workers, alive while their
-- registration's lease (renewed every third of it) has not lapsed.
ALTER TABLE tasks ADD COLUMN labels TEXT[] NOT NULL DEFAULT '{}';
ALTER TABLE runs ADD COLUMN workflow_limit BIGINT;
CREATE TABLE step_labels (
    run_id TEXT NOT NULL REFERENCES runs (id),
    step TEXT NOT NULL,
    labels TEXT[] NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE workers (
    name TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    labels TEXT[] NOT NULL,
    concurrency BIGINT NOT NULL,
    global_limit BIGINT,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    lease_until BIGINT NOT NULL
);
-- A claim visits each running run and takes its oldest ready tasks: one index probe per run.
CREATE INDEX tasks_ready_by_run ON tasks (run_id, ready_at, step) WHERE state = 'ready';
CREATE INDEX runs_running ON runs (id) WHERE status = 'running';
-- Claims up to `lim` ready tasks for the registered worker `worker_name` (none when it is not
-- registered), leased until `until`. Claims take turns under an advisory lock ("ARCN" + 1, the schema's
-- name hashed), and the claim's snapshot is taken once the lock is held (a function's statements each take
-- one), so counting the steps running in a run, a workflow or everywhere and claiming within the limits
-- is one claim at a time. Only tasks whose labels are all the worker's; a run's tasks while fewer than
-- its `max_parallel` are claimed, a workflow's while fewer than its runs' `workflow_limit`, any while
-- fewer than the worker's `global_limit` run anywhere. Fair: a task's `run_rank` is its place in its
-- run's queue counting the run's running tasks first, the lowest first, so every run gets its share of
-- the workers in turn. Each running run is one probe of `tasks_ready_by_run`, reading at most `lim` rows.
CREATE FUNCTION archon_claim(lim BIGINT, worker_name TEXT, until BIGINT, owner TEXT)
RETURNS TABLE (run_id TEXT, step TEXT, token TEXT, attempts BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(1095910223, hashtext(current_schema()));
    RETURN QUERY
    WITH me AS (
        SELECT labels, global_limit FROM workers WHERE name = worker_name
    ),
    busy AS (
        SELECT t.run_id, r.workflow FROM tasks t JOIN runs r ON r.id = t.run_id WHERE t.state = 'claimed'
    ),
    open_runs AS (
        SELECT r.id, r.workflow, (SELECT count(*) FROM busy b WHERE b.run_id = r.id) AS run_busy,
            r.max_parallel - (SELECT count(*) FROM busy b WHERE b.run_id = r.id) AS run_room,
            r.workflow_limit - (SELECT count(*) FROM busy b WHERE b.workflow = r.workflow) AS workflow_room
        FROM runs r
        WHERE r.status = 'running' AND r.owner_host = owner AND NOT r.cancel_requested
    ),
    candidates AS (
        SELECT o.id AS run_id, o.workflow, o.workflow_room, c.step, c.ready_at,
            o.run_busy + row_number() OVER (PARTITION BY o.id ORDER BY c.ready_at, c.step) AS run_rank
        FROM open_runs o CROSS JOIN me CROSS JOIN LATERAL (
            SELECT t.step, t.ready_at FROM tasks t
            WHERE t.run_id = o.id AND t.state = 'ready' AND t.labels <@ me.labels
            ORDER BY t.ready_at, t.step
            LIMIT LEAST(lim, GREATEST(o.run_room, 0))
        ) c
    ),
    ranked AS (
        SELECT c.*, row_number() OVER (
            PARTITION BY c.workflow ORDER BY c.run_rank, c.ready_at, c.run_id, c.step) AS workflow_rank
        FROM candidates c
    ),
    picked AS (
        SELECT run_id, step FROM ranked
        WHERE workflow_room IS NULL OR workflow_rank <= workflow_room
        ORDER BY run_rank, ready_at, run_id, step
        LIMIT LEAST(lim, (SELECT CASE WHEN me.global_limit IS NULL THEN lim
            ELSE GREATEST(me.global_limit - (SELECT count(*) FROM busy), 0) END FROM me))
    )
    UPDATE tasks t SET state = 'claimed', token = worker_name || ':' || (t.attempts + 1),
        lease_until = until, worker = worker_name, attempts = t.attempts + 1
    FROM picked p WHERE t.run_id = p.run_id AND t.step = p.step AND t.state = 'ready'
    RETURNING t.run_id, t.step, t.token, t.attempts;
END
$claim$;
"#,
    r#"
-- Long-term memory of agents (`run/memory/postgres.rs`): what a memory file holds on the
-- SQLite store, `file` being the spec's `memory.path` (normalised) that keeps the memories of different
-- files apart. Append-only: `content` never changes. `search` is the text's lexemes (the `english`
-- configuration: stemmed, stop words left out) for full-text recall.
CREATE TABLE memories (
    id BIGSERIAL PRIMARY KEY,
    file TEXT NOT NULL,
    namespace TEXT NOT NULL,
    kind TEXT NOT NULL,
    agent TEXT,
    run TEXT,
    step TEXT,
    content TEXT NOT NULL,
    hash TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    supersedes BIGINT REFERENCES memories (id),
    superseded_by BIGINT REFERENCES memories (id),
    forgotten_ms BIGINT,
    forgotten_reason TEXT,
    embedding REAL[],
    embedding_model TEXT,
    search TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', content)) STORED
);
CREATE INDEX memories_by_hash ON memories (file, namespace, kind, hash);
CREATE INDEX memories_by_namespace ON memories (file, namespace, kind, id);
CREATE INDEX memories_search ON memories USING GIN (search);
"#,
    r#"
-- A worker's step finished, in one round trip (`tasks.rs`, `finish`): with the run's row locked (its
-- finishers take turns, each seeing what the one before marked done), the task still held by `tok`
-- is marked done and each dependent (`deps`: a JSON array of `{"step", "needs"}`) whose needs are all
-- done is made ready, unless the run was asked to stop; workers are notified when any became ready, and
-- the run rests `waiting_approval` when nothing of it is left to run but steps that wait for a person.
-- (That last statement is `settle` of tasks.rs.)
-- The outcome is `lost` (the task is no longer this worker's), `last` (every other step is done: the
-- caller ends the run; nothing is changed) or `done`, with the steps made ready.
CREATE FUNCTION archon_finish(p_run TEXT, p_step TEXT, p_token TEXT, p_steps BIGINT, p_deps TEXT,
    p_now BIGINT, p_owner TEXT)
RETURNS TABLE (outcome TEXT, made TEXT[])
LANGUAGE plpgsql VOLATILE AS $finish$
DECLARE
    v_cancelled BOOLEAN;
    v_done BIGINT;
    v_dep JSONB;
    v_needs TEXT[];
    v_made TEXT[] := '{}';
BEGIN
    SELECT r.cancel_requested INTO v_cancelled FROM runs r WHERE r.id = p_run FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::TEXT, v_made;
        RETURN;
    END IF;
    PERFORM 1 FROM tasks t
        WHERE t.run_id = p_run AND t.step = p_step AND t.token = p_token AND t.state = 'claimed';
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::TEXT, v_made;
        RETURN;
    END IF;
    SELECT count(*) INTO v_done FROM tasks t WHERE t.run_id = p_run AND t.state = 'done';
    IF v_done + 1 >= p_steps THEN
        RETURN QUERY SELECT 'last'::TEXT, v_made;
        RETURN;
    END IF;
    UPDATE tasks t SET state = 'done', lease_until = NULL WHERE t.run_id = p_run AND t.step = p_step;
    IF NOT v_cancelled THEN
        FOR v_dep IN SELECT jsonb_array_elements(p_deps::JSONB) LOOP
            v_needs := ARRAY(SELECT jsonb_array_elements_text(v_dep -> 'needs'));
            CONTINUE WHEN (SELECT count(*) FROM tasks t
                WHERE t.run_id = p_run AND t.step = ANY(v_needs) AND t.state = 'done') <> cardinality(v_needs);
            INSERT INTO tasks (run_id, step, state, ready_at, labels)
            VALUES (p_run, v_dep ->> 'step', 'ready', p_now, COALESCE(
                (SELECT l.labels FROM step_labels l WHERE l.run_id = p_run AND l.step = v_dep ->> 'step'),
                '{}'))
            ON CONFLICT (run_id, step) DO NOTHING;
            IF FOUND THEN
                v_made := v_made || (v_dep ->> 'step');
            END IF;
        END LOOP;
    END IF;
    IF cardinality(v_made) > 0 THEN
        PERFORM pg_notify('archon_work', current_schema());
    END IF;
    UPDATE runs r SET status = 'waiting_approval', finished_at = p_now, owner_pid = NULL,
        owner_host = NULL, lease_until = NULL, owner_started = NULL, owner_token = NULL
    WHERE r.id = p_run AND r.status = 'running' AND r.owner_host = p_owner AND NOT r.cancel_requested
        AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state = 'waiting')
        AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state IN ('ready', 'claimed'));
    RETURN QUERY SELECT 'done'::TEXT, v_made;
END
$finish$;
"#,
    r#"
-- The steps of submitted runs set aside for a person's approval: the reaper looks among them, every
-- second, for those whose requests' timeouts passed (`tasks.rs`, `release_expired`); none waiting, it
-- reads an empty index.
CREATE INDEX tasks_waiting ON tasks (run_id, step) WHERE state = 'waiting';
"#,
    r#"
-- `archon_finish` of migration 6, but it counts the run's done tasks (which grows with the run, so a
-- run's finishes took time quadratic in its size) only when no other task of the run is pending; the
-- index finds a run's claimed tasks.
CREATE INDEX tasks_claimed_by_run ON tasks (run_id, step) WHERE state = 'claimed';
CREATE OR REPLACE FUNCTION archon_finish(p_run TEXT, p_step TEXT, p_token TEXT, p_steps BIGINT, p_deps TEXT,
    p_now BIGINT, p_owner TEXT)
RETURNS TABLE (outcome TEXT, made TEXT[])
LANGUAGE plpgsql VOLATILE AS $finish$
DECLARE
    v_cancelled BOOLEAN;
    v_done BIGINT;
    v_dep JSONB;
    v_needs TEXT[];
    v_made TEXT[] := '{}';
BEGIN
    SELECT r.cancel_requested INTO v_cancelled FROM runs r WHERE r.id = p_run FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::TEXT, v_made;
        RETURN;
    END IF;
    PERFORM 1 FROM tasks t
        WHERE t.run_id = p_run AND t.step = p_step AND t.token = p_token AND t.state = 'claimed';
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::TEXT, v_made;
        RETURN;
    END IF;
    -- Counted only when no other task of the run is ready, claimed or waiting: one that is means this
    -- step is not the last, and the count reads every done task of the run.
    IF NOT (EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = p_run AND t.state = 'ready')
        OR EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = p_run AND t.state = 'claimed' AND t.step <> p_step)
        OR EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = p_run AND t.state = 'waiting')) THEN
        SELECT count(*) INTO v_done FROM tasks t WHERE t.run_id = p_run AND t.state = 'done';
        IF v_done + 1 >= p_steps THEN
            RETURN QUERY SELECT 'last'::TEXT, v_made;
            RETURN;
        END IF;
    END IF;
    UPDATE tasks t SET state = 'done', lease_until = NULL WHERE t.run_id = p_run AND t.step = p_step;
    IF NOT v_cancelled THEN
        FOR v_dep IN SELECT jsonb_array_elements(p_deps::JSONB) LOOP
            v_needs := ARRAY(SELECT jsonb_array_elements_text(v_dep -> 'needs'));
            CONTINUE WHEN (SELECT count(*) FROM tasks t
                WHERE t.run_id = p_run AND t.step = ANY(v_needs) AND t.state = 'done') <> cardinality(v_needs);
            INSERT INTO tasks (run_id, step, state, ready_at, labels)
            VALUES (p_run, v_dep ->> 'step', 'ready', p_now, COALESCE(
                (SELECT l.labels FROM step_labels l WHERE l.run_id = p_run AND l.step = v_dep ->> 'step'),
                '{}'))
            ON CONFLICT (run_id, step) DO NOTHING;
            IF FOUND THEN
                v_made := v_made || (v_dep ->> 'step');
            END IF;
        END LOOP;
    END IF;
    IF cardinality(v_made) > 0 THEN
        PERFORM pg_notify('archon_work', current_schema());
    END IF;
    UPDATE runs r SET status = 'waiting_approval', finished_at = p_now, owner_pid = NULL,
        owner_host = NULL, lease_until = NULL, owner_started = NULL, owner_token = NULL
    WHERE r.id = p_run AND r.status = 'running' AND r.owner_host = p_owner AND NOT r.cancel_requested
        AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state = 'waiting')
        AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state IN ('ready', 'claimed'));
    RETURN QUERY SELECT 'done'::TEXT, v_made;
END
$finish$;
"#,
    r#"
-- `archon_finish` of migration 8 locks the run's row `FOR NO KEY UPDATE`, as the committer of a
-- worker's writes does (`commit.rs`), not `FOR UPDATE`: finishes still take turns with each other and
-- with the run's other writers, but the key checks of other transactions' inserts of the run's records,
-- and the committers holding the runs whose tasks they renew, no longer wait for its commit. The body is
-- migration 8's with that lock alone changed.
DO $patch$
DECLARE
    v_before TEXT := pg_get_functiondef(
        'archon_finish(text, text, text, bigint, text, bigint, text)'::regprocedure);
    v_after TEXT := replace(v_before, 'WHERE r.id = p_run FOR UPDATE;',
        'WHERE r.id = p_run FOR NO KEY UPDATE;');
BEGIN
    IF v_after = v_before THEN
        RAISE EXCEPTION 'archon_finish does not lock its run as migration 8 wrote it';
    END IF;
    EXECUTE v_after;
END
$patch$;
-- Fails a worker's group commit (`commit.rs`) before any of its statements unless all `expected` tasks
-- that fence its writes held and were renewed.
CREATE FUNCTION archon_fences_hold(expected BIGINT, renewed BIGINT) RETURNS BOOLEAN
LANGUAGE plpgsql AS $fences$
BEGIN
    IF renewed <> expected THEN
        RAISE EXCEPTION 'a task''s lease no longer holds' USING ERRCODE = 'AR001';
    END IF;
    RETURN TRUE;
END
$fences$;
"#,
    r#"
-- How many of a submitted run's tasks are done, kept in a row of its own: `archon_finish` tells whether
-- its step is the run's last from it, rather than by looking for the run's other pending tasks. Those
-- reads walked the partial indexes of ready and claimed tasks, which keep an entry for every task that
-- left the state until the table is vacuumed: they grew with the run, and a run's finishes took time
-- quadratic in its size. Not a column of `runs`: a row updated on every finish leaves a version behind
-- each time, which every reader of the row then steps over (the key checks of every record a step
-- writes read the run's row).
CREATE TABLE run_progress (
    run_id TEXT PRIMARY KEY REFERENCES runs (id),
    tasks_done BIGINT NOT NULL
);
-- Counted by a trigger, whatever marks a task done (a finish, a worker's `complete`, the reaper), and
-- whichever archon wrote it: a worker of the previous version still finishing steps while this runs is
-- counted too. Creating the trigger waits for the transactions writing tasks and holds off new ones
-- until this commits, so the count below misses none.
CREATE FUNCTION archon_count_done() RETURNS TRIGGER
LANGUAGE plpgsql AS $count$
BEGIN
    INSERT INTO run_progress AS p (run_id, tasks_done) VALUES (NEW.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET tasks_done = p.tasks_done + 1;
    RETURN NULL;
END
$count$;
CREATE TRIGGER tasks_count_done AFTER UPDATE OF state ON tasks
    FOR EACH ROW WHEN (NEW.state = 'done' AND OLD.state <> 'done')
    EXECUTE FUNCTION archon_count_done();
INSERT INTO run_progress (run_id, tasks_done)
    SELECT run_id, count(*) FILTER (WHERE state = 'done') FROM tasks GROUP BY run_id;
-- `archon_finish` of migration 9, reading that count. The body is migration 9's, patched.
DO $patch$
DECLARE
    v_before TEXT := pg_get_functiondef(
        'archon_finish(text, text, text, bigint, text, bigint, text)'::regprocedure);
    v_after TEXT := replace(v_before,
        '    -- Counted only when no other task of the run is ready, claimed or waiting: one that is means this
    -- step is not the last, and the count reads every done task of the run.
    IF NOT (EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = p_run AND t.state = ''ready'')
        OR EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = p_run AND t.state = ''claimed'' AND t.step <> p_step)
        OR EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = p_run AND t.state = ''waiting'')) THEN
        SELECT count(*) INTO v_done FROM tasks t WHERE t.run_id = p_run AND t.state = ''done'';
        IF v_done + 1 >= p_steps THEN
            RETURN QUERY SELECT ''last''::TEXT, v_made;
            RETURN;
        END IF;
    END IF;',
        '    -- Every other step of the run is done (each has one task).
    v_done := COALESCE((SELECT p.tasks_done FROM run_progress p WHERE p.run_id = p_run), 0);
    IF v_done + 1 >= p_steps THEN
        RETURN QUERY SELECT ''last''::TEXT, v_made;
        RETURN;
    END IF;');
BEGIN
    IF v_after = v_before THEN
        RAISE EXCEPTION '`archon_finish` is not as migration 9 left it';
    END IF;
    EXECUTE v_after;
END
$patch$;
"#,
    r#"
-- A worker's step reads the cache entries of that step (and those of the sub-workflows it may call),
-- not every entry of its workflow (`queries.rs`, `step_cache_entries`): a large cached run's steps would
-- each read all of its entries. The index on the workflow alone is this one's prefix.
CREATE INDEX cache_by_step ON cache (workflow, step);
DROP INDEX cache_by_workflow;
"#,
    r#"
-- `archon_claim` of migration 4, its work no longer growing with the tasks claimed since the last vacuum,
-- nor planned anew on every call.
-- - A task that leaves `claimed` leaves its entry in `tasks_claimed` (and `tasks_claimed_by_run`) until
--   the table is vacuumed. Counting the claimed tasks by a bitmap scan (the planner's choice on a table
--   never analysed) read every such entry, and each task's row, on every claim: a run of 4,000 steps
--   read 3,500 entries and 110 pages of rows per claim near its end. A plain index scan marks the
--   entries of rows no transaction can see any more, and steps over marked entries without reading
--   their rows: bitmap scans are off within the function.
-- - The claimed tasks are updated by their rows' addresses (`ctid`), read in the claim's snapshot: the
--   planner looked them up by `tasks_ready_by_run`, whose order is not the step's, reading every entry
--   of the run for each. A row another transaction changed since (none claims while the lock is held;
--   the others only delete ready rows) is skipped, or claimed only if its latest version is still
--   ready: the state is checked again on it.
-- - The plan is generic: planned once per connection (and again once the tables are analysed or
--   altered), not for each call's values.
CREATE OR REPLACE FUNCTION archon_claim(lim BIGINT, worker_name TEXT, until BIGINT, owner TEXT)
RETURNS TABLE (run_id TEXT, step TEXT, token TEXT, attempts BIGINT)
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan
AS $claim$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(1095910223, hashtext(current_schema()));
    RETURN QUERY
    WITH me AS (
        SELECT labels, global_limit FROM workers WHERE name = worker_name
    ),
    busy AS (
        SELECT t.run_id, r.workflow FROM tasks t JOIN runs r ON r.id = t.run_id WHERE t.state = 'claimed'
    ),
    open_runs AS (
        SELECT r.id, r.workflow, (SELECT count(*) FROM busy b WHERE b.run_id = r.id) AS run_busy,
            r.max_parallel - (SELECT count(*) FROM busy b WHERE b.run_id = r.id) AS run_room,
            r.workflow_limit - (SELECT count(*) FROM busy b WHERE b.workflow = r.workflow) AS workflow_room
        FROM runs r
        WHERE r.status = 'running' AND r.owner_host = owner AND NOT r.cancel_requested
    ),
    candidates AS (
        SELECT o.id AS run_id, o.workflow, o.workflow_room, c.step, c.ready_at, c.tid,
            o.run_busy + row_number() OVER (PARTITION BY o.id ORDER BY c.ready_at, c.step) AS run_rank
        FROM open_runs o CROSS JOIN me CROSS JOIN LATERAL (
            SELECT t.step, t.ready_at, t.ctid AS tid FROM tasks t
            WHERE t.run_id = o.id AND t.state = 'ready' AND t.labels <@ me.labels
            ORDER BY t.ready_at, t.step
            LIMIT LEAST(lim, GREATEST(o.run_room, 0))
        ) c
    ),
    ranked AS (
        SELECT c.*, row_number() OVER (
            PARTITION BY c.workflow ORDER BY c.run_rank, c.ready_at, c.run_id, c.step) AS workflow_rank
        FROM candidates c
    ),
    picked AS (
        SELECT tid FROM ranked
        WHERE workflow_room IS NULL OR workflow_rank <= workflow_room
        ORDER BY run_rank, ready_at, run_id, step
        LIMIT LEAST(lim, (SELECT CASE WHEN me.global_limit IS NULL THEN lim
            ELSE GREATEST(me.global_limit - (SELECT count(*) FROM busy), 0) END FROM me))
    )
    UPDATE tasks t SET state = 'claimed', token = worker_name || ':' || (t.attempts + 1),
        lease_until = until, worker = worker_name, attempts = t.attempts + 1
    FROM picked p WHERE t.ctid = p.tid AND t.state = 'ready'
    RETURNING t.run_id, t.step, t.token, t.attempts;
END
$claim$;
"#,
    r#"
-- `archon_finish` of migration 10, in fewer statements: a worker runs it for every step it finishes,
-- and each statement of a function costs the server its own start and end, whatever it does. Migration
-- 10's ran eight for a step with no dependents; this one runs three (four when the run has steps that
-- wait for a person), and one for all of a step's dependents (not two or three for each). What it does
-- is unchanged:
-- - the first statement locks the run's row and reads whether the run was asked to stop; the next ones
--   start after the lock is held, so they see what the run's finishers before marked done, and every
--   task marked waiting for a person (`wait_approval` of tasks.rs locks the run's row first);
-- - the task is marked done only if it is still held by `p_token` and is not the run's last step (which
--   changes nothing: the caller ends the run), and the same statement reads whether any task waits;
-- - the dependents whose needs are all done are made ready in one statement;
-- - the run rests `waiting_approval` (as `settle` of tasks.rs would) only when some task waits.
CREATE OR REPLACE FUNCTION archon_finish(p_run TEXT, p_step TEXT, p_token TEXT, p_steps BIGINT, p_deps TEXT,
    p_now BIGINT, p_owner TEXT)
RETURNS TABLE (outcome TEXT, made TEXT[])
LANGUAGE plpgsql VOLATILE AS $finish$
DECLARE
    v_cancelled BOOLEAN;
    v_waiting BOOLEAN;
    v_made TEXT[] := '{}';
BEGIN
    SELECT r.cancel_requested INTO v_cancelled FROM runs r WHERE r.id = p_run FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'lost';
        made := v_made;
        RETURN NEXT;
        RETURN;
    END IF;
    -- Unless every other step of the run is done (each has one task).
    UPDATE tasks t SET state = 'done', lease_until = NULL
        WHERE t.run_id = p_run AND t.step = p_step AND t.token = p_token AND t.state = 'claimed'
            AND COALESCE((SELECT p.tasks_done FROM run_progress p WHERE p.run_id = p_run), 0) + 1 < p_steps
        RETURNING EXISTS (SELECT 1 FROM tasks w WHERE w.run_id = p_run AND w.state = 'waiting')
        INTO v_waiting;
    IF NOT FOUND THEN
        -- The run's last step, if the task is still this worker's: nothing is changed.
        PERFORM 1 FROM tasks t
            WHERE t.run_id = p_run AND t.step = p_step AND t.token = p_token AND t.state = 'claimed';
        outcome := CASE WHEN FOUND THEN 'last' ELSE 'lost' END;
        made := v_made;
        RETURN NEXT;
        RETURN;
    END IF;
    IF NOT v_cancelled AND jsonb_array_length(p_deps::JSONB) > 0 THEN
        WITH dep AS (
            SELECT d ->> 'step' AS step, ARRAY(SELECT jsonb_array_elements_text(d -> 'needs')) AS needs
            FROM jsonb_array_elements(p_deps::JSONB) AS d
        ),
        made_ready AS (
            INSERT INTO tasks (run_id, step, state, ready_at, labels)
            SELECT p_run, dep.step, 'ready', p_now, COALESCE(
                (SELECT l.labels FROM step_labels l WHERE l.run_id = p_run AND l.step = dep.step), '{}')
            FROM dep
            WHERE (SELECT count(*) FROM tasks t
                WHERE t.run_id = p_run AND t.step = ANY(dep.needs) AND t.state = 'done') = cardinality(dep.needs)
            ON CONFLICT (run_id, step) DO NOTHING
            RETURNING step
        )
        SELECT COALESCE(array_agg(made_ready.step), '{}') INTO v_made FROM made_ready;
        IF cardinality(v_made) > 0 THEN
            PERFORM pg_notify('archon_work', current_schema());
        END IF;
    END IF;
    IF v_waiting THEN
        UPDATE runs r SET status = 'waiting_approval', finished_at = p_now, owner_pid = NULL,
            owner_host = NULL, lease_until = NULL, owner_started = NULL, owner_token = NULL
        WHERE r.id = p_run AND r.status = 'running' AND r.owner_host = p_owner AND NOT r.cancel_requested
            AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state = 'waiting')
            AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state IN ('ready', 'claimed'));
    END IF;
    outcome := 'done';
    made := v_made;
    RETURN NEXT;
END
$finish$;
"#,
];

/// The tables whose rows belong to a run (by `run_id`), which `prune` deletes with it.
pub(super) const RUN_TABLES: &[&str] = &[
    "tasks",
    "run_progress",
    "step_labels",
    "files",
    "attempts",
    "results",
    "events",
    "checkpoints",
    "approvals",
    "logs",
];

/// The version of the schema this archon writes: one per migration.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// The advisory lock migrations hold: "ARCN", and the schema's name hashed (one lock per schema).
const LOCK: &str = "SELECT pg_advisory_xact_lock(1095910222, hashtext(current_schema()))";

/// Whether the store's tables exist in the current schema.
pub(super) async fn exists(inner: &Inner) -> Result<bool> {
    let client = inner.client().await?;
    let row = client
        .query_one(
            "SELECT to_regclass(quote_ident(current_schema()) || '.archon_schema_version') IS NOT NULL",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// The version applied, if the version table exists.
async fn version(client: &impl deadpool_postgres::GenericClient) -> Result<Option<i64>> {
    let present: bool = client
        .query_one(
            "SELECT to_regclass(quote_ident(current_schema()) || '.archon_schema_version') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    if !present {
        return Ok(None);
    }
    let row = client
        .query_opt("SELECT version FROM archon_schema_version", &[])
        .await?;
    Ok(Some(row.map_or(0, |r| r.get(0))))
}

fn too_new(inner: &Inner, version: i64) -> Failure {
    Failure::Store(
        StoreError::new(format!(
            "run store `{}` has schema version `{version}`, newer than this archon knows (`{SCHEMA_VERSION}`)",
            inner.shown
        ))
        .with_hint("use the archon version that wrote it, or a newer one"),
    )
}

/// The oldest PostgreSQL the migrations run on (`server_version_num`): 12, for generated columns
/// (migration 5) and `plan_cache_mode` (migration 12).
const OLDEST_SERVER: i64 = 120_000;

/// The refusal of a server older than [`OLDEST_SERVER`] (`None` for one as new or newer).
fn too_old(shown: &str, number: i64, version: &str) -> Option<StoreError> {
    (number < OLDEST_SERVER).then(|| {
        StoreError::new(format!(
            "run store `{shown}` is PostgreSQL `{version}`, older than archon supports"
        ))
        .with_hint("use PostgreSQL 12 or newer")
    })
}

/// Brings the schema up to date (under the advisory lock, from the version found once holding it).
pub(super) async fn migrate(inner: &Inner) -> Result<()> {
    let mut client = inner.client().await?;
    let latest = SCHEMA_VERSION as i64;
    match version(&client).await? {
        Some(v) if v == latest => return Ok(()),
        Some(v) if v > latest => return Err(too_new(inner, v)),
        _ => {}
    }
    let server = client
        .query_one(
            "SELECT current_setting('server_version_num')::bigint, current_setting('server_version')",
            &[],
        )
        .await?;
    if let Some(refused) = too_old(&inner.shown, server.get(0), server.get(1)) {
        return Err(Failure::Store(refused));
    }
    let schema: Option<String> = client
        .query_one("SELECT current_schema()", &[])
        .await?
        .get(0);
    if schema.is_none() {
        return Err(Failure::Store(
            StoreError::new(format!(
                "run store `{}` has no schema to create its tables in",
                inner.shown
            ))
            .with_hint("create the schema named by the connection's `search_path`, or connect to a database with `public`"),
        ));
    }
    let tx = client.transaction().await?;
    tx.execute(LOCK, &[]).await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS archon_schema_version (version BIGINT NOT NULL)")
        .await?;
    let found = version(&tx).await?.unwrap_or(0);
    if found > latest {
        return Err(too_new(inner, found));
    }
    for migration in MIGRATIONS.iter().skip(found as usize) {
        tx.batch_execute(migration).await?;
    }
    if found < latest {
        tx.execute("DELETE FROM archon_schema_version", &[]).await?;
        tx.execute(
            "INSERT INTO archon_schema_version (version) VALUES ($1)",
            &[&latest],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server too old for the migrations is refused before any is applied, naming its version.
    #[test]
    fn a_server_older_than_postgresql_12_is_refused_with_its_version() {
        let refused = too_old("postgres://h/db", 110_022, "11.22").map(|e| (e.message, e.hint));
        assert_eq!(
            refused,
            Some((
                "run store `postgres://h/db` is PostgreSQL `11.22`, older than archon supports"
                    .to_owned(),
                Some("use PostgreSQL 12 or newer".to_owned())
            ))
        );
        assert!(too_old("postgres://h/db", 120_000, "12.0").is_none());
    }
}
