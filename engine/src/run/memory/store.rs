//! [`MemoryStore`]: where memories, notes and episodes live, a SQLite file of the state directory or the
//! PostgreSQL run store's database, and what its records are.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::postgres::PostgresMemory;
use super::sqlite::SqliteMemory;
use crate::store::postgres::PostgresStore;
use crate::store::{RunStore, StoreError};

/// Most bytes of one memory's text.
pub const MAX_MEMORY_BYTES: usize = 16 * 1024;
/// Most words of a query looked up in the index.
const MAX_QUERY_WORDS: usize = 64;

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
    #[error("memory: {0}")]
    Store(#[from] StoreError),
    #[error("memory file `{file}` cannot be kept in the run store's database: {reason}")]
    File { file: String, reason: &'static str },
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

    pub(crate) fn parse(text: &str) -> Kind {
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

/// The memory store: a SQLite file in the state directory, or one memory file's records in the database of
/// a PostgreSQL run store (shared by every host that uses that store). Both keep the same records with the
/// same guarantees; only full-text ranking differs (BM25 over FTS5, `ts_rank_cd` over a `tsvector`).
#[derive(Debug)]
pub struct MemoryStore {
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    Sqlite(SqliteMemory),
    Postgres(PostgresMemory),
}

/// Runs the same call on whichever backend the store has.
macro_rules! on_backend {
    ($store:expr, $b:ident => $call:expr) => {
        match &$store.backend {
            Backend::Sqlite($b) => $call,
            Backend::Postgres($b) => $call,
        }
    };
}

/// Memory kept in a PostgreSQL run store's database: each memory file (the spec's `memory.path`) a key
/// there, so that the memories of different files stay apart as separate files do. Cheap to clone: it
/// shares the store's connections.
#[derive(Clone, Debug)]
pub struct MemoryDatabase(pub(crate) PostgresStore);

impl MemoryDatabase {
    /// The database of run store `store`, when memory lives there (PostgreSQL).
    pub fn of(store: &dyn RunStore) -> Option<MemoryDatabase> {
        store.memory_database().map(MemoryDatabase)
    }

    /// The records of memory file `file` (relative, without `..`: the key is its normalised form).
    pub fn open(&self, file: &str) -> Result<MemoryStore, MemoryError> {
        let key = file_key(file)?;
        Ok(MemoryStore {
            backend: Backend::Postgres(PostgresMemory::new(self.0.clone(), key)),
        })
    }

    /// The store's URL as messages show it (password masked).
    pub fn shown(&self) -> &str {
        self.0.shown()
    }
}

/// The key memory file `file` is kept under in a database: its path's components, `.` left out, joined
/// by `/` (`./a//b.db` is `a/b.db`, as both name one file in the state directory).
pub fn file_key(file: &str) -> Result<String, MemoryError> {
    let refused = |reason| MemoryError::File {
        file: file.to_owned(),
        reason,
    };
    if Path::new(file).is_absolute() || file.starts_with(['/', '\\']) {
        return Err(refused("it must be a relative path"));
    }
    let parts: Vec<&str> = file
        .split(['/', '\\'])
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(refused("it must not contain `..`"));
    }
    if parts.is_empty() {
        return Err(refused("it names no file"));
    }
    Ok(parts.join("/"))
}

impl MemoryStore {
    /// Opens (creating when needed) the SQLite file at `path`.
    pub fn open(path: &Path) -> Result<MemoryStore, MemoryError> {
        Ok(MemoryStore {
            backend: Backend::Sqlite(SqliteMemory::open(path)?),
        })
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
        on_backend!(self, b => b.write(new, content, &hash))
    }

    /// The records of `recall.kinds` in its namespace best matching its query, best first: full-text
    /// ranking, fused with the embedding's ranking when it has one. Without words to look up, the latest.
    pub fn recall(&self, recall: &Recall<'_>) -> Result<Vec<Memory>, MemoryError> {
        on_backend!(self, b => b.recall(recall))
    }

    /// Marks record `id` forgotten (in `namespace`, when given): it is kept, and never recalled.
    pub fn forget(
        &self,
        namespace: Option<&str>,
        id: i64,
        reason: Option<&str>,
    ) -> Result<Memory, MemoryError> {
        on_backend!(self, b => b.forget(namespace, id, reason))
    }

    /// Record `id`.
    pub fn get(&self, id: i64) -> Result<Option<Memory>, MemoryError> {
        on_backend!(self, b => b.get(id))
    }

    /// The records of `namespace` (every namespace when `None`), oldest first: live ones only unless
    /// `all`.
    pub fn list(&self, namespace: Option<&str>, all: bool) -> Result<Vec<Memory>, MemoryError> {
        on_backend!(self, b => b.list(namespace, all))
    }

    /// Each namespace, with how many records it holds.
    pub fn namespaces(&self) -> Result<Vec<Namespace>, MemoryError> {
        on_backend!(self, b => b.namespaces())
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
        on_backend!(self, b => b.notes(namespace, agent, run, limit))
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
                let reason = record.forgotten_reason.as_deref();
                on_backend!(self, b => b.set_forgotten(id, forgotten, reason))?;
            }
        }
        for record in records {
            if let (Some(by), Some(&id)) = (record.superseded_by, ids.get(&record.id))
                && let Some(&by) = ids.get(&by)
                && by != id
            {
                on_backend!(self, b => b.link(id, by))?;
            }
        }
        Ok((new, known))
    }
}

