//! The run store's records and files: a store written by the previous version read by this one, rows that
//! do not decode, `runs --check`, a damaged write-ahead log, and a log kept short by checkpoints.

use std::path::{Path, PathBuf};

use rusqlite::Connection;
use serde_json::Value as Json;
use tempfile::TempDir;

use crate::support::{Output, archon, root};

const HELLO: &str = "name: hello\nsteps:\n  - { id: a, tool: echo, with: { text: hi } }\n";

/// A directory whose `.archon` holds a copy of the store the previous version wrote.
fn fixture_store() -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    std::fs::create_dir(dir.path().join(".archon")).expect("mkdir");
    std::fs::copy(
        root().join("tests/fixtures/store/state.db"),
        dir.path().join(".archon/state.db"),
    )
    .expect("copy");
    dir
}

fn db(dir: &Path) -> PathBuf {
    dir.join(".archon/state.db")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir, args);
    assert_eq!(code, 0, "{args:?}: {stderr}");
    if args[0] != "run" {
        // `run` shows its progress on stderr; the others print nothing there when they succeed.
        assert_eq!(stderr, "", "{args:?}");
    }
    stdout
}

fn run_ids(dir: &Path) -> Vec<String> {
    let runs: Json = serde_json::from_str(&ok(dir, &["runs", "--json"])).expect("JSON");
    runs.as_array()
        .expect("list")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect()
}

/// Runs `HELLO` `times` times in `dir`; returns the last run's id.
fn run_hello(dir: &Path, times: usize) -> String {
    std::fs::write(dir.join("hello.yaml"), HELLO).expect("write");
    for _ in 0..times {
        ok(dir, &["run", "hello.yaml"]);
    }
    run_ids(dir).remove(0)
}

#[test]
fn a_store_written_by_the_previous_version_reads_as_it_did() {
    let dir = fixture_store();
    insta::assert_snapshot!("fixture_runs", ok(dir.path(), &["runs"]));
    insta::assert_snapshot!("fixture_runs_json", ok(dir.path(), &["runs", "--json"]));
    let ids = run_ids(dir.path());
    assert_eq!(ids.len(), 5);
    for id in &ids {
        let text = ok(dir.path(), &["show", id, "--json", "--events"]);
        let shown: Json = serde_json::from_str(&text).expect("JSON");
        let name = format!("fixture_show_{}", shown["workflow"].as_str().expect("name"));
        insta::assert_snapshot!(name, text);
    }
    assert_eq!(
        ok(dir.path(), &["runs", "--check"]),
        "`.archon/state.db`: no damage found\n"
    );

    // The migrated store takes new records next to the old ones: a decision on a request the previous
    // version recorded, and a new run.
    let pay = &ids[2];
    ok(dir.path(), &["approve", pay]);
    let shown: Json =
        serde_json::from_str(&ok(dir.path(), &["show", pay, "--json"])).expect("JSON");
    let decision = &shown["approvals"][0]["decision"];
    assert_eq!(decision["approved"], true);
    assert_eq!(shown["approvals"][0]["request"]["step"], "pay");
    let new = run_hello(dir.path(), 1);
    assert_eq!(run_ids(dir.path()).len(), 6);
    let shown: Json =
        serde_json::from_str(&ok(dir.path(), &["show", &new, "--json", "--events"])).expect("JSON");
    assert_eq!(shown["status"], "succeeded");
    assert_eq!(
        shown["results"]["a"]["output"],
        serde_json::json!({ "text": "hi" })
    );
    assert_eq!(
        ok(dir.path(), &["runs", "--check"]),
        "`.archon/state.db`: no damage found\n"
    );
    let conn = Connection::open(db(dir.path())).expect("opens");
    let formats: Vec<(String, i64)> = conn
        .prepare("SELECT id, format FROM runs ORDER BY started_at")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    let formats: Vec<i64> = formats.into_iter().map(|(_, f)| f).collect();
    assert_eq!(
        formats,
        [0, 0, 0, 0, 0, 1],
        "old rows are read, never rewritten"
    );
}

