//! Issue 18, item 8: delegation made visible. `show` draws each agent step's delegation tree (who asked
//! whom, the task, the answer or error, status and cost), `show --events` sets a delegate's trail in by
//! its depth, `show --json` nests each delegate's result under its caller's, `plan` shows the agents a
//! step may reach, and `tools` the delegation tools agents are offered.

use serde_json::{Value as Json, json};
use tempfile::TempDir;

use crate::support::{Output, archon};

/// `lead` asks `researcher` (who asks `checker`), then asks `checker` itself, whose script is spent by
/// then: that delegation fails, and `lead` answers with what it has. Each delegation is a turn of its own,
/// so the order is set.
const QUIZ: &str = r#"name: quiz
llm:
  providers:
    lead_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__researcher, arguments: { task: "find the capital of France\nand say how sure you are", context: "for a quiz" } }]
        - tool_calls: [{ name: delegate__checker, arguments: { task: "check Paris" } }]
        - text: The answer is Paris
    researcher_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__checker, arguments: { task: "check that Paris is the capital of France, using every atlas and encyclopedia at hand, and say which one you used" } }]
        - text: "Paris\n(sure)"
    checker_model:
      kind: mock
      turns:
        - text: confirmed
agents:
  lead: { provider: lead_model, delegates: [researcher, checker] }
  researcher: { provider: researcher_model, description: finds facts, delegates: [checker] }
  checker: { provider: checker_model, description: checks facts }
steps:
  - { id: quiz, goal: answer the quiz, agent: lead }
"#;

/// The quiz run, in a directory of its own, and its id.
fn quiz() -> (TempDir, String) {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("quiz.yaml"), QUIZ).expect("write");
    let run = archon(dir.path(), &["run", "quiz.yaml", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report: Json = serde_json::from_str(&run.stdout).expect("report");
    let id = report["run_id"].as_str().expect("run id").to_owned();
    (dir, id)
}

fn ok(dir: &TempDir, args: &[&str]) -> String {
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), args);
    assert_eq!(code, 0, "{stderr}");
    stdout
}

macro_rules! scrubbed {
    ($text:expr, @$snapshot:literal) => {
        insta::with_settings!({ filters => vec![
            (r"\br[0-9a-f]{12,32}\b", "[RUN]"),
            (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "[TIME]"),
            (r"\b\d+ ms\b", "[MS]"),
            (r"(?m)^ *\d+\.\d{3}s", "[AT]"),
            (r"/\S*/quiz\.yaml", "[DIR]/quiz.yaml"),
        ]}, {
            insta::assert_snapshot!($text, @$snapshot);
        });
    };
}