/// The words of a free-text query the index looks up (at most 64): runs of letters and digits, so that
/// nothing in a query is syntax of the index's query language.
pub(crate) fn query_words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_QUERY_WORDS)
}

/// The text's identity for deduplication: SHA-256 of its words, whitespace collapsed.
fn hash(content: &str) -> String {
    let words: Vec<&str> = content.split_whitespace().collect();
    let digest = Sha256::digest(words.join(" ").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn now_ms() -> i64 {
    i64::try_from(crate::store::now_ms()).unwrap_or(i64::MAX)
}

/// The same behaviour on both backends: each test below runs against a SQLite file (in a temporary
/// directory) and against a PostgreSQL run store (in a schema of its own, dropped afterwards; skipped
/// with the reason printed when the server cannot be reached, except under `CI=true`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance::{Schema, postgres_reachable};

    /// Where a test's memory files are.
    trait Files {
        /// Memory file `name`.
        fn open(&self, name: &str) -> MemoryStore;
    }

    struct Sqlite(tempfile::TempDir);

    impl Files for Sqlite {
        fn open(&self, name: &str) -> MemoryStore {
            MemoryStore::open(&self.0.path().join(name)).expect("open")
        }
    }

    struct Postgres(Schema);

    impl Files for Postgres {
        fn open(&self, name: &str) -> MemoryStore {
            let store = self.0.store("host-a", crate::store::postgres::LEASE);
            MemoryDatabase(store).open(name).expect("open")
        }
    }

    /// Each test, once on each backend.
    macro_rules! on_both {
        ($($name:ident),* $(,)?) => {
            mod sqlite {
                $(#[test]
                fn $name() {
                    super::$name(&super::Sqlite(tempfile::tempdir().expect("dir")));
                })*
            }
            mod postgres {
                $(#[test]
                fn $name() {
                    if super::postgres_reachable() {
                        super::$name(&super::Postgres(super::Schema::new()));
                    }
                })*
            }
        };
    }

    on_both!(
        writes_are_deduplicated_superseded_and_forgotten_without_losing_a_record,
        recall_ranks_by_relevance_excludes_what_was_shown_and_reads_no_query_syntax,
        a_small_namespace_is_found_past_the_best_matches_of_a_large_one,
        export_and_import_keep_links_and_forgotten_records,
        embeddings_are_fused_with_the_text_ranking,
        notes_are_the_latest_of_one_agent_oldest_first,
        memory_files_keep_their_records_apart,
    );

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

    fn writes_are_deduplicated_superseded_and_forgotten_without_losing_a_record(files: &dyn Files) {
        let store = files.open("memory.db");
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

    fn recall_ranks_by_relevance_excludes_what_was_shown_and_reads_no_query_syntax(
        files: &dyn Files,
    ) {
        let store = files.open("memory.db");
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

    fn a_small_namespace_is_found_past_the_best_matches_of_a_large_one(files: &dyn Files) {
        let store = files.open("memory.db");
        // More of them than the SQLite index's best matches checked before the namespace is filtered
        // first.
        for i in 0..=super::super::sqlite::CANDIDATES_CHECKED {
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

    fn export_and_import_keep_links_and_forgotten_records(files: &dyn Files) {
        let store = files.open("a.db");
        let old = store.write(&fact("ns", "old")).expect("write").id();
        store
            .write(&NewMemory {
                supersedes: Some(old),
                ..fact("ns", "new")
            })
            .expect("write");
        let gone = store.write(&fact("ns", "gone")).expect("write").id();
        store.forget(None, gone, Some("mistake")).expect("forget");
        let exported = store.list(Some("ns"), true).expect("list");
        let other = files.open("b.db");
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

    fn embeddings_are_fused_with_the_text_ranking(files: &dyn Files) {
        let store = files.open("memory.db");
        let none = HashSet::new();
        let mut ids = Vec::new();
        for (text, vector) in [
            ("the cluster runs kubernetes", vec![1.0, 0.0]),
            ("lunch is at noon", vec![0.0, 1.0]),
            ("the canteen opens at eleven", vec![0.6, 0.8]),
        ] {
            let written = store
                .write(&NewMemory {
                    embedding: Some(("small", vector)),
                    ..fact("ns", text)
                })
                .expect("write");
            ids.push(written.id());
        }
        // Written without an embedding: found by its words only.
        let plain = store
            .write(&fact("ns", "noon standup"))
            .expect("write")
            .id();
        let by_vector = Recall {
            embedding: Some(("small", &[0.0, 1.0])),
            ..recall("ns", "when do we eat", &none)
        };
        let found = store.recall(&by_vector).expect("recall");
        assert_eq!(
            found.iter().map(|m| m.id).collect::<Vec<_>>(),
            [ids[1], ids[2], ids[0]]
        );
        // Both rankings: the record both hold first, then each ranking's in turn.
        let both = Recall {
            embedding: Some(("small", &[0.0, 1.0])),
            ..recall("ns", "noon", &none)
        };
        let found = store.recall(&both).expect("recall");
        assert_eq!(
            found.iter().map(|m| m.id).collect::<Vec<_>>(),
            [ids[1], plain, ids[2], ids[0]]
        );
        // Another model's vectors are not compared.
        let other_model = Recall {
            embedding: Some(("large", &[0.0, 1.0])),
            ..recall("ns", "when do we eat", &none)
        };
        assert_eq!(store.recall(&other_model).expect("recall"), []);
    }

    fn notes_are_the_latest_of_one_agent_oldest_first(files: &dyn Files) {
        let store = files.open("memory.db");
        let note = |agent, run, text| NewMemory {
            kind: Kind::Note,
            agent: Some(agent),
            run: Some(run),
            run_scoped: true,
            ..fact("ns", text)
        };
        for (agent, run, text) in [
            ("ann", "r1", "first"),
            ("bob", "r1", "not mine"),
            ("ann", "r2", "second"),
            ("ann", "r2", "third"),
        ] {
            store.write(&note(agent, run, text)).expect("write");
        }
        // A run-scoped note is a duplicate only of one of the same run.
        assert!(matches!(
            store.write(&note("ann", "r2", "first")).expect("write"),
            Written::New(_)
        ));
        assert!(matches!(
            store.write(&note("ann", "r2", "first")).expect("write"),
            Written::Duplicate(_)
        ));
        let notes = store.notes("ns", "ann", None, 3).expect("notes");
        assert_eq!(contents(&notes), ["second", "third", "first"]);
        let notes = store.notes("ns", "ann", Some("r1"), 50).expect("notes");
        assert_eq!(contents(&notes), ["first"]);
        assert_eq!(
            store.namespaces().expect("namespaces"),
            [Namespace {
                name: "ns".to_owned(),
                live: 5,
                total: 5
            }]
        );
    }

    fn memory_files_keep_their_records_apart(files: &dyn Files) {
        let team = files.open("team.db");
        let other = files.open("other.db");
        let id = team
            .write(&fact("ns", "we deploy on Tuesdays"))
            .expect("write");
        let none = HashSet::new();
        assert_eq!(
            other
                .recall(&recall("ns", "deploy", &none))
                .expect("recall"),
            []
        );
        assert_eq!(other.get(id.id()).expect("get"), None);
        assert!(matches!(
            other.forget(None, id.id(), None),
            Err(MemoryError::NotFound(_))
        ));
        assert_eq!(other.namespaces().expect("namespaces"), []);
        // The same file, however its path is written.
        let again = files.open("./team.db");
        assert_eq!(
            contents(&again.list(None, false).expect("list")),
            ["we deploy on Tuesdays"]
        );
    }

    #[test]
    fn a_file_key_is_the_normalised_relative_path() {
        assert_eq!(file_key("memory.db").expect("key"), "memory.db");
        assert_eq!(file_key("./a//b/./c.db").expect("key"), "a/b/c.db");
        for refused in ["/etc/memory.db", "../memory.db", "a/../../b.db", ".", ""] {
            assert!(
                matches!(file_key(refused), Err(MemoryError::File { .. })),
                "{refused}"
            );
        }
        assert_eq!(
            file_key("../m.db").map_err(|e| e.to_string()),
            Err("memory file `../m.db` cannot be kept in the run store's database: it must not contain `..`".to_owned())
        );
    }

    /// On PostgreSQL, a query whose words are all stop words (the index keeps none) gives the latest, as
    /// one without words does; two hosts remembering the same fact at once write it once.
    #[test]
    fn postgres_stop_words_and_concurrent_duplicates() {
        if !postgres_reachable() {
            return;
        }
        let files = Postgres(Schema::new());
        let store = files.open("memory.db");
        for text in ["alpha", "beta", "gamma"] {
            store.write(&fact("ns", text)).expect("write");
        }
        let none = HashSet::new();
        assert_eq!(
            contents(
                &store
                    .recall(&recall("ns", "is it the", &none))
                    .expect("recall")
            ),
            ["gamma", "beta", "alpha"]
        );
        let written: Vec<Written> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let store = files.open("memory.db");
                    scope.spawn(move || store.write(&fact("ns", "shared fact")).expect("write"))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("joined"))
                .collect()
        });
        let new: Vec<i64> = written
            .iter()
            .filter_map(|w| match w {
                Written::New(id) => Some(*id),
                Written::Duplicate(_) => None,
            })
            .collect();
        assert_eq!(new.len(), 1, "{written:?}");
        assert!(written.iter().all(|w| w.id() == new[0]), "{written:?}");
    }
}
