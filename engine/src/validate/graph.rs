//! The dependency graph of a step list: cycles reported with the path that closes them, and a
//! topological order when there are none.

use petgraph::algo::{tarjan_scc, toposort};
use petgraph::graph::{DiGraph, NodeIndex};

use crate::diagnostic::{Diagnostic, codes};
use crate::spec::Step;
use crate::validate::refs::Dep;

/// Resolved dependencies of a step list.
#[derive(Debug, Default)]
pub struct Graph {
    /// For each step, the steps it depends on (sorted, no duplicates).
    pub dependencies: Vec<Vec<usize>>,
    /// A topological order (empty when there is a cycle).
    pub order: Vec<usize>,
}

/// Builds the graph from each step's dependencies and reports every cycle.
pub fn build(steps: &[Step], deps: &[Vec<Dep>], diagnostics: &mut Vec<Diagnostic>) -> Graph {
    let mut graph: DiGraph<usize, ()> =
        DiGraph::with_capacity(steps.len(), deps.iter().map(Vec::len).sum());
    let nodes: Vec<NodeIndex> = (0..steps.len()).map(|i| graph.add_node(i)).collect();
    let mut dependencies = Vec::with_capacity(steps.len());
    for (step, step_deps) in deps.iter().enumerate() {
        let mut on: Vec<usize> = step_deps.iter().map(|d| d.step).collect();
        on.sort_unstable();
        on.dedup();
        for &dep in &on {
            // Edge direction: dependency -> dependent, the order steps run in.
            graph.add_edge(nodes[dep], nodes[step], ());
        }
        dependencies.push(on);
    }
    let mut cyclic = false;
    let mut components: Vec<Vec<usize>> = tarjan_scc(&graph)
        .into_iter()
        .map(|c| {
            let mut c: Vec<usize> = c.into_iter().map(|n| graph[n]).collect();
            c.sort_unstable();
            c
        })
        .filter(|c| c.len() > 1 || dependencies[c[0]].contains(&c[0]))
        .collect();
    components.sort();
    for component in components {
        cyclic = true;
        diagnostics.push(cycle_diagnostic(steps, deps, &dependencies, &component));
    }
    let order = if cyclic {
        Vec::new()
    } else {
        toposort(&graph, None)
            .map(|o| o.into_iter().map(|n| graph[n]).collect())
            .unwrap_or_default()
    };
    Graph {
        dependencies,
        order,
    }
}

/// Finds one cycle inside a strongly connected component, starting at its first step in document order,
/// and reports it: `a` → `b` → `a` reads "a depends on b, which depends on a".
fn cycle_diagnostic(
    steps: &[Step],
    deps: &[Vec<Dep>],
    dependencies: &[Vec<usize>],
    component: &[usize],
) -> Diagnostic {
    let start = component[0];
    let path = find_cycle(start, dependencies, component).unwrap_or_else(|| vec![start, start]);
    let names: Vec<String> = path
        .iter()
        .map(|&i| format!("`{}`", steps[i].id.value))
        .collect();
    let edge_span = |from: usize, to: usize| {
        deps[from]
            .iter()
            .find(|d| d.step == to)
            .map_or(steps[from].id.span, |d| d.span)
    };
    let last = path.len() - 2;
    let closing = edge_span(path[last], path[last + 1]);
    let mut d = Diagnostic::error(codes::CYCLE, closing, format!("dependency cycle: {}", names.join(" → ")))
        .with_hint("`a` → `b` means step `a` depends on step `b` (through `needs` or a `steps.b` reference); remove one of these dependencies");
    for w in path.windows(2).take(last) {
        d = d.with_label(
            edge_span(w[0], w[1]),
            format!(
                "`{}` depends on `{}` here",
                steps[w[0]].id.value, steps[w[1]].id.value
            ),
        );
    }
    d
}

/// A path `start -> ... -> start` following "depends on" edges, staying inside `component`.
fn find_cycle(
    start: usize,
    dependencies: &[Vec<usize>],
    component: &[usize],
) -> Option<Vec<usize>> {
    let mut path = vec![start];
    let mut visited = vec![false; dependencies.len()];
    let mut stack: Vec<std::slice::Iter<'_, usize>> = vec![dependencies[start].iter()];
    while let Some(iter) = stack.last_mut() {
        match iter.next() {
            Some(&next) if next == start => {
                path.push(start);
                return Some(path);
            }
            Some(&next) if !visited[next] && component.binary_search(&next).is_ok() => {
                visited[next] = true;
                path.push(next);
                stack.push(dependencies[next].iter());
            }
            Some(_) => {}
            None => {
                stack.pop();
                path.pop();
            }
        }
    }
    None
}