#[test]
fn show_draws_the_delegation_tree_with_tasks_answers_errors_and_costs() {
    let (dir, id) = quiz();
    let shown = ok(&dir, &["show", &id]);
    scrubbed!(shown, @r"
    run       [RUN]
    workflow  quiz ([DIR]/quiz.yaml)
    status    succeeded
    started   [TIME]
    finished  [TIME] ([MS])

    STEP                             STATUS     ATTEMPTS  ERROR
    quiz                             succeeded  1
    quiz/researcher#1.1              succeeded  -
    quiz/researcher#1.1/checker#1.1  succeeded  -
    quiz/checker#2.1                 failed     -         provider `checker_model`: no scripted turn left for the request (last user message: `check Paris`)

    delegations:
    quiz  6 calls, 714 tokens in, 84 out
    ├─ researcher#1.1  succeeded  3 calls, 351 tokens in, 42 out, [MS]
    │  task    find the capital of France …
    │  answer  Paris …
    │  └─ checker#1.1  succeeded  1 call, 75 tokens in, 3 out, [MS]
    │     task    check that Paris is the capital of France, using every atlas and encyclopedia at hand, and say which …
    │     answer  confirmed
    └─ checker#2.1  failed  0 calls, 0 tokens in, 0 out, [MS]
       task    check Paris
       error   provider `checker_model`: no scripted turn left for the request (last user message: `check Paris`)

    working memory of agent steps, in tokens:
    STEP  LARGEST PROMPT  COMPACTS AT  WINDOW  COMPACTIONS
    quiz  121             6553         8192    0
        ");
}

#[test]
fn show_events_sets_each_delegate_in_by_its_depth() {
    let (dir, id) = quiz();
    let events = ok(&dir, &["show", &id, "--events"]);
    scrubbed!(events, @r#"
    [AT]  started   quiz
    [AT]  llm       quiz: `lead_model` (mock) 121 in, 27 out, [MS]
    [AT]  action    quiz #1: delegate.researcher {"task":"find the capital of France\nand say how sure you are","context":"for a quiz"}
    [AT]  llm         quiz/researcher#1.1: `researcher_model` (mock) 138 in, 36 out, [MS]
    [AT]  action      quiz/researcher#1.1 #1: delegate.checker {"task":"check that Paris is the capital of France, using every atlas and encyclopedia at hand, and say which one you used"}
    [AT]  llm           quiz/researcher#1.1/checker#1.1: `checker_model` (mock) 75 in, 3 out, [MS]
    [AT]  answer        quiz/researcher#1.1/checker#1.1 #1: confirmed
    [AT]  observed    quiz/researcher#1.1 #1: delegate.checker ->
                           confirmed
    [AT]  llm         quiz/researcher#1.1: `researcher_model` (mock) 138 in, 3 out, [MS]
    [AT]  answer      quiz/researcher#1.1 #2: Paris
                           (sure)
    [AT]  observed  quiz #1: delegate.researcher ->
                         Paris
                         (sure)
    [AT]  llm       quiz: `lead_model` (mock) 121 in, 10 out, [MS]
    [AT]  action    quiz #2: delegate.checker {"task":"check Paris"}
    [AT]  observed! quiz #2: delegate.checker ->
                         agent `checker` failed: provider `checker_model`: no scripted turn left for the request (last user message: `check Paris`)
    [AT]  llm       quiz: `lead_model` (mock) 121 in, 5 out, [MS]
    [AT]  answer    quiz #3: The answer is Paris
    [AT]  succeeded quiz ([MS])
        "#);
}

/// The JSON report nests each delegate's result, with its task, under its caller's, at every depth.
#[test]
fn show_json_nests_each_delegation_under_its_caller() {
    let (dir, id) = quiz();
    let mut shown: Json = serde_json::from_str(&ok(&dir, &["show", &id, "--json"])).expect("json");
    let mut quiz = shown["results"]["quiz"]["steps"].take();
    // Times are the only thing that changes from one run to the next.
    fn untimed(value: &mut Json) {
        if let Some(object) = value.as_object_mut() {
            if let Some(ms) = object.get_mut("duration_ms") {
                *ms = json!("[MS]");
            }
            object.values_mut().for_each(untimed);
        }
    }
    untimed(&mut quiz);
    let context = json!({ "window": 8192, "compact_at": 6553, "compactions": 0 });
    assert_eq!(
        quiz,
        json!({
            "researcher#1.1": {
                "status": "succeeded",
                "output": "Paris\n(sure)",
                "text": "Paris\n(sure)",
                "outputs": {},
                "error": null,
                "attempts": 1,
                "exit_code": null,
                "duration_ms": "[MS]",
                "fallback": false,
                "steps": {
                    "checker#1.1": {
                        "status": "succeeded",
                        "output": "confirmed",
                        "text": "confirmed",
                        "outputs": {},
                        "error": null,
                        "attempts": 1,
                        "exit_code": null,
                        "duration_ms": "[MS]",
                        "fallback": false,
                        "llm": {
                            "calls": 1,
                            "input_tokens": 75,
                            "output_tokens": 3,
                            "cached_input_tokens": 0,
                            "cost_usd": 0.0,
                            "unpriced_calls": 1,
                            "largest_prompt": 75,
                            "context": context
                        },
                        "task": "check that Paris is the capital of France, using every atlas and encyclopedia at hand, and say which one you used"
                    }
                },
                // Its own calls and its delegate's.
                "llm": {
                    "calls": 3,
                    "input_tokens": 351,
                    "output_tokens": 42,
                    "cached_input_tokens": 0,
                    "cost_usd": 0.0,
                    "unpriced_calls": 3,
                    "largest_prompt": 138,
                    "context": context
                },
                "task": "find the capital of France\nand say how sure you are"
            },
            "checker#2.1": {
                "status": "failed",
                "output": null,
                "text": "",
                "outputs": {},
                "error": "provider `checker_model`: no scripted turn left for the request (last user message: `check Paris`)",
                "attempts": 1,
                "exit_code": null,
                "duration_ms": "[MS]",
                "fallback": false,
                "llm": {
                    "calls": 0,
                    "input_tokens": 0,
                    "output_tokens": 0,
                    "cached_input_tokens": 0,
                    "cost_usd": 0.0,
                    "unpriced_calls": 0,
                    "context": context
                },
                "task": "check Paris"
            }
        })
    );
    // The step's own usage counts every call of its tree: its three, the researcher's three.
    assert_eq!(shown["results"]["quiz"]["llm"]["calls"], json!(6));
}

/// Agents reach others through the agents they ask, down to `defaults.max_delegation_depth`: an agent on
/// the last level is not offered its own delegates, an agent two callers may ask is shown once, and the
/// step's own agent is never asked again.
const REACH: &str = r#"name: reach
llm:
  providers:
    m: { kind: mock, turns: [ { text: done } ] }
defaults: { max_delegation_depth: 2 }
agents:
  lead: { provider: m, delegates: [planner, writer] }
  planner: { provider: m, delegates: [searcher] }
  writer: { provider: m, delegates: [searcher, { agent: editor, handoff: true }] }
  searcher: { provider: m, delegates: [fetcher] }
  editor: { provider: m, description: polishes prose, delegates: [lead] }
  fetcher: { provider: m }
  alone: { provider: m }
steps:
  - { id: write, goal: write a report, agent: lead }
  - { id: solo, goal: answer alone, agent: alone }
  - { id: inner, goal: search, agent: searcher, needs: [write] }
"#;

fn reach() -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("reach.yaml"), REACH).expect("write");
    dir
}

