//! Long-term memory in the run store's database: [`crate::run::memory::MemoryStore`] on PostgreSQL, so
//! that agents on every host that shares the store share their memories. One `memories` table holds what
//! the SQLite store keeps in memory files, `file` (the spec's `memory.path`, normalised) keeping the
//! records of different files apart, with the same guarantees: records are append-only, a duplicate of a
//! live record is not written, a superseded or forgotten one is kept. Writes to one namespace of one file
//! hold an advisory lock until they commit, so that two hosts remembering the same fact at once write it
//! once.
//!
//! Full-text recall uses PostgreSQL's own: `search` is `to_tsvector('english', content)` (a generated
//! column with a GIN index: stemmed like the SQLite store's `porter` tokenizer, stop words left out), and a
//! query is any of its words (`'w1' | 'w2' | ...`, each quoted, at most 64, so that nothing in it is
//! query syntax), ranked by `ts_rank_cd` with the length normalised (`1`), as BM25 weighs short records
//! up. A query none of whose words the index keeps (no words, or stop words only) gives the latest
//! records. Embeddings are `REAL[]`, ranked by cosine here and fused by reciprocal rank fusion, as on
//! SQLite.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::Arc;

use deadpool_postgres::GenericClient;
use futures_util::TryStreamExt;
use tokio_postgres::types::ToSql;

use super::store::{now_ms, query_words};
use super::{Kind, Memory, MemoryError, Namespace, NewMemory, Recall, Written, cosine, fuse};
use crate::store::postgres::{Failure, Inner, PostgresStore};

/// The columns [`read`] reads, in its order.
const COLUMNS: &str = "id, namespace, kind, agent, run, step, content, created_ms, supersedes, \
                       superseded_by, forgotten_ms, forgotten_reason";

/// The advisory lock a write to one namespace of one memory file holds: "ARCM", and the file and
/// namespace hashed.
const LOCK: &str = "SELECT pg_advisory_xact_lock(1095910221, hashtext($1))";

/// The text-search configuration of `search` and of queries.
const CONFIG: &str = "english";

/// The records of one memory file in a PostgreSQL run store.
#[derive(Debug)]
pub(super) struct PostgresMemory {
    store: PostgresStore,
    file: String,
}

/// What a call on the store's runtime gives: the memory's own outcome, or the database's failure.
type Outcome<T> = Result<Result<T, MemoryError>, Failure>;

/// A record to write, owned (for the store's runtime).
struct Owned {
    namespace: String,
    kind: Kind,
    agent: Option<String>,
    run: Option<String>,
    step: Option<String>,
    content: String,
    hash: String,
    supersedes: Option<i64>,
    run_scoped: bool,
    embedding: Option<(String, Vec<f32>)>,
}

impl PostgresMemory {
    pub(crate) fn new(store: PostgresStore, file: String) -> PostgresMemory {
        PostgresMemory { store, file }
    }

    /// Runs `work` (given the store and the file's key) on the store's runtime, and waits for it.
    fn call<T, F>(&self, work: impl FnOnce(Arc<Inner>, String) -> F) -> Result<T, MemoryError>
    where
        T: Send + 'static,
        F: Future<Output = Outcome<T>> + Send + 'static,
    {
        let file = self.file.clone();
        self.store
            .call(move |inner| work(inner, file))
            .map_err(MemoryError::Store)?
    }

