//! Issue 18, item 4: a step asks several agents the same question (`ask`) and resolves their answers
//! (`consensus`: `vote`, `judge`, `first`), each agent with a scripted provider of its own.

use archon_engine::run::{RunEvent, RunStatus, StepStatus};
use serde_json::{Value as Json, json};
use tempfile::TempDir;

use crate::agent::run_agent;
use crate::support::{Output, archon};

/// A workflow with one mock provider per agent (`(agent, turns)`: the turns as YAML flow items) and
/// `step` as its only step.
fn spec(agents: &[(&str, &str)], step: &str) -> String {
    let mut yaml = String::from("name: consensus\nllm:\n  providers:\n");
    for (agent, turns) in agents {
        yaml.push_str(&format!(
            "    p_{agent}: {{ kind: mock, turns: [{turns}] }}\n"
        ));
    }
    yaml.push_str("agents:\n");
    for (agent, _) in agents {
        yaml.push_str(&format!(
            "  {agent}: {{ provider: p_{agent}, description: reviewer {agent} }}\n"
        ));
    }
    yaml.push_str(&format!("steps:\n{step}"));
    yaml
}

const SCHEMA: &str = "{ type: object, properties: { verdict: { type: string }, why: { type: string } }, required: [verdict, why] }";

fn review(ask: &str, consensus: &str) -> String {
    format!(
        "  - id: review\n    goal: is the change safe?\n    output_schema: {SCHEMA}\n    ask: {ask}\n    consensus: {consensus}\n"
    )
}

fn answer(verdict: &str, why: &str) -> String {
    format!("{{ text: '{{\"verdict\": \"{verdict}\", \"why\": \"{why}\"}}' }}")
}

fn consensus_events(events: &[RunEvent]) -> Vec<(String, String, Option<String>, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Consensus {
                step,
                by,
                winner,
                summary,
            } => Some((step.clone(), by.clone(), winner.clone(), summary.clone())),
            _ => None,
        })
        .collect()
}

fn statuses(result: &archon_engine::run::StepResult) -> Vec<(String, StepStatus, Option<String>)> {
    result
        .steps
        .iter()
        .map(|(name, r)| (name.clone(), r.status, r.error.clone()))
        .collect()
}

