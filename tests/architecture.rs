//! The engine's module structure as ARCHITECTURE.md draws it: no module imports from a module that imports
//! it back (outside tests), read from the sources.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::support::root;

/// For each top-level module of the engine (`engine/src/<module>.rs` or `<module>/`), the other top-level
/// modules its code names through `crate::` paths, test modules left out.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("engine/src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = Vec::new();
    collect(&src, &mut files);
    for file in files {
        let relative = file.strip_prefix(&src).expect("inside engine/src");
        let module = relative
            .components()
            .next()
            .expect("a component")
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable");
        // Unit tests may reach anywhere.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let uses = graph.entry(module.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                // `use crate::{a, b::c}`: the first segment of each path in the group.
                group
                    .split('}')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .map(|p| p.trim().split("::").next().unwrap_or("").trim())
                    .collect()
            } else {
                vec![
                    rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .next()
                        .unwrap_or(""),
                ]
            };
            for name in names {
                if !name.is_empty()
                    && name != module
                    && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                {
                    uses.insert(name.to_owned());
                }
            }
        }
    }
    // Only the engine's own modules (not re-exported items such as `crate::Workflow`).
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for uses in graph.values_mut() {
        uses.retain(|m| modules.contains(m));
    }
    graph
}

fn collect(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// A path `from -> ... -> to` in the graph, if there is one.
fn path(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![from.to_owned()]];
    let mut seen = BTreeSet::new();
    while let Some(trail) = stack.pop() {
        let last = trail.last().expect("never empty").clone();
        if last == to && trail.len() > 1 {
            return Some(trail);
        }
        if !seen.insert(last.clone()) {
            continue;
        }
        for next in graph.get(&last).into_iter().flatten() {
            let mut longer = trail.clone();
            longer.push(next.clone());
            stack.push(longer);
        }
    }
    None
}

#[test]
fn no_engine_module_imports_a_module_that_imports_it_back() {
    let graph = module_graph();
    assert!(
        graph.len() > 10,
        "the engine's modules are found: {graph:?}"
    );
    let mut cycles = Vec::new();
    for module in graph.keys() {
        if let Some(cycle) = path(&graph, module, module) {
            cycles.push(cycle.join(" -> "));
        }
    }
    assert_eq!(cycles, Vec::<String>::new(), "{graph:#?}");
}

/// `run/mod.rs` only declares the runtime's modules and re-exports what they define, so that the scheduler,
/// which it re-exports, never imports an item from the file that names it (the cycle the scheduler split
/// left behind). The scheduler names the modules that define its types (`crate::report`,
/// `crate::run::options`), never `crate::run::{…}` items.
#[test]
fn the_runtime_module_file_only_declares_and_re_exports() {
    let text = std::fs::read_to_string(root().join("engine/src/run/mod.rs")).expect("readable");
    let items: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("//") && !l.trim().is_empty())
        .filter(|l| {
            !(l.starts_with("pub mod ")
                || l.starts_with("mod ")
                || l.starts_with("pub use ")
                || l.starts_with("    ")
                || l.starts_with('}'))
        })
        .collect();
    assert_eq!(items, Vec::<&str>::new());
    let mut files = Vec::new();
    collect(&root().join("engine/src/run/scheduler"), &mut files);
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).expect("readable");
            text.contains("use crate::run::{") || text.contains("crate::run::Cassette")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert_eq!(offenders, Vec::<String>::new());
}