    /// Writes a record (its text trimmed to `content`, with its `hash`): see
    /// [`crate::run::memory::MemoryStore::write`].
    pub fn write(
        &self,
        new: &NewMemory<'_>,
        content: &str,
        hash: &str,
    ) -> Result<Written, MemoryError> {
        let new = Owned {
            namespace: new.namespace.to_owned(),
            kind: new.kind,
            agent: new.agent.map(str::to_owned),
            run: new.run.map(str::to_owned),
            step: new.step.map(str::to_owned),
            content: content.to_owned(),
            hash: hash.to_owned(),
            supersedes: new.supersedes,
            run_scoped: new.run_scoped,
            embedding: new
                .embedding
                .as_ref()
                .map(|(m, v)| ((*m).to_owned(), v.clone())),
        };
        self.call(move |inner, file| async move {
            let mut client = inner.client().await?;
            let tx = client.transaction().await?;
            tx.execute(LOCK, &[&format!("{file}\n{}", new.namespace)])
                .await?;
            if let Some(old) = new.supersedes {
                let Some(found) = get(&tx, &file, old).await? else {
                    return Ok(Err(MemoryError::NotFound(old)));
                };
                if found.namespace != new.namespace {
                    return Ok(Err(MemoryError::OtherNamespace {
                        id: old,
                        namespace: found.namespace,
                    }));
                }
                if found.forgotten_ms.is_some() {
                    return Ok(Err(MemoryError::Forgotten { id: old }));
                }
                if let Some(by) = found.superseded_by {
                    return Ok(Err(MemoryError::Superseded { id: old, by }));
                }
            }
            let scoped_run = new.run.as_deref().filter(|_| new.run_scoped);
            let duplicate: Option<i64> = tx
                .query_opt(
                    "SELECT id FROM memories
                     WHERE file = $1 AND namespace = $2 AND kind = $3 AND hash = $4
                       AND coalesce(agent, '') = $5 AND ($6::text IS NULL OR run = $6::text)
                       AND superseded_by IS NULL AND forgotten_ms IS NULL
                     ORDER BY id LIMIT 1",
                    &[
                        &file,
                        &new.namespace,
                        &new.kind.as_str(),
                        &new.hash,
                        &new.agent.as_deref().unwrap_or(""),
                        &scoped_run,
                    ],
                )
                .await?
                .map(|row| row.get(0));
            let written = match duplicate {
                Some(id) if Some(id) == new.supersedes => Written::Duplicate(id),
                Some(id) => {
                    if let Some(old) = new.supersedes {
                        tx.execute(
                            "UPDATE memories SET superseded_by = $1 WHERE id = $2",
                            &[&id, &old],
                        )
                        .await?;
                    }
                    Written::Duplicate(id)
                }
                None => {
                    let (model, vector) = match new.embedding {
                        Some((model, vector)) => (Some(model), Some(vector)),
                        None => (None, None),
                    };
                    let id: i64 = tx
                        .query_one(
                            "INSERT INTO memories (file, namespace, kind, agent, run, step, content, hash,
                                                   created_ms, supersedes, embedding, embedding_model)
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                             RETURNING id",
                            &[
                                &file,
                                &new.namespace,
                                &new.kind.as_str(),
                                &new.agent,
                                &new.run,
                                &new.step,
                                &new.content,
                                &new.hash,
                                &now_ms(),
                                &new.supersedes,
                                &vector,
                                &model,
                            ],
                        )
                        .await?
                        .get(0);
                    if let Some(old) = new.supersedes {
                        tx.execute(
                            "UPDATE memories SET superseded_by = $1 WHERE id = $2",
                            &[&id, &old],
                        )
                        .await?;
                    }
                    Written::New(id)
                }
            };
            tx.commit().await?;
            Ok(Ok(written))
        })
    }

    /// The records of `recall.kinds` in its namespace best matching its query, best first.
    pub fn recall(&self, recall: &Recall<'_>) -> Result<Vec<Memory>, MemoryError> {
        let kinds: Vec<String> = recall.kinds.iter().map(|k| k.as_str().to_owned()).collect();
        // Enough candidates that the excluded ones cannot crowd out the rest.
        let wanted = recall.limit + recall.exclude.len();
        let wanted_sql = i64::try_from(wanted).unwrap_or(i64::MAX);
        let words: Vec<String> = query_words(recall.query)
            .map(|w| format!("'{w}'"))
            .collect();
        let query = (!words.is_empty()).then(|| words.join(" | "));
        let namespace = recall.namespace.to_owned();
        let superseded = recall.superseded;
        let exclude = recall.exclude.clone();
        let limit = recall.limit;
        let embedding = recall
            .embedding
            .map(|(model, vector)| (model.to_owned(), vector.to_vec()));
        self.call(move |inner, file| async move {
            let client = inner.client().await?;
            let live = "m.file = $1 AND m.namespace = $2 AND m.kind = ANY($3) \
                        AND m.forgotten_ms IS NULL AND ($4 OR m.superseded_by IS NULL)";
            let base: [&(dyn ToSql + Sync); 4] = [&file, &namespace, &kinds, &superseded];
            // Whether the index keeps any of the query's words (stop words it does not).
            let indexed = match &query {
                Some(query) => client
                    .query_one(
                        &format!("SELECT numnode(to_tsquery('{CONFIG}', $1)) > 0"),
                        &[query],
                    )
                    .await?
                    .get(0),
                None => false,
            };
            let by_text: Vec<i64> = match query.as_ref().filter(|_| indexed) {
                Some(query) => client
                    .query(
                        &format!(
                            "SELECT m.id FROM memories m, to_tsquery('{CONFIG}', $5) q
                             WHERE {live} AND m.search @@ q
                             ORDER BY ts_rank_cd(m.search, q, 1) DESC, m.id LIMIT $6"
                        ),
                        &[base[0], base[1], base[2], base[3], query, &wanted_sql],
                    )
                    .await?
                    .iter()
                    .map(|row| row.get(0))
                    .collect(),
                None => client
                    .query(
                        &format!(
                            "SELECT m.id FROM memories m WHERE {live} ORDER BY m.id DESC LIMIT $5"
                        ),
                        &[base[0], base[1], base[2], base[3], &wanted_sql],
                    )
                    .await?
                    .iter()
                    .map(|row| row.get(0))
                    .collect(),
            };
            let ranked = match &embedding {
                Some((model, wanted_vector)) => {
                    let params: [&(dyn ToSql + Sync); 5] =
                        [base[0], base[1], base[2], base[3], model];
                    let rows = client
                        .query_raw(
                            &format!(
                                "SELECT m.id, m.embedding FROM memories m
                                 WHERE {live} AND m.embedding_model = $5 AND m.embedding IS NOT NULL"
                            ),
                            params,
                        )
                        .await?;
                    let mut rows = pin!(rows);
                    let mut scored: Vec<(f32, i64)> = Vec::new();
                    while let Some(row) = rows.try_next().await? {
                        let id: i64 = row.get(0);
                        let vector: Vec<f32> = row.get(1);
                        scored.push((cosine(wanted_vector, &vector), id));
                        // Keeps the best `wanted` (sorted only when the list grows past twice that).
                        if scored.len() > 2 * wanted.max(1) {
                            scored.sort_by(|a, b| b.0.total_cmp(&a.0));
                            scored.truncate(wanted);
                        }
                    }
                    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
                    scored.truncate(wanted);
                    let by_vector: Vec<i64> = scored.into_iter().map(|(_, id)| id).collect();
                    fuse(&[by_text, by_vector])
                }
                None => by_text,
            };
            let chosen: Vec<i64> = ranked
                .into_iter()
                .filter(|id| !exclude.contains(id))
                .take(limit)
                .collect();
            let rows = client
                .query(
                    &format!("SELECT {COLUMNS} FROM memories WHERE file = $1 AND id = ANY($2)"),
                    &[&file, &chosen],
                )
                .await?;
            let mut by_id: HashMap<i64, Memory> = rows
                .iter()
                .map(|row| {
                    let memory = read(row);
                    (memory.id, memory)
                })
                .collect();
            Ok(Ok(chosen
                .iter()
                .filter_map(|id| by_id.remove(id))
                .collect()))
        })
    }

    /// Marks record `id` forgotten (in `namespace`, when given): it is kept, and never recalled.
    pub fn forget(
        &self,
        namespace: Option<&str>,
        id: i64,
        reason: Option<&str>,
    ) -> Result<Memory, MemoryError> {
        let namespace = namespace.map(str::to_owned);
        let reason = reason.map(str::to_owned);
        self.call(move |inner, file| async move {
            let mut client = inner.client().await?;
            let tx = client.transaction().await?;
            let Some(found) = get(&tx, &file, id).await? else {
                return Ok(Err(MemoryError::NotFound(id)));
            };
            if namespace.as_ref().is_some_and(|n| *n != found.namespace) {
                // Another namespace's record is as good as unknown to this one.
                return Ok(Err(MemoryError::NotFound(id)));
            }
            tx.execute(LOCK, &[&format!("{file}\n{}", found.namespace)])
                .await?;
            let changed = tx
                .execute(
                    "UPDATE memories SET forgotten_ms = $1, forgotten_reason = $2
                     WHERE id = $3 AND forgotten_ms IS NULL",
                    &[&now_ms(), &reason, &id],
                )
                .await?;
            if changed == 0 {
                return Ok(Err(MemoryError::Forgotten { id }));
            }
            let forgotten = get(&tx, &file, id).await?;
            tx.commit().await?;
            Ok(forgotten.ok_or(MemoryError::NotFound(id)))
        })
    }

    /// Record `id`.
    pub fn get(&self, id: i64) -> Result<Option<Memory>, MemoryError> {
        self.call(move |inner, file| async move {
            let client = inner.client().await?;
            Ok(Ok(get(&client, &file, id).await?))
        })
    }

    /// The records of `namespace` (every namespace when `None`), oldest first: live ones only unless
    /// `all`.
    pub fn list(&self, namespace: Option<&str>, all: bool) -> Result<Vec<Memory>, MemoryError> {
        let namespace = namespace.map(str::to_owned);
        self.call(move |inner, file| async move {
            let client = inner.client().await?;
            let rows = client
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM memories
                         WHERE file = $1 AND ($2::text IS NULL OR namespace = $2::text)
                           AND ($3 OR (superseded_by IS NULL AND forgotten_ms IS NULL))
                         ORDER BY namespace COLLATE \"C\", id"
                    ),
                    &[&file, &namespace, &all],
                )
                .await?;
            Ok(Ok(rows.iter().map(read).collect()))
        })
    }

    /// Each namespace, with how many records it holds.
    pub fn namespaces(&self) -> Result<Vec<Namespace>, MemoryError> {
        self.call(move |inner, file| async move {
            let client = inner.client().await?;
            let rows = client
                .query(
                    "SELECT namespace,
                            count(*) FILTER (WHERE superseded_by IS NULL AND forgotten_ms IS NULL),
                            count(*)
                     FROM memories WHERE file = $1
                     GROUP BY namespace ORDER BY namespace COLLATE \"C\"",
                    &[&file],
                )
                .await?;
            Ok(Ok(rows
                .iter()
                .map(|row| Namespace {
                    name: row.get(0),
                    live: row.get(1),
                    total: row.get(2),
                })
                .collect()))
        })
    }

    /// The latest `limit` live notes of `agent` in `namespace` (of run `run` only, when given), oldest
    /// first.
    pub fn notes(
        &self,
        namespace: &str,
        agent: &str,
        run: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Memory>, MemoryError> {
        let (namespace, agent, run) = (
            namespace.to_owned(),
            agent.to_owned(),
            run.map(str::to_owned),
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(move |inner, file| async move {
            let client = inner.client().await?;
            let rows = client
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM memories
                         WHERE file = $1 AND namespace = $2 AND kind = 'note' AND agent = $3
                           AND ($4::text IS NULL OR run = $4::text) AND forgotten_ms IS NULL
                           AND superseded_by IS NULL
                         ORDER BY id DESC LIMIT $5"
                    ),
                    &[&file, &namespace, &agent, &run, &limit],
                )
                .await?;
            let mut notes: Vec<Memory> = rows.iter().map(read).collect();
            notes.reverse();
            Ok(Ok(notes))
        })
    }

    /// Marks record `id` forgotten at `at` (an imported record that was), whatever it was.
    pub fn set_forgotten(&self, id: i64, at: i64, reason: Option<&str>) -> Result<(), MemoryError> {
        let reason = reason.map(str::to_owned);
        self.call(move |inner, file| async move {
            let client = inner.client().await?;
            client
                .execute(
                    "UPDATE memories SET forgotten_ms = $1, forgotten_reason = $2
                     WHERE id = $3 AND file = $4",
                    &[&at, &reason, &id, &file],
                )
                .await?;
            Ok(Ok(()))
        })
    }

    /// Links record `id` as superseded by record `by`, where neither link is set yet (imports).
    pub fn link(&self, id: i64, by: i64) -> Result<(), MemoryError> {
        self.call(move |inner, file| async move {
            let mut client = inner.client().await?;
            let tx = client.transaction().await?;
            tx.execute(
                "UPDATE memories SET superseded_by = $1
                 WHERE id = $2 AND file = $3 AND superseded_by IS NULL",
                &[&by, &id, &file],
            )
            .await?;
            tx.execute(
                "UPDATE memories SET supersedes = $1 WHERE id = $2 AND file = $3 AND supersedes IS NULL",
                &[&id, &by, &file],
            )
            .await?;
            tx.commit().await?;
            Ok(Ok(()))
        })
    }
}

/// Record `id` of memory file `file`.
async fn get(client: &impl GenericClient, file: &str, id: i64) -> Result<Option<Memory>, Failure> {
    let row = client
        .query_opt(
            &format!("SELECT {COLUMNS} FROM memories WHERE file = $1 AND id = $2"),
            &[&file, &id],
        )
        .await?;
    Ok(row.as_ref().map(read))
}

fn read(row: &tokio_postgres::Row) -> Memory {
    Memory {
        id: row.get(0),
        namespace: row.get(1),
        kind: Kind::parse(row.get(2)),
        agent: row.get(3),
        run: row.get(4),
        step: row.get(5),
        content: row.get(6),
        created_ms: row.get(7),
        supersedes: row.get(8),
        superseded_by: row.get(9),
        forgotten_ms: row.get(10),
        forgotten_reason: row.get(11),
    }
}