#[test]
fn a_row_that_does_not_decode_is_reported_never_replaced() {
    let dir = TempDir::new().expect("tempdir");
    let id = run_hello(dir.path(), 1);
    let conn = Connection::open(db(dir.path())).expect("opens");
    conn.execute(
        "UPDATE results SET result = '{\"status\": \"succeeded\"' WHERE run_id = ?1",
        [&id],
    )
    .expect("garble a result");
    conn.execute(
        "UPDATE events SET format = 7 WHERE run_id = ?1 AND seq = 1",
        [&id],
    )
    .expect("an event from the future");
    conn.execute("UPDATE runs SET inputs = '[]' WHERE id = ?1", [&id])
        .expect("inputs that are not an object");
    drop(conn);
    let before = std::fs::read(db(dir.path())).expect("read");

    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["show", &id]);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert_eq!(
        stderr.replace(&id, "RUN"),
        "error: state database `.archon/state.db` has 2 damaged rows:
  run `RUN`: runs row `inputs` does not decode: invalid type: sequence, expected a map at line 1 column 0
  run `RUN`: results row `a` does not decode: EOF while parsing an object at line 1 column 22
  hint: nothing was changed; `archon runs --check` lists every damaged row in the store
"
    );
    let Output { code, stderr, .. } = archon(dir.path(), &["show", &id, "--events", "--json"]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("error: state database `.archon/state.db` has 2 damaged rows:\n"),
        "{stderr}"
    );

    // Resuming it is refused for the same reason, rather than running with what could be read.
    let Output { code, stderr, .. } = archon(dir.path(), &["retry", &id, "--from", "a"]);
    assert_eq!(code, 1, "{stderr}");

    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["runs", "--check"]);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert_eq!(
        stderr.replace(&id, "RUN"),
        "error: state database `.archon/state.db` has 3 problems:
  run `RUN`: runs row `inputs` does not decode: invalid type: sequence, expected a map at line 1 column 0
  run `RUN`: results row `a` does not decode: EOF while parsing an object at line 1 column 22
  run `RUN`: events row `1` has format `7`, newer than this archon reads (`1`)
  hint: nothing was changed; what these problems touch cannot be shown or resumed until the file is restored from a backup
"
    );
    // The listing still shows the run: its own columns are intact.
    assert_eq!(run_ids(dir.path()), [id]);
    assert_eq!(
        std::fs::read(db(dir.path())).expect("read"),
        before,
        "nothing rewritten"
    );
}

#[test]
fn runs_check_reads_every_page() {
    let dir = TempDir::new().expect("tempdir");
    let id = run_hello(dir.path(), 3);
    let conn = Connection::open(db(dir.path())).expect("opens");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    let root: i64 = conn
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'runs_by_start'",
            [],
            |r| r.get(0),
        )
        .expect("index");
    drop(conn);
    // Zero the index's root page. Opening reads no page of it, so a run is still shown (read by its id);
    // `runs --check` reads every page.
    let mut bytes = std::fs::read(db(dir.path())).expect("read");
    let page = 4096 * (root as usize - 1);
    bytes[page..page + 4096].fill(0);
    std::fs::write(db(dir.path()), &bytes).expect("write");

    assert!(ok(dir.path(), &["show", &id]).starts_with(&format!("run       {id}\n")));
    let Output { code, stderr, .. } = archon(dir.path(), &["runs", "--check"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "error: state database `.archon/state.db` has 2 problems:
  *** in database main ***
  Tree {root} page {root}: btreeInitPage() returns error code 11
  wrong # of entries in index runs_by_start
  hint: nothing was changed; what these problems touch cannot be shown or resumed until the file is restored from a backup
"
        )
    );
    assert_eq!(std::fs::read(db(dir.path())).expect("read"), bytes);
}

/// The write-ahead log's bytes, with `at` replaced by its complement.
fn garble_log(dir: &Path, at: usize) -> Vec<u8> {
    let log = dir.join(".archon/state.db-wal");
    let mut bytes = std::fs::read(&log).expect("read log");
    assert!(bytes.len() > 32 + 24 + 4096, "{} bytes", bytes.len());
    bytes[at] = !bytes[at];
    std::fs::write(&log, &bytes).expect("write log");
    bytes
}

#[test]
fn a_damaged_write_ahead_log_is_reported_and_left_alone() {
    for (at, detail) in [
        (0, "it does not start like a write-ahead log"),
        (20, "its header does not match its checksum"),
        (32 + 24 + 100, "its first frame does not match its checksum"),
    ] {
        let dir = TempDir::new().expect("tempdir");
        // Two runs: the first is checkpointed into the database file, the second lives in the log.
        run_hello(dir.path(), 2);
        let bytes = garble_log(dir.path(), at);
        for args in [&["runs"][..], &["run", "hello.yaml"][..]] {
            let Output { code, stderr, .. } = archon(dir.path(), args);
            assert_eq!(code, 1, "{args:?}: {stderr}");
            assert_eq!(
                stderr,
                format!(
                    "error: the write-ahead log `.archon/state.db-wal` of the state database is damaged: {detail}
  hint: nothing was changed; the runs it holds would be lost: restore it from a backup, or move the state directory aside to start a new store
"
                ),
                "{args:?}"
            );
        }
        assert_eq!(
            std::fs::read(dir.path().join(".archon/state.db-wal")).expect("read"),
            bytes,
            "left as it was"
        );
    }
}

