//! [`MemoryStore`]: the SQLite file memories, notes and episodes live in.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Most bytes of one memory's text.
pub const MAX_MEMORY_BYTES: usize = 16 * 1024;
/// Most words of a query looked up in the index.
const MAX_QUERY_WORDS: usize = 64;

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

/// What went wrong with the memory store.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("memory store `{path}`: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("memory store `{path}`: {message}")]
    Open { path: PathBuf, message: String },
    #[error("no memory `{0}`")]
    NotFound(i64),
    #[error("memory `{id}` is in namespace `{namespace}`, not this one")]
    OtherNamespace { id: i64, namespace: String },
    #[error("memory `{id}` was forgotten")]
    Forgotten { id: i64 },
    #[error("memory `{id}` was already superseded by `{by}`")]
    Superseded { id: i64, by: i64 },
    #[error("a memory may hold at most {} KiB, and this one is {size} bytes", MAX_MEMORY_BYTES / 1024)]
    TooLong { size: usize },
    #[error("a memory cannot be empty")]
    Empty,
}

/// What a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A fact an agent (or a person) chose to remember.
    Fact,
    /// What an agent step with memory did: its goal, answer and outcome.
    Episode,
    /// A note an agent keeps for itself.
    Note,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Fact => "fact",
            Kind::Episode => "episode",
            Kind::Note => "note",
        }
    }

    fn parse(text: &str) -> Kind {
        match text {
            "episode" => Kind::Episode,
            "note" => Kind::Note,
            _ => Kind::Fact,
        }
    }
}

/// A namespace's records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Namespace {
    pub name: String,
    /// Records recalled (neither superseded nor forgotten).
    pub live: i64,
    /// All its records.
    pub total: i64,
}

/// One record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memory {
    pub id: i64,
    pub namespace: String,
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub content: String,
    /// Milliseconds since the Unix epoch.
    pub created_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forgotten_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forgotten_reason: Option<String>,
}

impl Memory {
    /// Neither superseded nor forgotten.
    pub fn live(&self) -> bool {
        self.superseded_by.is_none() && self.forgotten_ms.is_none()
    }
}

/// A record to write.
#[derive(Clone, Debug)]
pub struct NewMemory<'a> {
    pub namespace: &'a str,
    pub kind: Kind,
    pub agent: Option<&'a str>,
    pub run: Option<&'a str>,
    pub step: Option<&'a str>,
    pub content: &'a str,
    /// The live record this one replaces.
    pub supersedes: Option<i64>,
    /// For notes kept for one run only: a note is a duplicate only of one of the same run.
    pub run_scoped: bool,
    pub embedding: Option<(&'a str, Vec<f32>)>,
}

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// A new record, with its id.
    New(i64),
    /// The text is already remembered, live, as this record: nothing was written.
    Duplicate(i64),
}

impl Written {
    pub fn id(self) -> i64 {
        match self {
            Written::New(id) | Written::Duplicate(id) => id,
        }
    }
}

/// A query.
#[derive(Clone, Debug)]
pub struct Recall<'a> {
    pub namespace: &'a str,
    pub kinds: &'a [Kind],
    pub query: &'a str,
    pub limit: usize,
    /// Records not to return (already shown).
    pub exclude: &'a HashSet<i64>,
    /// Superseded records too.
    pub superseded: bool,
    /// The query's embedding, from the model records were embedded with: fused with BM25 when given.
    pub embedding: Option<(&'a str, &'a [f32])>,
}

/// The memory store: one SQLite file, shared by the runs and the processes that open it (WAL).
#[derive(Debug)]
pub struct MemoryStore {
    path: PathBuf,
    connection: Mutex<Connection>,
}