#[tokio::test]
async fn a_vote_of_three_agents_two_of_which_agree_gives_the_majoritys_first_answer() {
    let dir = TempDir::new().expect("tempdir");
    let (a, b, c) = (
        answer("unsafe", "a found a race"),
        answer("safe", "b saw tests"),
        answer("unsafe", "c found the same race"),
    );
    let yaml = spec(
        &[("a", &a), ("b", &b), ("c", &c)],
        &review("[a, b, c]", "{ by: vote, field: verdict }"),
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    let review = &report.steps["review"];
    assert_eq!(review.status, StepStatus::Succeeded, "{review:?}");
    assert_eq!(
        review.output,
        json!({ "verdict": "unsafe", "why": "a found a race" })
    );
    assert_eq!(
        review.steps.keys().collect::<Vec<_>>(),
        ["ask.a", "ask.b", "ask.c", "consensus"]
    );
    assert_eq!(
        review.steps["ask.b"].output,
        json!({ "verdict": "safe", "why": "b saw tests" }),
        "every answer is in the record"
    );
    assert_eq!(
        review.steps["ask.c"].output,
        json!({ "verdict": "unsafe", "why": "c found the same race" })
    );
    assert_eq!(
        review.steps["consensus"].output,
        json!({
            "by": "vote",
            "field": "verdict",
            "answers": { "a": "succeeded", "b": "succeeded", "c": "succeeded" },
            "votes": [
                { "value": "unsafe", "agents": ["a", "c"] },
                { "value": "safe", "agents": ["b"] }
            ],
            "tie": false,
            "winner": "a"
        })
    );
    let summary = "vote on `verdict`: `\"unsafe\"` 2 (a, c), `\"safe\"` 1 (b); `\"unsafe\"` wins, with the answer of `a`";
    assert_eq!(
        consensus_events(&events),
        [(
            "review".to_owned(),
            "vote".to_owned(),
            Some("a".to_owned()),
            summary.to_owned()
        )]
    );
    assert_eq!(review.steps["consensus"].text, summary);
    // One model call each, all counted against the step.
    assert_eq!(review.llm.as_ref().map(|l| l.calls), Some(3));
    assert_eq!(report.llm.as_ref().map(|l| l.calls), Some(3));
}

#[tokio::test]
async fn a_tied_vote_goes_to_the_value_given_first_in_ask_order_and_a_failed_agent_casts_no_vote() {
    let dir = TempDir::new().expect("tempdir");
    // `d` answers with no JSON three times (its answer and two corrections): no valid answer, no vote.
    let bad = "{ text: nope }, { text: nope }, { text: nope }";
    let (a, b, c, d) = (
        answer("safe", "a"),
        answer("unsafe", "b"),
        answer("unsafe", "c"),
        answer("safe", "d"),
    );
    // `ask` order: d, b, x, a, c: `safe` (d, a) and `unsafe` (b, c) tie, and `d` gave `safe` first.
    let yaml = spec(
        &[("a", &a), ("b", &b), ("c", &c), ("d", &d), ("x", bad)],
        &review("[d, b, x, a, c]", "{ by: vote, field: verdict }"),
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    let review = &report.steps["review"];
    assert_eq!(review.status, StepStatus::Succeeded, "{review:?}");
    assert_eq!(review.output, json!({ "verdict": "safe", "why": "d" }));
    assert_eq!(
        review.steps["ask.x"].status,
        StepStatus::Failed,
        "{:?}",
        review.steps["ask.x"]
    );
    assert_eq!(
        review.steps["consensus"].output,
        json!({
            "by": "vote",
            "field": "verdict",
            "answers": { "d": "succeeded", "b": "succeeded", "x": "failed", "a": "succeeded", "c": "succeeded" },
            "votes": [
                { "value": "safe", "agents": ["d", "a"] },
                { "value": "unsafe", "agents": ["b", "c"] }
            ],
            "tie": true,
            "winner": "d"
        })
    );
    let error = review.steps["ask.x"].error.clone().unwrap_or_default();
    assert_eq!(
        consensus_events(&events)[0].3,
        format!(
            "vote on `verdict`: `\"safe\"` 2 (d, a), `\"unsafe\"` 2 (b, c); `\"safe\"` wins the tie (given first), with the answer of `d`; no valid answer from `x`: {error}"
        )
    );
}

#[tokio::test]
async fn a_judge_reads_every_answer_as_data_and_gives_the_steps_answer() {
    let dir = TempDir::new().expect("tempdir");
    let (a, b) = (answer("safe", "a"), answer("unsafe", "b: a race"));
    // The judge answers only when it was shown both answers, each under its agent's name, as data.
    let judge = r#"{ match: "Answer of `a`:\n<tool_output>\n{\"verdict\":\"safe\",\"why\":\"a\"}\n</tool_output>\n\nAnswer of `b`:\n<tool_output>\n{\"verdict\":\"unsafe\",\"why\":\"b: a race\"}\n</tool_output>", text: '{"verdict": "unsafe", "why": "b found a race that a missed"}' }"#;
    let yaml = spec(
        &[("a", &a), ("b", &b), ("j", judge)],
        &review("[a, b]", "{ by: judge, judge: j }"),
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    let review = &report.steps["review"];
    assert_eq!(review.status, StepStatus::Succeeded, "{review:?}");
    assert_eq!(
        review.output,
        json!({ "verdict": "unsafe", "why": "b found a race that a missed" })
    );
    assert_eq!(
        review.steps.keys().collect::<Vec<_>>(),
        ["ask.a", "ask.b", "judge.j", "consensus"]
    );
    assert_eq!(review.steps["judge.j"].output, review.output);
    assert_eq!(
        review.steps["consensus"].output,
        json!({ "by": "judge", "judge": "j", "answers": { "a": "succeeded", "b": "succeeded" } })
    );
    assert_eq!(
        consensus_events(&events),
        [(
            "review".to_owned(),
            "judge".to_owned(),
            None,
            "judge `j` gave the answer after reading those of `a`, `b`".to_owned()
        )]
    );
    assert_eq!(review.llm.as_ref().map(|l| l.calls), Some(3));
}

#[tokio::test]
async fn the_first_valid_answer_wins_and_the_agent_still_at_work_is_cancelled() {
    let dir = TempDir::new().expect("tempdir");
    // `slow` calls a command that never ends by itself: it can answer only if it is not cancelled.
    // `bad` answers with no JSON three times: no valid answer. `good` answers at once.
    let slow = "{ tool_calls: [{ name: wait, arguments: {} }] }, { text: '{\"verdict\": \"safe\", \"why\": \"slow\"}' }";
    let bad = "{ text: nope }, { text: nope }, { text: nope }";
    let good = "{ tool_calls: [{ name: calculator, arguments: { expression: \"1 + 1\" } }] }, { text: '{\"verdict\": \"safe\", \"why\": \"good\"}' }";
    let mut yaml = spec(
        &[("slow", slow), ("bad", bad), ("good", good)],
        &review("[slow, bad, good]", "{ by: first }"),
    );
    yaml = yaml.replace(
        "  slow: { provider: p_slow,",
        "  slow: { tools: [wait], provider: p_slow,",
    );
    yaml = yaml.replace(
        "  good: { provider: p_good,",
        "  good: { tools: [calculator], provider: p_good,",
    );
    yaml = yaml.replace(
        "agents:\n",
        "tools:\n  wait:\n    description: Waits\n    command: [sleep, \"600\"]\n    parameters: { type: object, properties: {} }\nagents:\n",
    );
    let started = std::time::Instant::now();
    let (report, events) = run_agent(dir.path(), &yaml).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "the waiting command was stopped"
    );
    let review = &report.steps["review"];
    assert_eq!(review.status, StepStatus::Succeeded, "{review:?}");
    assert_eq!(review.output, json!({ "verdict": "safe", "why": "good" }));
    let bad_error = review.steps["ask.bad"].error.clone();
    assert_eq!(
        statuses(review),
        [
            (
                "ask.slow".to_owned(),
                StepStatus::Cancelled,
                Some("cancelled: `good` gave a valid answer first".to_owned())
            ),
            ("ask.bad".to_owned(), StepStatus::Failed, bad_error.clone()),
            ("ask.good".to_owned(), StepStatus::Succeeded, None),
            ("consensus".to_owned(), StepStatus::Succeeded, None),
        ]
    );
    assert_eq!(
        review.steps["consensus"].output,
        json!({ "by": "first", "answers": { "slow": "cancelled", "bad": "failed", "good": "succeeded" }, "winner": "good" })
    );
    assert_eq!(
        consensus_events(&events),
        [(
            "review".to_owned(),
            "first".to_owned(),
            Some("good".to_owned()),
            format!(
                "`good` gave the first valid answer; cancelled `slow`; no valid answer from `bad`: {}",
                bad_error.unwrap_or_default()
            )
        )]
    );
}

#[tokio::test]
async fn with_no_valid_answer_the_step_fails_naming_each_agents_problem() {
    let dir = TempDir::new().expect("tempdir");
    let bad = "{ text: nope }, { text: nope }, { text: nope }";
    let yaml = spec(
        &[("a", bad), ("b", bad)],
        &review("[a, b]", "{ by: first }"),
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    let review = &report.steps["review"];
    assert_eq!(review.status, StepStatus::Failed);
    assert_eq!(report.status, RunStatus::Failed);
    let problem = review.steps["ask.a"].error.clone().unwrap_or_default();
    assert_eq!(
        review.error.as_deref(),
        Some(
            format!(
                "none of the 2 agents asked gave a valid answer (`a`: {problem}; `b`: {problem})"
            )
            .as_str()
        )
    );
    assert_eq!(
        review.steps.keys().collect::<Vec<_>>(),
        ["ask.a", "ask.b"],
        "each failure is in the record"
    );
    assert!(consensus_events(&events).is_empty());
}

#[tokio::test]
async fn the_agents_asked_share_the_steps_budget_of_model_turns() {
    let dir = TempDir::new().expect("tempdir");
    let calc = "{ tool_calls: [{ name: calculator, arguments: { expression: \"1 + 1\" } }] }";
    let turns = format!("{calc}, {calc}, {calc}, {}", answer("safe", "done"));
    let mut yaml = spec(
        &[("a", &turns), ("b", &turns)],
        &review("[a, b]", "{ by: vote, field: verdict }"),
    );
    yaml = yaml.replace("provider: p_a,", "tools: [calculator], provider: p_a,");
    yaml = yaml.replace("provider: p_b,", "tools: [calculator], provider: p_b,");
    // Each needs 4 turns; the step has 3 for both: neither can answer, whichever takes more of them.
    yaml.push_str("    max_iterations: 3\n");
    let (report, _) = run_agent(dir.path(), &yaml).await;
    let review = &report.steps["review"];
    assert_eq!(review.status, StepStatus::Incomplete, "{review:?}");
    assert_eq!(review.llm.as_ref().map(|l| l.calls), Some(3));
    for agent in ["a", "b"] {
        let asked = &review.steps[&format!("ask.{agent}")];
        let error = asked.error.clone().unwrap_or_default();
        assert_eq!(asked.status, StepStatus::Incomplete);
        assert!(
            error.starts_with(&format!(
                "the step's budget of 3 model turns ran out in `{agent}` (chain `the step → {agent}`; turns: "
            )),
            "{error}"
        );
    }
    let error = review.error.clone().unwrap_or_default();
    assert!(
        error.starts_with("none of the 2 agents asked gave a valid answer (`a`: the step's budget of 3 model turns ran out in `a`"),
        "{error}"
    );
}

const PAUSING: &str = r#"name: pausing
llm:
  providers:
    p_a: { kind: mock, script: a.yaml }
    p_b: { kind: mock, script: b.yaml }
tools:
  note:
    description: Notes something
    command: [sh, -c, "echo $0 >> effects.txt", "{{ who }}"]
    parameters: { type: object, properties: { who: { type: string } }, required: [who] }
agents:
  a: { provider: p_a, tools: [note] }
  b: { provider: p_b, tools: [note] }
rules:
  - { name: ask-b, on: before_tool, match: { tool: note, agent: b }, action: ask }
steps:
  - id: review
    goal: is the change safe?
    output_schema: { type: object, properties: { verdict: { type: string } }, required: [verdict] }
    ask: [a, b]
    consensus: { by: vote, field: verdict }
"#;

/// An agent that waits for a person pauses the step once the others have answered; after `approve`,
/// `resume` does not ask the agent that already answered again (its scripted provider has nothing left
/// to say by then), and the waiting one goes on from its checkpoint.
#[test]
fn a_resumed_step_does_not_ask_again_the_agents_that_answered() {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path();
    std::fs::write(path.join("pausing.yaml"), PAUSING).expect("write");
    std::fs::write(
        path.join("a.yaml"),
        "- tool_calls: [{ name: note, arguments: { who: a } }]\n- text: '{\"verdict\": \"safe\"}'\n",
    )
    .expect("write");
    std::fs::write(
        path.join("b.yaml"),
        "- tool_calls: [{ name: note, arguments: { who: b } }]\n",
    )
    .expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(path, &["run", "pausing.yaml", "--no-input", "--json"]);
    assert_eq!(code, 3, "the run waits for approval: {stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    let id = report["run_id"].as_str().expect("id").to_owned();
    assert_eq!(
        report["steps"]["review"]["steps"]["ask.a"]["output"],
        json!({ "verdict": "safe" })
    );
    assert_eq!(
        report["steps"]["review"]["steps"]["ask.b"]["status"],
        "waiting_approval"
    );
    // Were `a` asked again, its provider would fail: it has no turn left. `b` answers after its call.
    std::fs::write(path.join("a.yaml"), "[]\n").expect("write");
    std::fs::write(path.join("b.yaml"), "- text: '{\"verdict\": \"safe\"}'\n").expect("write");
    let Output { code, stderr, .. } = archon(path, &["approve", &id]);
    assert_eq!(code, 0, "{stderr}");
    let Output { code, stderr, .. } = archon(path, &["resume", &id, "--no-input"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(path.join("effects.txt")).expect("noted"),
        "a\nb\n",
        "each agent's call ran once"
    );
    let Output { stdout, .. } = archon(path, &["show", &id, "--json"]);
    let shown: Json = serde_json::from_str(&stdout).expect("show");
    let review = &shown["results"]["review"];
    assert_eq!(review["status"], "succeeded", "{review}");
    assert_eq!(review["output"], json!({ "verdict": "safe" }));
    assert_eq!(
        review["steps"]["consensus"]["output"],
        json!({
            "by": "vote",
            "field": "verdict",
            "answers": { "a": "succeeded", "b": "succeeded" },
            "votes": [{ "value": "safe", "agents": ["a", "b"] }],
            "tie": false,
            "winner": "a"
        })
    );
    let Output { stdout, .. } = archon(path, &["show", &id, "--events"]);
    // The trail after the approval, each line without its time.
    let trail: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.contains("approved  review/ask.b note"))
        .filter_map(|l| l.trim_start().split_once("s  ").map(|(_, rest)| rest))
        .filter(|l| l.starts_with("resumed") || l.starts_with("consensus"))
        .collect();
    assert_eq!(
        trail,
        [
            "resumed   review/ask.a with the answer recorded earlier",
            "resumed   review/ask.b after iteration 0",
            "consensus review: vote on `verdict`: `\"safe\"` 2 (a, b); `\"safe\"` wins, with the answer of `a`",
        ],
        "{stdout}"
    );
}
