//! The SQLite backend of [`super::MemoryStore`]: one file in the state directory, with an FTS5 index.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::store::{
    Kind, Memory, MemoryError, Namespace, NewMemory, Recall, Written, now_ms, query_words,
};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS memories (
    id INTEGER PRIMARY KEY,
    namespace TEXT NOT NULL,
    kind TEXT NOT NULL,
    agent TEXT,
    run TEXT,
    step TEXT,
    content TEXT NOT NULL,
    hash TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    supersedes INTEGER REFERENCES memories(id),
    superseded_by INTEGER REFERENCES memories(id),
    forgotten_ms INTEGER,
    forgotten_reason TEXT,
    embedding BLOB,
    embedding_model TEXT
);
CREATE INDEX IF NOT EXISTS memories_by_hash ON memories(namespace, kind, hash);
CREATE INDEX IF NOT EXISTS memories_by_namespace ON memories(namespace, kind, id);
CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(
    content, content='memories', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS memories_indexed AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts(rowid, content) VALUES (new.id, new.content);
END;
";

const COLUMNS: &str = "m.id, m.namespace, m.kind, m.agent, m.run, m.step, m.content, m.created_ms, \
                       m.supersedes, m.superseded_by, m.forgotten_ms, m.forgotten_reason";

/// One SQLite file, shared by the runs and the processes that open it (WAL).
#[derive(Debug)]
pub(super) struct SqliteMemory {
    path: PathBuf,
    connection: Mutex<Connection>,
}

impl SqliteMemory {
    /// Opens (creating when needed) the store at `path`.
    pub fn open(path: &Path) -> Result<SqliteMemory, MemoryError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| MemoryError::Open {
                path: path.to_owned(),
                message: e.to_string().to_lowercase(),
            })?;
        }
        let sqlite = |source| MemoryError::Sqlite {
            path: path.to_owned(),
            source,
        };
        let connection = Connection::open(path).map_err(sqlite)?;
        connection
            .busy_timeout(Duration::from_secs(10))
            .map_err(sqlite)?;
        connection
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(sqlite)?;
        connection
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(sqlite)?;
        connection.execute_batch(SCHEMA).map_err(sqlite)?;
        Ok(SqliteMemory {
            path: path.to_owned(),
            connection: Mutex::new(connection),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, MemoryError>,
    ) -> Result<T, MemoryError> {
        let mut connection = self
            .connection
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut connection)
    }

    fn sqlite(&self) -> impl Fn(rusqlite::Error) -> MemoryError + '_ {
        |source| MemoryError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Writes a record (its text trimmed to `content`, with its `hash`): see [`super::MemoryStore::write`].
    pub fn write(
        &self,
        new: &NewMemory<'_>,
        content: &str,
        hash: &str,
    ) -> Result<Written, MemoryError> {
        let sqlite = self.sqlite();
        self.with(|connection| {
            let tx = connection.transaction().map_err(&sqlite)?;
            if let Some(old) = new.supersedes {
                let found = get(&tx, old).map_err(&sqlite)?;
                let Some(found) = found else {
                    return Err(MemoryError::NotFound(old));
                };
                if found.namespace != new.namespace {
                    return Err(MemoryError::OtherNamespace {
                        id: old,
                        namespace: found.namespace,
                    });
                }
                if found.forgotten_ms.is_some() {
                    return Err(MemoryError::Forgotten { id: old });
                }
                if let Some(by) = found.superseded_by {
                    return Err(MemoryError::Superseded { id: old, by });
                }
            }
            let duplicate: Option<i64> = tx
                .query_row(
                    "SELECT id FROM memories
                     WHERE namespace = ?1 AND kind = ?2 AND hash = ?3 AND ifnull(agent, '') = ?4
                       AND (?5 IS NULL OR run = ?5)
                       AND superseded_by IS NULL AND forgotten_ms IS NULL
                     ORDER BY id LIMIT 1",
                    params![
                        new.namespace,
                        new.kind.as_str(),
                        hash,
                        new.agent.unwrap_or(""),
                        new.run.filter(|_| new.run_scoped),
                    ],
                    |row| row.get(0),
                )
                .optional()
                .map_err(&sqlite)?;
            let written = match duplicate {
                Some(id) if Some(id) == new.supersedes => Written::Duplicate(id),
                Some(id) => {
                    if let Some(old) = new.supersedes {
                        tx.execute(
                            "UPDATE memories SET superseded_by = ?1 WHERE id = ?2",
                            params![id, old],
                        )
                        .map_err(&sqlite)?;
                    }
                    Written::Duplicate(id)
                }
                None => {
                    let (model, vector) = match &new.embedding {
                        Some((model, vector)) => (Some(*model), Some(to_blob(vector))),
                        None => (None, None),
                    };
                    tx.execute(
                        "INSERT INTO memories (namespace, kind, agent, run, step, content, hash, created_ms,
                                               supersedes, embedding, embedding_model)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                        params![
                            new.namespace,
                            new.kind.as_str(),
                            new.agent,
                            new.run,
                            new.step,
                            content,
                            hash,
                            now_ms(),
                            new.supersedes,
                            vector,
                            model,
                        ],
                    )
                    .map_err(&sqlite)?;
                    let id = tx.last_insert_rowid();
                    if let Some(old) = new.supersedes {
                        tx.execute(
                            "UPDATE memories SET superseded_by = ?1 WHERE id = ?2",
                            params![id, old],
                        )
                        .map_err(&sqlite)?;
                    }
                    Written::New(id)
                }
            };
            tx.commit().map_err(&sqlite)?;
            Ok(written)
        })
    }

    /// The records of `recall.kinds` in its namespace best matching its query, best first: BM25, fused
    /// with the embedding's ranking when it has one. Without words to look up, the latest.
    pub fn recall(&self, recall: &Recall<'_>) -> Result<Vec<Memory>, MemoryError> {
        let sqlite = self.sqlite();
        let kinds: Vec<&str> = recall.kinds.iter().map(|k| k.as_str()).collect();
        let kinds = kinds.join(",");
        // Enough candidates that the excluded ones cannot crowd out the rest.
        let wanted = recall.limit + recall.exclude.len();
        let wanted_sql = i64::try_from(wanted).unwrap_or(i64::MAX);
        let query = fts_query(recall.query);
        self.with(|connection| {
            let live = "instr(',' || ?2 || ',', ',' || m.kind || ',') > 0
                        AND m.forgotten_ms IS NULL AND (?3 OR m.superseded_by IS NULL)";
            let bm25: Vec<i64> = match &query {
                Some(query) => {
                    let found = best_of_index(connection, recall, &kinds, query, wanted)
                        .map_err(&sqlite)?;
                    match found {
                        Some(found) => found,
                        // The namespace is a small part of what matches: filtered before ranking.
                        None => {
                            let mut statement = connection
                                .prepare_cached(&format!(
                                    "SELECT m.id FROM memories_fts f JOIN memories m ON m.id = f.rowid
                                     WHERE memories_fts MATCH ?4 AND m.namespace = ?1 AND {live}
                                     ORDER BY f.rank LIMIT ?5"
                                ))
                                .map_err(&sqlite)?;
                            statement
                                .query_map(
                                    params![
                                        recall.namespace,
                                        kinds,
                                        recall.superseded,
                                        query,
                                        wanted_sql
                                    ],
                                    |row| row.get(0),
                                )
                                .map_err(&sqlite)?
                                .collect::<Result<_, _>>()
                                .map_err(&sqlite)?
                        }
                    }
                }
                None => {
                    let mut statement = connection
                        .prepare_cached(&format!(
                            "SELECT m.id FROM memories m WHERE m.namespace = ?1 AND {live}
                             ORDER BY m.id DESC LIMIT ?4"
                        ))
                        .map_err(&sqlite)?;
                    statement
                        .query_map(
                            params![recall.namespace, kinds, recall.superseded, wanted_sql],
                            |row| row.get(0),
                        )
                        .map_err(&sqlite)?
                        .collect::<Result<_, _>>()
                        .map_err(&sqlite)?
                }
            };
            let ranked = match recall.embedding {
                Some((model, wanted_vector)) => {
                    let mut statement = connection
                        .prepare_cached(&format!(
                            "SELECT m.id, m.embedding FROM memories m
                             WHERE m.namespace = ?1 AND {live} AND m.embedding_model = ?4"
                        ))
                        .map_err(&sqlite)?;
                    let mut rows = statement
                        .query(params![recall.namespace, kinds, recall.superseded, model])
                        .map_err(&sqlite)?;
                    let mut scored: Vec<(f32, i64)> = Vec::new();
                    while let Some(row) = rows.next().map_err(&sqlite)? {
                        let id: i64 = row.get(0).map_err(&sqlite)?;
                        let blob: Vec<u8> = row.get(1).map_err(&sqlite)?;
                        let score = super::cosine(wanted_vector, &from_blob(&blob));
                        scored.push((score, id));
                        // Keeps the best `wanted` (sorted only when the list grows past twice that).
                        if scored.len() > 2 * wanted.max(1) {
                            scored.sort_by(|a, b| b.0.total_cmp(&a.0));
                            scored.truncate(wanted);
                        }
                    }
                    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
                    scored.truncate(wanted);
                    let by_vector: Vec<i64> = scored.into_iter().map(|(_, id)| id).collect();
                    super::fuse(&[bm25, by_vector])
                }
                None => bm25,
            };
            let mut found = Vec::with_capacity(recall.limit);
            for id in ranked {
                if recall.exclude.contains(&id) {
                    continue;
                }
                if let Some(memory) = get(connection, id).map_err(&sqlite)? {
                    found.push(memory);
                }
                if found.len() == recall.limit {
                    break;
                }
            }
            Ok(found)
        })
    }

    /// Marks record `id` forgotten (in `namespace`, when given): it is kept, and never recalled.
    pub fn forget(
        &self,
        namespace: Option<&str>,
        id: i64,
        reason: Option<&str>,
    ) -> Result<Memory, MemoryError> {
        let sqlite = self.sqlite();
        self.with(|connection| {
            let Some(found) = get(connection, id).map_err(&sqlite)? else {
                return Err(MemoryError::NotFound(id));
            };
            if let Some(namespace) = namespace
                && found.namespace != namespace
            {
                // Another namespace's record is as good as unknown to this one.
                return Err(MemoryError::NotFound(id));
            }
            if found.forgotten_ms.is_some() {
                return Err(MemoryError::Forgotten { id });
            }
            connection
                .execute(
                    "UPDATE memories SET forgotten_ms = ?1, forgotten_reason = ?2 WHERE id = ?3",
                    params![now_ms(), reason, id],
                )
                .map_err(&sqlite)?;
            get(connection, id)
                .map_err(&sqlite)?
                .ok_or(MemoryError::NotFound(id))
        })
    }

    /// Record `id`.
    pub fn get(&self, id: i64) -> Result<Option<Memory>, MemoryError> {
        let sqlite = self.sqlite();
        self.with(|connection| get(connection, id).map_err(&sqlite))
    }

    /// The records of `namespace` (every namespace when `None`), oldest first: live ones only unless
    /// `all`.
    pub fn list(&self, namespace: Option<&str>, all: bool) -> Result<Vec<Memory>, MemoryError> {
        let sqlite = self.sqlite();
        self.with(|connection| {
            let mut statement = connection
                .prepare(&format!(
                    "SELECT {COLUMNS} FROM memories m
                     WHERE (?1 IS NULL OR m.namespace = ?1)
                       AND (?2 OR (m.superseded_by IS NULL AND m.forgotten_ms IS NULL))
                     ORDER BY m.namespace, m.id"
                ))
                .map_err(&sqlite)?;
            statement
                .query_map(params![namespace, all], read)
                .map_err(&sqlite)?
                .collect::<Result<_, _>>()
                .map_err(&sqlite)
        })
    }

    /// Each namespace, with how many records it holds.
    pub fn namespaces(&self) -> Result<Vec<Namespace>, MemoryError> {
        let sqlite = self.sqlite();
        self.with(|connection| {
            let mut statement = connection
                .prepare(
                    "SELECT namespace,
                            sum(superseded_by IS NULL AND forgotten_ms IS NULL), count(*)
                     FROM memories GROUP BY namespace ORDER BY namespace",
                )
                .map_err(&sqlite)?;
            statement
                .query_map([], |row| {
                    Ok(Namespace {
                        name: row.get(0)?,
                        live: row.get(1)?,
                        total: row.get(2)?,
                    })
                })
                .map_err(&sqlite)?
                .collect::<Result<_, _>>()
                .map_err(&sqlite)
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
        let sqlite = self.sqlite();
        self.with(|connection| {
            let mut statement = connection
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM memories m
                     WHERE m.namespace = ?1 AND m.kind = 'note' AND m.agent = ?2
                       AND (?3 IS NULL OR m.run = ?3) AND m.forgotten_ms IS NULL
                       AND m.superseded_by IS NULL
                     ORDER BY m.id DESC LIMIT ?4"
                ))
                .map_err(&sqlite)?;
            let mut notes: Vec<Memory> = statement
                .query_map(
                    params![
                        namespace,
                        agent,
                        run,
                        i64::try_from(limit).unwrap_or(i64::MAX)
                    ],
                    read,
                )
                .map_err(&sqlite)?
                .collect::<Result<_, _>>()
                .map_err(&sqlite)?;
            notes.reverse();
            Ok(notes)
        })
    }

    /// Marks record `id` forgotten at `at` (an imported record that was), whatever it was.
    pub fn set_forgotten(&self, id: i64, at: i64, reason: Option<&str>) -> Result<(), MemoryError> {
        let sqlite = self.sqlite();
        self.with(|connection| {
            connection
                .execute(
                    "UPDATE memories SET forgotten_ms = ?1, forgotten_reason = ?2 WHERE id = ?3",
                    params![at, reason, id],
                )
                .map_err(&sqlite)?;
            Ok(())
        })
    }

    /// Links record `id` as superseded by record `by`, where neither link is set yet (imports).
    pub fn link(&self, id: i64, by: i64) -> Result<(), MemoryError> {
        let sqlite = self.sqlite();
        self.with(|connection| {
            connection
                .execute(
                    "UPDATE memories SET superseded_by = ?1 WHERE id = ?2 AND superseded_by IS NULL",
                    params![by, id],
                )
                .map_err(&sqlite)?;
            connection
                .execute(
                    "UPDATE memories SET supersedes = ?1 WHERE id = ?2 AND supersedes IS NULL",
                    params![id, by],
                )
                .map_err(&sqlite)?;
            Ok(())
        })
    }
}

