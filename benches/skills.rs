//! Prompt overhead of the skill catalog (run with `cargo bench --bench skills`): the tokens the catalog adds
//! to an agent's system prompt, its fixed opening and per skill, for 1 to 100 skills with one- and
//! three-sentence descriptions, counted as for an OpenAI model (o200k) and approximately (others), and the
//! time to build it. Figures are printed; nothing is asserted.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Instant;

use archon_engine::llm::tokens::Estimator;
use archon_engine::skills::{Skill, catalog};
use serde_json::Value as Json;

const SHORT: &str =
    "Writes one changelog entry in the project's house style from a short description of a change.";
const LONG: &str = "Reviews a pull request for correctness, security and style, following the team's review checklist. \
    Use it when asked to review a diff or a pull request, or to check a change before it is merged. \
    It reads the checklist and the examples in its references before commenting.";

fn skills(n: usize, description: &str) -> Vec<Skill> {
    (0..n)
        .map(|i| Skill {
            name: format!("skill-number-{i}"),
            description: description.to_owned(),
            license: None,
            compatibility: None,
            metadata: Json::Null,
            allowed_tools: None,
            allowed_tools_at: Vec::new(),
            dir: PathBuf::from(format!("skills/skill-number-{i}")),
            project: false,
            body: String::new(),
            rules: Vec::new(),
        })
        .collect()
}

fn main() {
    let budget = usize::MAX;
    println!("skill catalog: tokens in the system prompt (unbounded budget)");
    println!(
        "{:<12} {:<8} {:>7} {:>9} {:>9} {:>10}",
        "tokenizer", "desc", "skills", "catalog", "per skill", "build"
    );
    for (label, model) in [("o200k", "gpt-4o"), ("approximate", "claude-sonnet-4-5")] {
        let estimator = Estimator::for_model(model);
        let opening = catalog(&skills(1, SHORT), budget, &estimator).tokens
            - estimator.text(&format!("- `skill-number-0`: {SHORT}\n"));
        for (desc_label, description) in [("1 sentence", SHORT), ("3 sentences", LONG)] {
            for n in [1, 10, 100] {
                let list = skills(n, description);
                let start = Instant::now();
                let built = catalog(&list, budget, &estimator);
                let took = start.elapsed();
                let per_skill = (built.tokens - opening) as f64 / n as f64;
                println!(
                    "{label:<12} {desc_label:<8} {n:>7} {:>9} {per_skill:>9.1} {:>8.1?}",
                    built.tokens, took
                );
            }
        }
        println!("{label:<12} fixed opening of the catalog: {opening} tokens");
    }
}