/// The state a crash leaves in the middle of a large transaction: SQLite has written (spilled) its pages
/// to the log before committing, written some of them again in place, and would recompute the frames'
/// checksums only as it commits. The log's first frame no longer matches its checksum, yet nothing
/// committed is lost: the store opens with every run it had. Taken by copying the files while the
/// transaction is open, which is what a kill -9 at that moment leaves on disk.
#[test]
fn a_transaction_a_crash_left_in_the_log_is_not_damage() {
    let dir = TempDir::new().expect("tempdir");
    let ids = {
        run_hello(dir.path(), 2);
        run_ids(dir.path())
    };
    let conn = Connection::open(db(dir.path())).expect("opens");
    // The table exists before the transaction, so that the first page the transaction spills to the
    // log is one of its own, which the update writes again (the schema spans several pages, and the
    // pages holding it are not the ones spilled first).
    conn.execute_batch("CREATE TABLE filler (v BLOB);")
        .expect("created");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    conn.execute_batch(
        "PRAGMA cache_size = 8;
         BEGIN;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400)
           INSERT INTO filler SELECT randomblob(3000) FROM n;
         UPDATE filler SET v = randomblob(3000);",
    )
    .expect("written, not committed");
    let copy = TempDir::new().expect("tempdir");
    std::fs::create_dir(copy.path().join(".archon")).expect("mkdir");
    for file in ["state.db", "state.db-wal"] {
        std::fs::copy(
            dir.path().join(".archon").join(file),
            copy.path().join(".archon").join(file),
        )
        .expect("copy");
    }
    drop(conn);
    std::fs::copy(
        dir.path().join("hello.yaml"),
        copy.path().join("hello.yaml"),
    )
    .expect("copy");
    let log = std::fs::read(copy.path().join(".archon/state.db-wal")).expect("log");
    assert!(log.len() > 32 + 100 * (24 + 4096), "{} bytes", log.len());
    assert_eq!(
        (first_frame_matches(&log), commit_frames(&log)),
        (false, 0),
        "the crash's state: a first frame rewritten in place, no commit"
    );
    assert_eq!(run_ids(copy.path()), ids);
    ok(copy.path(), &["run", "hello.yaml"]);
    assert_eq!(run_ids(copy.path()).len(), 3);
}

/// Whether the log's first frame matches its checksum (SQLite's, in the log's byte order).
fn first_frame_matches(log: &[u8]) -> bool {
    let big_endian = log[3] & 1 == 1;
    let word = |b: &[u8]| {
        let b = [b[0], b[1], b[2], b[3]];
        if big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    };
    let sum = |(mut s0, mut s1): (u32, u32), data: &[u8]| {
        for pair in data.chunks_exact(8) {
            s0 = s0.wrapping_add(word(&pair[..4])).wrapping_add(s1);
            s1 = s1.wrapping_add(word(&pair[4..])).wrapping_add(s0);
        }
        (s0, s1)
    };
    let be = |at: usize| u32::from_be_bytes(log[at..at + 4].try_into().expect("four bytes"));
    let header = sum((0, 0), &log[..24]);
    let frame = sum(sum(header, &log[32..40]), &log[56..56 + 4096]);
    frame == (be(48), be(52))
}

/// How many frames of the log's current salts end a transaction.
fn commit_frames(log: &[u8]) -> usize {
    log[32..]
        .chunks(24 + 4096)
        .filter(|frame| frame.len() >= 24 && frame[8..16] == log[16..24] && frame[4..8] != [0; 4])
        .count()
}

#[test]
fn the_database_file_alone_is_never_taken_for_a_new_store() {
    let dir = TempDir::new().expect("tempdir");
    let first = run_hello(dir.path(), 1);
    // A copy of the database file without its log (a backup that missed it, a log lost).
    let copy = TempDir::new().expect("tempdir");
    std::fs::create_dir(copy.path().join(".archon")).expect("mkdir");
    std::fs::copy(db(dir.path()), db(copy.path())).expect("copy");
    assert_eq!(run_ids(copy.path()), [first]);
}

/// Pages of the log not yet in the database file, from the wal-index header.
fn pending_frames(dir: &Path) -> u32 {
    let shm = std::fs::read(dir.join(".archon/state.db-shm")).expect("shm");
    let word = |at: usize| u32::from_ne_bytes(shm[at..at + 4].try_into().expect("four bytes"));
    word(16) - word(96)
}

#[test]
fn the_log_is_checkpointed_as_runs_end_and_stays_short() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("hello.yaml"), HELLO).expect("write");
    let mut most = 0;
    for _ in 0..30 {
        ok(dir.path(), &["run", "hello.yaml"]);
        most = most.max(pending_frames(dir.path()));
    }
    // A hello run writes about a dozen pages; its writer moves the log into the file once 128 are pending
    // when the run ends, so the log never holds much more than that (without checkpoints it would hold
    // all 30 runs, some 360 pages).
    assert!(most < 128 + 32, "{most} pages pending");
    // And the log file itself is emptied, not only copied: it does not grow with the runs.
    let log = std::fs::metadata(dir.path().join(".archon/state.db-wal"))
        .expect("log")
        .len();
    assert!(log < (128 + 32) * (24 + 4096), "{log} bytes of log");
    // So the database file alone holds every run but the last few.
    let copy = TempDir::new().expect("tempdir");
    std::fs::create_dir(copy.path().join(".archon")).expect("mkdir");
    std::fs::copy(db(dir.path()), db(copy.path())).expect("copy");
    let all = run_ids(dir.path());
    let kept = run_ids(copy.path());
    assert_eq!(all.len(), 30);
    assert!(kept.len() >= 15, "{} of 30 runs in the file", kept.len());
    assert_eq!(kept[..], all[all.len() - kept.len()..], "the oldest runs");
}