#[test]
fn plan_shows_the_agents_each_step_may_reach() {
    let dir = reach();
    let plan = ok(&dir, &["plan", "reach.yaml"]);
    insta::assert_snapshot!(plan, @r"
    plan for `reach`: 3 steps in 2 waves

    wave 1
      write  LLM agent
      solo   LLM agent

    wave 2
      inner  LLM agent  (after write)

    agents each step may reach by delegation (at most 2 levels deep, `defaults.max_delegation_depth`):
      write  lead
             ├─ planner
             │  └─ searcher (also asked by writer; last level: not offered `delegate.fetcher`)
             └─ writer
                └─ editor (last level: not offered `delegate.lead`)
      inner  searcher
             └─ fetcher
        ");
}

#[test]
fn json_plan_lists_each_reached_agent_with_its_depth_and_askers() {
    let dir = reach();
    let plan: Json =
        serde_json::from_str(&ok(&dir, &["plan", "reach.yaml", "--format", "json"])).expect("json");
    let plan = &plan["plan"];
    assert_eq!(plan["max_delegation_depth"], json!(2));
    assert_eq!(plan["steps"][0]["agent"], json!("lead"));
    assert_eq!(
        plan["steps"][0]["reaches"],
        json!([
            { "agent": "planner", "depth": 1, "from": ["lead"] },
            { "agent": "writer", "depth": 1, "from": ["lead"] },
            { "agent": "searcher", "depth": 2, "from": ["planner", "writer"], "beyond_depth": ["fetcher"] },
            { "agent": "editor", "depth": 2, "from": ["writer"], "beyond_depth": ["lead"] }
        ])
    );
    assert_eq!(plan["steps"][1]["agent"], json!("alone"));
    assert_eq!(plan["steps"][1].get("reaches"), None);
    assert_eq!(
        plan["steps"][2]["reaches"],
        json!([{ "agent": "fetcher", "depth": 1, "from": ["searcher"] }])
    );
}

#[test]
fn tools_lists_the_delegation_tools_and_the_agents_offered_them() {
    let dir = reach();
    let text = ok(&dir, &["tools", "reach.yaml"]);
    let section = &text[text.find("delegation tools").expect("a section")..];
    insta::assert_snapshot!(section, @r"
    delegation tools (6), one per agent another agent lists in `delegates`:

    delegate.planner  delegation, offered to lead
      Ask agent `planner` to do a task for you and return its answer: another agent of this workflow
      arguments:
        task*     string  what the agent should do, self-contained
        context   string  what it needs to know to do it

    delegate.writer  delegation, offered to lead
      Ask agent `writer` to do a task for you and return its answer: another agent of this workflow
      arguments:
        task*     string  what the agent should do, self-contained
        context   string  what it needs to know to do it

    delegate.searcher  delegation, offered to planner, writer
      Ask agent `searcher` to do a task for you and return its answer: another agent of this workflow
      arguments:
        task*     string  what the agent should do, self-contained
        context   string  what it needs to know to do it

    delegate.editor  delegation, offered to writer
      Hand this whole task over to agent `editor` (polishes prose). Its answer becomes the final answer: your turn ends.
      arguments:
        task*     string  what the agent should do, self-contained
        context   string  what it needs to know to do it

    delegate.fetcher  delegation, offered to searcher
      Ask agent `fetcher` to do a task for you and return its answer: another agent of this workflow
      arguments:
        task*     string  what the agent should do, self-contained
        context   string  what it needs to know to do it

    delegate.lead  delegation, offered to editor
      Ask agent `lead` to do a task for you and return its answer: another agent of this workflow
      arguments:
        task*     string  what the agent should do, self-contained
        context   string  what it needs to know to do it
        ");
    let tools: Json =
        serde_json::from_str(&ok(&dir, &["tools", "reach.yaml", "--json"])).expect("json");
    let delegations: Vec<(&str, &Json, &str)> = tools
        .as_array()
        .expect("a list")
        .iter()
        .filter(|t| t["kind"] == "delegation")
        .map(|t| {
            assert_eq!(t["parameters"]["required"], json!(["task"]));
            (
                t["name"].as_str().unwrap_or_default(),
                &t["agents"],
                t["description"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    let asks = |agent: &str| {
        format!(
            "Ask agent `{agent}` to do a task for you and return its answer: another agent of this workflow"
        )
    };
    let (lead, planner_and_writer, writer, searcher, editor) = (
        json!(["lead"]),
        json!(["planner", "writer"]),
        json!(["writer"]),
        json!(["searcher"]),
        json!(["editor"]),
    );
    assert_eq!(
        delegations,
        [
            ("delegate.planner", &lead, asks("planner").as_str()),
            ("delegate.writer", &lead, asks("writer").as_str()),
            (
                "delegate.searcher",
                &planner_and_writer,
                asks("searcher").as_str()
            ),
            (
                "delegate.editor",
                &writer,
                "Hand this whole task over to agent `editor` (polishes prose). Its answer becomes the final answer: your turn ends."
            ),
            ("delegate.fetcher", &searcher, asks("fetcher").as_str()),
            ("delegate.lead", &editor, asks("lead").as_str()),
        ]
    );
}