impl MemoryStore {
    /// Opens (creating when needed) the store at `path`.
    pub fn open(path: &Path) -> Result<MemoryStore, MemoryError> {
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
        Ok(MemoryStore {
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

    /// Writes a record, unless its text is already remembered, live, in its namespace (as the same kind,
    /// for the same agent); one that `supersedes` another marks the other superseded.
    pub fn write(&self, new: &NewMemory<'_>) -> Result<Written, MemoryError> {
        let content = new.content.trim();
        if content.is_empty() {
            return Err(MemoryError::Empty);
        }
        if content.len() > MAX_MEMORY_BYTES {
            return Err(MemoryError::TooLong {
                size: content.len(),
            });
        }
        let hash = hash(content);
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

    /// Imports exported records into their namespaces (`namespace` overrides theirs): each written as a
    /// new record unless it is already remembered; links between imported records are kept, and what
    /// was forgotten stays forgotten. Returns how many were new and how many already known.
    pub fn import(
        &self,
        records: &[Memory],
        namespace: Option<&str>,
    ) -> Result<(usize, usize), MemoryError> {
        let mut ids = std::collections::HashMap::new();
        let (mut new, mut known) = (0, 0);
        for record in records {
            let written = self.write(&NewMemory {
                namespace: namespace.unwrap_or(&record.namespace),
                kind: record.kind,
                agent: record.agent.as_deref(),
                run: record.run.as_deref(),
                step: record.step.as_deref(),
                content: &record.content,
                supersedes: None,
                run_scoped: false,
                embedding: None,
            })?;
            // Superseded and forgotten records are written too: a duplicate is only of a live one.
            match written {
                Written::New(_) => new += 1,
                Written::Duplicate(_) => known += 1,
            }
            ids.insert(record.id, written.id());
            if let (Written::New(id), Some(forgotten)) = (written, record.forgotten_ms) {
                let sqlite = self.sqlite();
                self.with(|connection| {
                    connection
                        .execute(
                            "UPDATE memories SET forgotten_ms = ?1, forgotten_reason = ?2 WHERE id = ?3",
                            params![forgotten, record.forgotten_reason, id],
                        )
                        .map_err(&sqlite)
                })?;
            }
        }
        let sqlite = self.sqlite();
        for record in records {
            if let (Some(by), Some(&id)) = (record.superseded_by, ids.get(&record.id))
                && let Some(&by) = ids.get(&by)
                && by != id
            {
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
                        .map_err(&sqlite)
                })?;
            }
        }
        Ok((new, known))
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
const CANDIDATES_CHECKED: usize = 2048;

/// The text's identity for deduplication: SHA-256 of its words, whitespace collapsed.
fn hash(content: &str) -> String {
    let words: Vec<&str> = content.split_whitespace().collect();
    let digest = Sha256::digest(words.join(" ").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The FTS5 query for free text: each word quoted (so that nothing in it is FTS5 syntax), any of them.
fn fts_query(text: &str) -> Option<String> {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_QUERY_WORDS)
        .map(|w| format!("\"{w}\""))
        .collect();
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

fn now_ms() -> i64 {
    i64::try_from(crate::store::now_ms()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact<'a>(namespace: &'a str, content: &'a str) -> NewMemory<'a> {
        NewMemory {
            namespace,
            kind: Kind::Fact,
            agent: None,
            run: None,
            step: None,
            content,
            supersedes: None,
            run_scoped: false,
            embedding: None,
        }
    }

    fn recall<'a>(namespace: &'a str, query: &'a str, exclude: &'a HashSet<i64>) -> Recall<'a> {
        Recall {
            namespace,
            kinds: &[Kind::Fact],
            query,
            limit: 5,
            exclude,
            superseded: false,
            embedding: None,
        }
    }

    fn contents(found: &[Memory]) -> Vec<&str> {
        found.iter().map(|m| m.content.as_str()).collect()
    }

    #[test]
    fn writes_are_deduplicated_superseded_and_forgotten_without_losing_a_record() {
        let dir = tempfile::tempdir().expect("dir");
        let store = MemoryStore::open(&dir.path().join("memory.db")).expect("open");
        let first = store
            .write(&fact("team", "we deploy on Tuesdays"))
            .expect("write");
        assert_eq!(first, Written::New(1));
        assert_eq!(
            store
                .write(&fact("team", "  we deploy   on Tuesdays "))
                .expect("write"),
            Written::Duplicate(1)
        );
        assert_eq!(
            store
                .write(&fact("other", "we deploy on Tuesdays"))
                .expect("write"),
            Written::New(2)
        );
        let update = NewMemory {
            supersedes: Some(1),
            ..fact("team", "we deploy on Thursdays")
        };
        assert_eq!(store.write(&update).expect("write"), Written::New(3));
        let none = HashSet::new();
        assert_eq!(
            contents(
                &store
                    .recall(&recall("team", "deploy", &none))
                    .expect("recall")
            ),
            ["we deploy on Thursdays"]
        );
        let with_old = Recall {
            superseded: true,
            ..recall("team", "deploy", &none)
        };
        assert_eq!(contents(&store.recall(&with_old).expect("recall")).len(), 2);
        assert!(matches!(
            store.write(&update),
            Err(MemoryError::Superseded { id: 1, by: 3 })
        ));
        store
            .forget(Some("team"), 3, Some("wrong"))
            .expect("forget");
        assert_eq!(
            store
                .recall(&recall("team", "deploy", &none))
                .expect("recall"),
            []
        );
        let kept = store.list(Some("team"), true).expect("list");
        assert_eq!(
            kept.iter()
                .map(|m| (m.id, m.superseded_by, m.forgotten_ms.is_some()))
                .collect::<Vec<_>>(),
            [(1, Some(3), false), (3, None, true)]
        );
        assert!(matches!(
            store.forget(Some("other"), 3, None),
            Err(MemoryError::NotFound(3))
        ));
    }

    #[test]
    fn recall_ranks_by_bm25_excludes_what_was_shown_and_reads_no_query_syntax() {
        let dir = tempfile::tempdir().expect("dir");
        let store = MemoryStore::open(&dir.path().join("memory.db")).expect("open");
        for text in [
            "the staging database is postgres 16",
            "lunch is at noon",
            "postgres backups run nightly; the postgres password is in the vault",
        ] {
            store.write(&fact("ns", text)).expect("write");
        }
        let none = HashSet::new();
        let found = store
            .recall(&recall("ns", "which postgres?", &none))
            .expect("recall");
        assert_eq!(found.iter().map(|m| m.id).collect::<Vec<_>>(), [3, 1]);
        let shown = HashSet::from([3]);
        let found = store
            .recall(&recall("ns", "postgres", &shown))
            .expect("recall");
        assert_eq!(found.iter().map(|m| m.id).collect::<Vec<_>>(), [1]);
        // FTS5 operators and quotes in a query are words, not syntax.
        let found = store
            .recall(&recall("ns", "\"NEAR(lunch* OR) AND -", &none))
            .expect("recall");
        assert_eq!(contents(&found), ["lunch is at noon"]);
        // No words: the latest.
        let found = store.recall(&recall("ns", "?!", &none)).expect("recall");
        assert_eq!(found.iter().map(|m| m.id).collect::<Vec<_>>(), [3, 2, 1]);
    }

    #[test]
    fn a_small_namespace_is_found_past_the_best_matches_of_a_large_one() {
        let dir = tempfile::tempdir().expect("dir");
        let store = MemoryStore::open(&dir.path().join("memory.db")).expect("open");
        // More of them than the index's best matches checked before the namespace is filtered first.
        for i in 0..=CANDIDATES_CHECKED {
            let text = format!("alpha alpha alpha note {i}");
            store.write(&fact("big", &text)).expect("write");
        }
        for text in ["alpha one", "alpha two", "beta alpha three"] {
            store.write(&fact("small", text)).expect("write");
        }
        let none = HashSet::new();
        let found = store
            .recall(&recall("small", "alpha", &none))
            .expect("recall");
        assert_eq!(
            contents(&found),
            ["alpha one", "alpha two", "beta alpha three"]
        );
        assert_eq!(
            store
                .recall(&recall("big", "alpha", &none))
                .expect("recall")
                .len(),
            5
        );
    }

    #[test]
    fn export_and_import_keep_links_and_forgotten_records() {
        let dir = tempfile::tempdir().expect("dir");
        let store = MemoryStore::open(&dir.path().join("a.db")).expect("open");
        store.write(&fact("ns", "old")).expect("write");
        store
            .write(&NewMemory {
                supersedes: Some(1),
                ..fact("ns", "new")
            })
            .expect("write");
        store.write(&fact("ns", "gone")).expect("write");
        store.forget(None, 3, Some("mistake")).expect("forget");
        let exported = store.list(Some("ns"), true).expect("list");
        let other = MemoryStore::open(&dir.path().join("b.db")).expect("open");
        other.write(&fact("ns", "new")).expect("write");
        assert_eq!(other.import(&exported, None).expect("import"), (2, 1));
        let imported = other.list(Some("ns"), true).expect("list");
        assert_eq!(
            imported
                .iter()
                .map(|m| (m.content.as_str(), m.live()))
                .collect::<Vec<_>>(),
            [("new", true), ("old", false), ("gone", false)]
        );
        assert_eq!(imported[1].superseded_by, Some(imported[0].id));
    }
}
