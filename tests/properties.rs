//! Property tests: random valid DAG specs validate cleanly in YAML and TOML, with a topological order;
//! random graphs with an injected cycle always report a cycle whose path is made of real edges.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use archon_engine::validate_source;
use proptest::prelude::*;

/// A random DAG: for each step, its dependencies (all earlier steps), each through `needs` or a template.
#[derive(Debug, Clone)]
struct Dag {
    deps: Vec<Vec<(usize, bool)>>,
}

fn dag() -> impl Strategy<Value = Dag> {
    (1usize..60).prop_flat_map(|n| {
        let steps: Vec<_> = (0..n)
            .map(|i| {
                if i == 0 {
                    Just(Vec::new()).boxed()
                } else {
                    proptest::collection::vec((0..i, any::<bool>()), 0..4.min(i) + 1).boxed()
                }
            })
            .collect();
        steps.prop_map(|deps| Dag { deps })
    })
}

/// Renders the DAG, plus optional extra edges `(from, to, via_needs)`, as YAML or TOML.
fn render(dag: &Dag, extra: &[(usize, usize, bool)], toml: bool) -> String {
    let mut out = if toml {
        String::from("name = \"random\"\n")
    } else {
        String::from("name: random\nsteps:\n")
    };
    for (i, deps) in dag.deps.iter().enumerate() {
        let all: Vec<(usize, bool)> = deps
            .iter()
            .copied()
            .chain(extra.iter().filter(|e| e.0 == i).map(|e| (e.1, e.2)))
            .collect();
        let needs: BTreeSet<String> = all
            .iter()
            .filter(|(_, n)| *n)
            .map(|(d, _)| format!("s{d}"))
            .collect();
        let refs: Vec<String> = all
            .iter()
            .filter(|(_, n)| !*n)
            .map(|(d, _)| format!("{{{{ steps.s{d}.output }}}}"))
            .collect();
        let needs: Vec<String> = needs.into_iter().map(|n| format!("\"{n}\"")).collect();
        let value = format!("step {i} {}", refs.join(" "));
        if toml {
            out.push_str(&format!("[[steps]]\nid = \"s{i}\"\ntool = \"echo\"\nneeds = [{}]\nwith = {{ v = \"{value}\" }}\n", needs.join(", ")));
        } else {
            out.push_str(&format!(
                "  - id: s{i}\n    tool: echo\n    needs: [{}]\n    with: {{ v: \"{value}\" }}\n",
                needs.join(", ")
            ));
        }
    }
    out
}

