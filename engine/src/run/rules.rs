//! Interception rules (`rules:`): at each point of a run (`on`), the rules whose `match` fits the event
//! decide. Among the matching rules `deny` beats `ask` beats `allow`; `log` and `redact` add to whatever is
//! decided. With no deciding rule, a call the spec's author wrote runs, and a sensitive tool an LLM chose
//! asks (see [`Verdict::default_for`]).

use minijinja::Value;
use serde_json::{Value as Json, json};

use super::render::{Renderer, json_value};
use crate::spec::{Action, ChosenBy, Decision, Pattern, Rule, Trigger};

/// What happened, as rules see it.
#[derive(Clone, Debug)]
pub struct Event<'a> {
    pub on: Trigger,
    /// The step's name (`outer/inner` inside composite tools, sub-workflows and plans).
    pub step: Option<&'a str>,
    pub tool: Option<&'a str>,
    pub agent: Option<&'a str>,
    pub chosen_by: ChosenBy,
    /// The call's rendered arguments (a plan's document for `on_plan`, a step's output for `after_step`).
    pub args: &'a Json,
    /// `run.id`, `run.workflow`.
    pub run: &'a Json,
}

/// What the rules decided about an event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    /// `Allow`, `Deny` or `Ask`; `None` when no rule decides.
    pub decision: Option<Action>,
    /// The name (or position) of the rule that decided, and its reason.
    pub rule: Option<String>,
    pub reason: Option<String>,
    /// For `ask`: how long to wait for a person, and what happens then.
    pub timeout: Option<std::time::Duration>,
    pub approve_on_timeout: bool,
    /// Matching `log` rules, by name.
    pub logged: Vec<String>,
    /// Argument paths (`a.b`) matching `redact` rules hide in what the run records.
    pub redact: Vec<String>,
}

impl Verdict {
    /// With no deciding rule: a sensitive tool an LLM chose asks; everything else runs.
    pub fn default_for(mut self, sensitive: bool, chosen_by: ChosenBy) -> Verdict {
        if self.decision.is_none() && sensitive && chosen_by == ChosenBy::Llm {
            self.decision = Some(Action::Ask);
            self.reason =
                Some("a sensitive tool chosen by an LLM needs a person's approval".to_owned());
        }
        self
    }
}

/// The rules of a workflow, checked against events.
pub async fn evaluate(rules: &[Rule], renderer: &Renderer, event: &Event<'_>) -> Verdict {
    let mut verdict = Verdict::default();
    let mut best: Option<(u8, usize)> = None;
    for (index, rule) in rules.iter().enumerate() {
        if rule.on.value != event.on || !matches(rule, renderer, event).await {
            continue;
        }
        let name = rule
            .name
            .as_ref()
            .map_or_else(|| format!("rules[{index}]"), |n| n.value.clone());
        let rank = match rule.action.value {
            Action::Deny => 3,
            Action::Ask => 2,
            Action::Allow => 1,
            Action::Log => {
                verdict.logged.push(name);
                continue;
            }
            Action::Redact => {
                verdict.redact.extend(rule.redact.iter().cloned());
                verdict.logged.push(name);
                continue;
            }
        };
        if best.is_none_or(|(r, _)| rank > r) {
            best = Some((rank, index));
        }
    }
    if let Some((_, index)) = best {
        let rule = &rules[index];
        verdict.decision = Some(rule.action.value);
        verdict.rule = Some(
            rule.name
                .as_ref()
                .map_or_else(|| format!("rules[{index}]"), |n| n.value.clone()),
        );
        verdict.reason.clone_from(&rule.reason);
        verdict.timeout = rule.timeout.as_ref().and_then(|t| t.value.get());
        verdict.approve_on_timeout = rule
            .default
            .as_ref()
            .is_some_and(|d| d.value == Decision::Allow);
    }
    verdict
}

/// Whether `rule`'s `match` fits `event`. A condition that cannot be evaluated fits a rule that denies or
/// asks (failing closed) and not one that allows.
async fn matches(rule: &Rule, renderer: &Renderer, event: &Event<'_>) -> bool {
    let Some(m) = &rule.matcher else {
        return true;
    };
    let glob = |pattern: &Option<crate::spec::Spanned<Pattern>>, value: Option<&str>| {
        pattern
            .as_ref()
            .is_none_or(|p| value.is_some_and(|v| names(v).iter().any(|n| p.value.matches(n))))
    };
    if !glob(&m.tool, event.tool) || !glob(&m.step, event.step) || !glob(&m.agent, event.agent) {
        return false;
    }
    if m.chosen_by
        .as_ref()
        .is_some_and(|c| c.value != event.chosen_by)
    {
        return false;
    }
    let Some(condition) = &m.condition else {
        return true;
    };
    let chosen_by = match event.chosen_by {
        ChosenBy::Llm => "llm",
        ChosenBy::Spec => "spec",
    };
    let ctx = Value::from(std::collections::BTreeMap::from([
        ("args", json_value(event.args)),
        ("step", Value::from(event.step.unwrap_or_default())),
        ("tool", Value::from(event.tool.unwrap_or_default())),
        ("agent", Value::from(event.agent.unwrap_or_default())),
        ("run", json_value(event.run)),
        ("chosen_by", Value::from(chosen_by)),
    ]));
    match renderer.condition(&condition.value, &ctx).await {
        Ok(fits) => fits,
        Err(_) => matches!(rule.action.value, Action::Deny | Action::Ask),
    }
}

/// The names a step label answers to: as written (`outer[2]/inner`), without item indexes
/// (`outer/inner`), and the last part in both forms (`inner`), so that a rule naming a `foreach` step
/// applies to each of its items and one naming a step applies inside composite tools, sub-workflows and
/// plans.
fn names(label: &str) -> Vec<String> {
    let plain = |s: &str| {
        s.split('/')
            .map(|part| part.split('[').next().unwrap_or(part))
            .collect::<Vec<_>>()
            .join("/")
    };
    let last = label.rsplit('/').next().unwrap_or(label);
    let mut names = vec![label.to_owned(), plain(label), last.to_owned(), plain(last)];
    names.dedup();
    names
}

/// The arguments as recorded: values at the `redact` paths replaced by `***`.
pub fn redacted_args(args: &Json, paths: &[String]) -> Json {
    let mut args = args.clone();
    for path in paths {
        let mut node = &mut args;
        let mut parts = path.split('.').peekable();
        while let Some(part) = parts.next() {
            // `argv.1`: a position in a list.
            let next = match node {
                Json::Array(items) => part.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
                other => other.get_mut(part),
            };
            let Some(next) = next else {
                break;
            };
            if parts.peek().is_none() {
                *next = json!(super::redact::MASK);
                break;
            }
            node = next;
        }
    }
    args
}