fn get(connection: &Connection, id: i64) -> rusqlite::Result<Option<Memory>> {
    connection
        .prepare_cached(&format!("SELECT {COLUMNS} FROM memories m WHERE m.id = ?1"))?
        .query_row([id], read)
        .optional()
}

fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<Memory> {
    Ok(Memory {
        id: row.get(0)?,
        namespace: row.get(1)?,
        kind: Kind::parse(&row.get::<_, String>(2)?),
        agent: row.get(3)?,
        run: row.get(4)?,
        step: row.get(5)?,
        content: row.get(6)?,
        created_ms: row.get(7)?,
        supersedes: row.get(8)?,
        superseded_by: row.get(9)?,
        forgotten_ms: row.get(10)?,
        forgotten_reason: row.get(11)?,
    })
}

/// The best `wanted` records of the recall's namespace and kinds for the FTS5 `query`, best first, read
/// from the index's best matches of every namespace, each checked in turn; `None` when that many of them
/// were not enough (the namespace is a small part of what matches). Ranking by `bm25()` under a `LIMIT`
/// keeps only the best matches while it scores, where `ORDER BY rank` sorts every match, and joining
/// each match to its record before ranking would look every one of them up: both cost more than the
/// scoring itself once a query has a common word.
fn best_of_index(
    connection: &Connection,
    recall: &Recall<'_>,
    kinds: &str,
    query: &str,
    wanted: usize,
) -> rusqlite::Result<Option<Vec<i64>>> {
    let mut ranked = connection.prepare_cached(
        "SELECT rowid FROM memories_fts WHERE memories_fts MATCH ?1
         ORDER BY bm25(memories_fts) LIMIT ?2",
    )?;
    let mut wanted_here = connection.prepare_cached(
        "SELECT 1 FROM memories m
         WHERE m.id = ?1 AND m.namespace = ?2 AND instr(',' || ?3 || ',', ',' || m.kind || ',') > 0
           AND m.forgotten_ms IS NULL AND (?4 OR m.superseded_by IS NULL)",
    )?;
    let mut limit = (wanted * 4).max(32);
    while limit <= CANDIDATES_CHECKED {
        let candidates: Vec<i64> = ranked
            .query_map(
                params![query, i64::try_from(limit).unwrap_or(i64::MAX)],
                |row| row.get(0),
            )?
            .collect::<Result<_, _>>()?;
        let mut found = Vec::with_capacity(wanted);
        for id in &candidates {
            if found.len() == wanted {
                break;
            }
            if wanted_here.exists(params![id, recall.namespace, kinds, recall.superseded])? {
                found.push(*id);
            }
        }
        // Enough, or every match was checked.
        if found.len() == wanted || candidates.len() < limit {
            return Ok(Some(found));
        }
        limit *= 8;
    }
    Ok(None)
}

/// Most of the index's best matches [`best_of_index`] checks before it filters before ranking.
pub(super) const CANDIDATES_CHECKED: usize = 2048;

/// The FTS5 query for free text: each word quoted (so that nothing in it is FTS5 syntax), any of them.
fn fts_query(text: &str) -> Option<String> {
    let words: Vec<String> = query_words(text).map(|w| format!("\"{w}\"")).collect();
    (!words.is_empty()).then(|| words.join(" OR "))
}

fn to_blob(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_blob(blob: &[u8]) -> Vec<f32> {
    blob.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
