//! A workflow's steps drawn as SVG by the server: one column per wave of the plan (`archon plan`'s
//! waves: a step's wave is one more than the latest of its dependencies'), an arrow from each
//! dependency to its dependent, each node with its step's id and its status as a word and a symbol, so
//! that the drawing reads without colour. The page's script changes a node's status class and word as
//! events arrive (`data-step` names the step).

use std::fmt::Write as _;

use archon_engine::plan::Plan;

use super::{escape, status_class, status_label, status_symbol, truncated};

const NODE_W: usize = 190;
const NODE_H: usize = 50;
const GAP_X: usize = 60;
const GAP_Y: usize = 14;
const PAD: usize = 12;
/// Room above the nodes for the waves' labels.
const HEADER: usize = 22;
/// Most steps drawn: a larger workflow is listed in the steps table only.
pub const MAX_DRAWN: usize = 400;
/// Most characters of a step's id in its node (the whole id is in the node's title).
const ID_CHARS: usize = 22;

/// The plan's graph, each step's node in the status `status_of` gives it.
pub fn svg(plan: &Plan, status_of: &dyn Fn(&str) -> String) -> String {
    if plan.steps.is_empty() {
        return String::new();
    }
    if plan.steps.len() > MAX_DRAWN {
        return format!(
            r#"<p class="note">{} steps are too many to draw (at most {MAX_DRAWN}): the steps table lists them.</p>"#,
            plan.steps.len()
        );
    }
    let rows = plan.waves.iter().map(Vec::len).max().unwrap_or(1);
    let width = PAD * 2 + plan.waves.len() * NODE_W + plan.waves.len().saturating_sub(1) * GAP_X;
    let height = PAD * 2 + HEADER + rows * (NODE_H + GAP_Y) - GAP_Y;
    // Where each step's node is, by its index in the plan.
    let mut at = vec![(0usize, 0usize); plan.steps.len()];
    for (column, wave) in plan.waves.iter().enumerate() {
        for (row, &index) in wave.iter().enumerate() {
            at[index] = (
                PAD + column * (NODE_W + GAP_X),
                PAD + HEADER + row * (NODE_H + GAP_Y),
            );
        }
    }
    let index_of = |id: &str| plan.steps.iter().position(|s| s.id == id);
    let mut out = format!(
        r#"<figure class="graph"><div class="graph-scroll"><svg xmlns="http://www.w3.org/2000/svg" role="img" aria-labelledby="graph-title" viewBox="0 0 {width} {height}" width="{width}" height="{height}">
<title id="graph-title">The steps of {} by wave, with their status (listed below as well)</title>
<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" class="arrowhead"/></marker></defs>
"#,
        escape(&plan.workflow)
    );
    for column in 0..plan.waves.len() {
        let _ = writeln!(
            out,
            r#"<text class="wave-label" x="{}" y="{}">wave {}</text>"#,
            PAD + column * (NODE_W + GAP_X) + 4,
            PAD + 12,
            column + 1
        );
    }
    for (index, step) in plan.steps.iter().enumerate() {
        let (x2, y2) = at[index];
        for dep in &step.depends_on {
            let Some(from) = index_of(dep) else {
                continue;
            };
            let (x1, y1) = at[from];
            let (sx, sy) = (x1 + NODE_W, y1 + NODE_H / 2);
            let (ex, ey) = (x2, y2 + NODE_H / 2);
            let mid = (sx + ex) / 2;
            let _ = writeln!(
                out,
                r#"<path class="edge" d="M {sx} {sy} C {mid} {sy}, {mid} {ey}, {ex} {ey}" marker-end="url(#arrow)"/>"#
            );
        }
    }
    for (index, step) in plan.steps.iter().enumerate() {
        let (x, y) = at[index];
        let status = status_of(&step.id);
        let (shown, cut) = truncated(&step.id, ID_CHARS);
        let _ = writeln!(
            out,
            r#"<g class="node {class}" data-step="{id}"><title>{id}: {kind}, {label}</title><rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6"/><text class="node-id" x="{tx}" y="{ty1}">{shown}{more}</text><text class="node-status" x="{tx}" y="{ty2}"><tspan class="node-symbol">{symbol}</tspan> <tspan class="node-label">{label}</tspan></text></g>"#,
            class = status_class(&status),
            id = escape(&step.id),
            kind = escape(&step.kind.label()),
            label = status_label(&status),
            symbol = status_symbol(&status),
            tx = x + 10,
            ty1 = y + 20,
            ty2 = y + 39,
            shown = escape(shown),
            more = if cut { "…" } else { "" },
        );
    }
    out.push_str("</svg></div>\n");
    out.push_str(&legend());
    out.push_str("</figure>\n");
    out
}

/// What each status looks like: its swatch, symbol and word.
pub fn legend() -> String {
    let mut out = String::from(
        r#"<figcaption class="legend"><span class="visually-hidden">Legend: </span><ul>"#,
    );
    for status in [
        "pending",
        "running",
        "waiting_approval",
        "succeeded",
        "failed",
        "skipped",
        "cancelled",
        "interrupted",
    ] {
        let _ = write!(
            out,
            r#"<li><span class="swatch {}" aria-hidden="true">{}</span> {}</li>"#,
            status_class(status),
            status_symbol(status),
            status_label(status)
        );
    }
    out.push_str("</ul></figcaption>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(yaml: &str) -> Plan {
        let validation = archon_engine::validate::validate_source("w.yaml", yaml);
        Plan::new(&validation.workflow.expect("valid"))
    }

    #[test]
    fn steps_are_set_in_columns_by_wave_with_an_arrow_per_dependency() {
        let plan = plan(
            "name: w\nsteps:\n  - { id: a, tool: echo, with: {} }\n  - { id: b, tool: echo, with: {} }\n  - { id: c, tool: echo, needs: [a, b], with: {} }\n",
        );
        let drawn = svg(&plan, &|id| {
            if id == "a" { "succeeded" } else { "pending" }.to_owned()
        });
        assert_eq!(drawn.matches(r#"<g class="node"#).count(), 3);
        assert_eq!(drawn.matches(r#"<path class="edge""#).count(), 2);
        assert!(drawn.contains(r#"<g class="node status-succeeded" data-step="a"><title>a: tool echo, succeeded</title><rect x="12" y="34""#), "{drawn}");
        assert!(drawn.contains(r#"<g class="node status-pending" data-step="b"><title>b: tool echo, not started</title><rect x="12" y="98""#), "{drawn}");
        assert!(drawn.contains(r#"<g class="node status-pending" data-step="c"><title>c: tool echo, not started</title><rect x="262" y="34""#), "{drawn}");
        assert!(
            drawn.contains(r#"<path class="edge" d="M 202 59 C 232 59, 232 59, 262 59""#),
            "{drawn}"
        );
        assert!(drawn.contains(">wave 2</text>"));
    }
}