fn edges(dag: &Dag, extra: &[(usize, usize, bool)]) -> BTreeSet<(usize, usize)> {
    dag.deps
        .iter()
        .enumerate()
        .flat_map(|(i, deps)| deps.iter().map(move |(d, _)| (i, *d)))
        .chain(extra.iter().map(|e| (e.0, e.1)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_dags_validate_with_a_topological_order(dag in dag(), toml in any::<bool>()) {
        let name = if toml { "random.toml" } else { "random.yaml" };
        let validation = validate_source(Path::new(name), render(&dag, &[], toml));
        prop_assert!(validation.diagnostics.is_empty(), "{:?}", validation.diagnostics);
        let workflow = validation.workflow.expect("valid");
        let mut position = vec![usize::MAX; dag.deps.len()];
        for (at, step) in workflow.order.iter().enumerate() {
            position[*step] = at;
        }
        prop_assert!(position.iter().all(|p| *p != usize::MAX), "every step is ordered once");
        let expected = edges(&dag, &[]);
        for (step, deps) in workflow.dependencies.iter().enumerate() {
            for dep in deps {
                prop_assert!(expected.contains(&(step, *dep)), "unexpected edge {step} -> {dep}");
                prop_assert!(position[*dep] < position[step], "s{dep} must come before s{step}");
            }
        }
        let found: usize = workflow.dependencies.iter().map(Vec::len).sum();
        prop_assert_eq!(found, expected.len());
    }

    #[test]
    fn injected_cycles_are_reported_with_a_real_path(
        dag in dag().prop_filter("needs two steps", |d| d.deps.len() >= 2),
        pick in any::<(prop::sample::Index, prop::sample::Index)>(),
        via_needs in any::<bool>(),
        toml in any::<bool>(),
    ) {
        let n = dag.deps.len();
        let (a, b) = (pick.0.index(n), pick.1.index(n));
        let (early, late) = (a.min(b), a.max(b));
        // A back edge: an early step depends on a later one that (transitively or not) follows it.
        // Make sure a path late -> ... -> early exists by also adding the forward edge late -> early.
        let extra = vec![(early, late, via_needs), (late, early, !via_needs)];
        let name = if toml { "cyclic.toml" } else { "cyclic.yaml" };
        let validation = validate_source(Path::new(name), render(&dag, &extra, toml));
        let cycles: Vec<&String> = validation.diagnostics.iter().filter(|d| d.code == "archon::cycle").map(|d| &d.message).collect();
        prop_assert!(!cycles.is_empty(), "no cycle reported: {:?}", validation.diagnostics);
        let all_edges = edges(&dag, &extra);
        for message in cycles {
            let path: Vec<usize> = message
                .trim_start_matches("dependency cycle: ")
                .split(" → ")
                .map(|s| s.trim_matches('`').trim_start_matches('s').parse().expect("step name"))
                .collect();
            prop_assert!(path.len() >= 2 && path.first() == path.last(), "not a closed path: {message}");
            for w in path.windows(2) {
                prop_assert!(all_edges.contains(&(w[0], w[1])), "{message}: s{} does not depend on s{}", w[0], w[1]);
            }
        }
        prop_assert!(validation.workflow.is_none());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Random DAGs run every step exactly once, each after all of its dependencies finished.
    #[test]
    fn random_dags_run_every_step_once_in_dependency_order(dag in dag(), parallel in 1usize..6) {
        use archon_engine::run::{self, RunEvent, RunOptions, RunStatus};
        let validation = validate_source(Path::new("random.yaml"), render(&dag, &[], false));
        let workflow = validation.workflow.expect("valid");
        let dependencies = workflow.dependencies.clone();
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        let options = RunOptions {
            max_parallel: parallel,
            protected: Vec::new(),
            workdir: std::env::temp_dir(),
            run_id: "prop".into(),
            cancel: tokio_util::sync::CancellationToken::new(),
            events: Some(sender),
            env: Default::default(),
            journal: Arc::new(archon_engine::store::MemoryJournal),
            prior: Default::default(),
            cassette: None,
            checkpoints: Default::default(),
            approvals: Default::default(),
            helper: Some(env!("CARGO_BIN_EXE_archon").into()),
            cache: Default::default(),
            memory_dir: None,
            memory: Default::default(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let report = runtime
            .block_on(run::run(Arc::new(workflow), Default::default(), options))
            .expect("run starts");
        prop_assert_eq!(report.status, RunStatus::Succeeded);
        // One ordered log: a step's start must come after the end of every step it depends on.
        let mut log: Vec<(bool, usize)> = Vec::new();
        let index = |id: &str| id.trim_start_matches('s').parse::<usize>().expect("step id");
        while let Ok(event) = receiver.try_recv() {
            match event {
                RunEvent::StepStarted { step } => log.push((true, index(&step))),
                RunEvent::StepFinished { step, .. } => log.push((false, index(&step))),
                _ => {}
            }
        }
        let mut started: Vec<usize> = log.iter().filter(|(start, _)| *start).map(|(_, s)| *s).collect();
        started.sort_unstable();
        prop_assert_eq!(started, (0..dag.deps.len()).collect::<Vec<_>>(), "every step starts exactly once");
        let at = |start: bool, step: usize| log.iter().position(|e| *e == (start, step)).expect("logged");
        for (step, deps) in dependencies.iter().enumerate() {
            for &dep in deps {
                prop_assert!(at(false, dep) < at(true, step), "s{} started before s{} finished", step, dep);
            }
        }
    }
}
