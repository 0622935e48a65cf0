//! Long-term memory: what agents with `memory: true` remember across runs, their session notes, and the
//! episodes (goal, answer, outcome) of their earlier steps, in an embedded SQLite file with an FTS5 index
//! (`sqlite.rs`), or, when the run store is PostgreSQL, in its database (`postgres.rs`).
//!
//! Records are append-only: their text never changes. An update is a new record that supersedes the old
//! one (kept, linked both ways, not recalled unless asked); `forget` marks a record forgotten (kept, never
//! recalled). A write whose text (whitespace aside) is already remembered, live, in its namespace is not
//! written again: the existing record is returned. Retrieval is full-text (BM25 over the FTS5 index, or
//! `ts_rank_cd` over PostgreSQL's `tsvector`) and needs no model; when the spec names an embeddings
//! provider, records carry a vector and a recall fuses both rankings by reciprocal rank fusion ([`fuse`]).

mod postgres;
mod sqlite;
mod store;

pub use store::{
    Kind, MAX_MEMORY_BYTES, Memory, MemoryDatabase, MemoryError, MemoryStore, Namespace, NewMemory,
    Recall, Written, file_key,
};

/// Reciprocal rank fusion's constant: how much the first ranks outweigh the rest.
const RRF_K: f64 = 60.0;

/// Fuses rankings (each a list of ids, best first) by reciprocal rank fusion: an id's score is the sum of
/// `1 / (60 + rank)` over the rankings that hold it. Ties keep the order of the first ranking.
pub fn fuse(rankings: &[Vec<i64>]) -> Vec<i64> {
    let mut scores: Vec<(i64, f64, usize)> = Vec::new();
    let mut order = 0;
    for ranking in rankings {
        for (rank, id) in ranking.iter().enumerate() {
            let score = 1.0 / (RRF_K + rank as f64 + 1.0);
            match scores.iter_mut().find(|(known, _, _)| known == id) {
                Some((_, total, _)) => *total += score,
                None => {
                    scores.push((*id, score, order));
                    order += 1;
                }
            }
        }
    }
    scores.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
    scores.into_iter().map(|(id, _, _)| id).collect()
}

/// Cosine similarity of two vectors (0 when either is empty, or their lengths differ).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    dot / (na.sqrt() * nb.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusion_rewards_ids_both_rankings_hold() {
        assert_eq!(fuse(&[vec![1, 2, 3], vec![3, 4, 1]]), vec![1, 3, 2, 4]);
        assert_eq!(fuse(&[vec![5, 6]]), vec![5, 6]);
        assert_eq!(fuse(&[]), Vec::<i64>::new());
    }

    #[test]
    fn cosine_of_vectors() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-6);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-6);
        assert!(cosine(&[1.0], &[1.0, 2.0]).abs() < 1e-6);
    }
}
