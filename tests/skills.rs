//! Agent Skills: the catalog an agent's prompt holds, `activate_skill` and `read_skill_file`, what an
//! active skill allows and the rules it adds, project skills and trust, and `archon skills ls`.

use std::path::Path;

use archon_engine::run::{RunEvent, RunStatus, StepStatus};
use serde_json::{Value as Json, json};
use tempfile::TempDir;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, Request};

use crate::agent::run_agent;
use crate::support::{archon, archon_with, chat_completion, root};

/// Writes a skill `name` under `dir` with `front` (front matter lines after `name:`) and `body`.
fn skill(dir: &Path, name: &str, front: &str, body: &str) -> std::path::PathBuf {
    let at = dir.join(name);
    std::fs::create_dir_all(&at).expect("mkdir");
    std::fs::write(
        at.join("SKILL.md"),
        format!("---\nname: {name}\n{front}---\n{body}\n"),
    )
    .expect("write");
    at
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// A local OpenAI-compatible server answering with `turns` in order.
async fn server(turns: Vec<Json>) -> MockServer {
    let server = MockServer::start().await;
    let next = std::sync::atomic::AtomicUsize::new(0);
    Mock::given(method("POST"))
        .respond_with(move |_: &Request| {
            let turn = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            chat_completion(
                turns
                    .get(turn)
                    .cloned()
                    .unwrap_or_else(|| json!({ "role": "assistant", "content": "out of turns" })),
            )
        })
        .mount(&server)
        .await;
    server
}

fn call(id: &str, name: &str, arguments: Json) -> Json {
    json!({ "role": "assistant", "content": null, "tool_calls": [{
        "id": id, "type": "function",
        "function": { "name": name, "arguments": arguments.to_string() }
    }] })
}

async fn bodies(server: &MockServer) -> Vec<Json> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap_or_default())
        .collect()
}

fn system_prompt(body: &Json) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn tool_names(body: &Json) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| {
                    t["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn observations(events: &[RunEvent]) -> Vec<(String, String, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AgentObservation {
                tool, text, error, ..
            } => Some((tool.clone(), text.clone(), *error)),
            _ => None,
        })
        .collect()
}

fn spec(server: &MockServer, rest: &str) -> String {
    format!(
        "name: skills\nllm:\n  providers:\n    local: {{ kind: openai, model: gpt-4o, base_url: \"{}/v1\" }}\n{rest}",
        server.uri()
    )
}

#[tokio::test]
async fn a_skill_is_listed_activated_and_its_reference_read() {
    let dir = TempDir::new().expect("tempdir");
    let at = skill(
        &dir.path().join("skills"),
        "haiku",
        "description: Writes haiku about software. Use it for any poem.\n",
        "Count syllables: 5, 7, 5. Read references/kigo.md first.",
    );
    write(&at.join("references/kigo.md"), "Use a season word.");
    let server = server(vec![
        call(
            "c1",
            "read_skill_file",
            json!({ "skill": "haiku", "path": "references/kigo.md" }),
        ),
        call("c2", "activate_skill", json!({ "name": "haiku" })),
        call(
            "c3",
            "read_skill_file",
            json!({ "skill": "haiku", "path": "references/kigo.md" }),
        ),
        call(
            "c4",
            "read_skill_file",
            json!({ "skill": "haiku", "path": "references/../SKILL.md" }),
        ),
        json!({ "role": "assistant", "content": "Autumn build runs green" }),
    ])
    .await;
    let yaml = spec(
        &server,
        "skills: [skills]\nsteps:\n  - { id: answer, goal: write a poem, max_iterations: 6 }\n",
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    assert_eq!(
        report.steps["answer"].status,
        StepStatus::Succeeded,
        "{report:?}"
    );
    let sent = bodies(&server).await;
    let system = system_prompt(&sent[0]);
    let catalog = system
        .split_once("\n\nSkills:")
        .map(|(_, c)| format!("Skills:{c}"))
        .unwrap_or_default();
    assert_eq!(
        catalog,
        "Skills: packs of instructions for particular tasks. When a task fits one's description, load its \
         instructions with `activate_skill`; then read the files they mention with `read_skill_file`.\n\
         - `haiku`: Writes haiku about software. Use it for any poem.\n"
    );
    assert_eq!(tool_names(&sent[0]), ["activate_skill", "read_skill_file"]);
    assert_eq!(
        sent[0]["tools"][0]["function"]["parameters"]["properties"]["name"]["enum"],
        json!(["haiku"])
    );
    let kigo = "<tool_output>\nUse a season word.\n</tool_output>";
    let observed = observations(&events);
    let expected = vec![
        (
            "read_skill_file".to_owned(),
            "skill `haiku` is not active: activate it with `activate_skill` first".to_owned(),
            true,
        ),
        (
            "activate_skill".to_owned(),
            "Skill `haiku` is active. Its instructions:\n\nCount syllables: 5, 7, 5. Read references/kigo.md first.\n\nIts files (read them with `read_skill_file`): references/kigo.md\n".to_owned(),
            false,
        ),
        ("read_skill_file".to_owned(), "Use a season word.".to_owned(), false),
        (
            "read_skill_file".to_owned(),
            "`references/../SKILL.md` is not a file this skill holds: give `references/<file>`, `assets/<file>` or `scripts/<file>`".to_owned(),
            true,
        ),
    ];
    assert_eq!(observed, expected);
    // The file's text reaches the model as data.
    let results: Vec<&str> = sent[3]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(results.get(2), Some(&kigo), "{results:?}");
}

#[tokio::test]
async fn a_script_runs_only_through_a_declared_tool_whose_rule_asks() {
    let dir = TempDir::new().expect("tempdir");
    let at = skill(
        &dir.path().join("skills"),
        "deploy",
        "description: Deploys the site.\nallowed-tools: publish\n",
        "Run `publish` to deploy.",
    );
    // Running the script leaves a marker; reading it must not.
    write(
        &at.join("scripts/publish.sh"),
        "#!/bin/sh\necho published > published.txt\necho ok\n",
    );
    write(
        &at.join("rules.yaml"),
        "- name: publishing-asks\n  on: before_tool\n  match: { tool: publish }\n  action: ask\n  reason: publishing needs a person\n",
    );
    let turns = [
        "        - tool_calls: [{ name: publish, arguments: {} }]",
        "        - tool_calls: [{ name: activate_skill, arguments: { name: deploy } }]",
        "        - tool_calls: [{ name: read_skill_file, arguments: { skill: deploy, path: scripts/publish.sh } }]",
        "        - tool_calls: [{ name: calculator, arguments: { expression: \"1 + 1\" } }]",
        "        - tool_calls: [{ name: publish, arguments: {} }]",
        "        - text: done",
    ]
    .join("\n");
    let yaml = format!(
        "name: deploy\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n{turns}\n\
         skills: [skills]\n\
         tools:\n  publish:\n    description: Publish the site\n    command: [sh, skills/deploy/scripts/publish.sh]\n\
         steps:\n  - {{ id: answer, goal: deploy the site, tools: [calculator], max_iterations: 8 }}\n"
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    assert_eq!(
        report.steps["answer"].status,
        StepStatus::WaitingApproval,
        "{report:?}"
    );
    assert_eq!(report.status, RunStatus::WaitingApproval);
    assert!(
        !dir.path().join("published.txt").exists(),
        "the script ran without a person's approval"
    );
    let observed: Vec<(String, bool)> = observations(&events)
        .into_iter()
        .map(|(tool, text, error)| {
            (
                format!("{tool}: {}", text.lines().next().unwrap_or_default()),
                error,
            )
        })
        .collect();
    assert_eq!(
        observed,
        [
            // Not the agent's tool until the skill extends it there.
            ("publish: unknown tool `publish`".to_owned(), true),
            ("activate_skill: Skill `deploy` is active. Its instructions:".to_owned(), false),
            // Reading a script shows its text; it does not run it.
            ("read_skill_file: #!/bin/sh".to_owned(), false),
            // The skill's `allowed-tools` narrows the agent to `publish`.
            (
                "calculator: this call was not made: `calculator` is not among the tools the active skill(s) `deploy` allow".to_owned(),
                true
            ),
        ]
    );
    let asked: Vec<(Option<String>, String)> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::ApprovalRequested { tool, reason, .. } => {
                Some((tool.clone(), reason.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        asked,
        [(
            Some("publish".to_owned()),
            "publishing needs a person".to_owned()
        )]
    );
}

#[tokio::test]
async fn a_catalog_over_budget_is_cut_at_run_time_with_a_note() {
    let dir = TempDir::new().expect("tempdir");
    let long = "description: A skill with a description long enough that two of them do not fit a small catalog, set on purpose.\n";
    skill(&dir.path().join("skills"), "long-a", long, "A.");
    skill(&dir.path().join("skills"), "long-b", long, "B.");
    let server = server(vec![json!({ "role": "assistant", "content": "done" })]).await;
    let yaml = spec(
        &server,
        "skills: [skills]\ndefaults: { skill_catalog_tokens: 90 }\nsteps:\n  - { id: answer, goal: do it }\n",
    );
    let validation = {
        write(&dir.path().join("agent.yaml"), &yaml);
        archon_engine::validate_file(&dir.path().join("agent.yaml"))
    };
    let codes: Vec<&str> = validation.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, ["archon::skill_catalog_over_budget"]);
    let (report, _) = run_agent(dir.path(), &yaml).await;
    assert_eq!(report.steps["answer"].status, StepStatus::Succeeded);
    let sent = bodies(&server).await;
    let system = system_prompt(&sent[0]);
    let catalog = system
        .split_once("`read_skill_file`.\n")
        .map(|(_, c)| c)
        .unwrap_or_default();
    assert_eq!(
        catalog,
        "- `long-a`: A skill with a description long enough that two of them do not fit a small catalog, set on purpose.\n\
         [archon: 1 more skill(s) left out of this catalog: it may take at most 90 tokens]\n"
    );
    assert_eq!(
        sent[0]["tools"][0]["function"]["parameters"]["properties"]["name"]["enum"],
        json!(["long-a"]),
        "a skill left out of the catalog cannot be activated"
    );
}

#[tokio::test]
async fn an_agent_without_skills_is_offered_no_skill_tool() {
    let dir = TempDir::new().expect("tempdir");
    let server = server(vec![json!({ "role": "assistant", "content": "done" })]).await;
    let yaml = spec(
        &server,
        "steps:\n  - { id: answer, goal: do it, tools: [calculator] }\n",
    );
    let (report, _) = run_agent(dir.path(), &yaml).await;
    assert_eq!(report.steps["answer"].status, StepStatus::Succeeded);
    let sent = bodies(&server).await;
    assert_eq!(tool_names(&sent[0]), ["calculator"]);
    assert!(!system_prompt(&sent[0]).contains("Skills:"));
}

/// A spec beside `.agents/skills/notes` that does not name it.
fn project(dir: &Path, names_it: bool) {
    skill(
        &dir.join(".agents/skills"),
        "notes",
        "description: Keeps meeting notes tidy.\n",
        "Use bullet points.",
    );
    let skills = if names_it { "skills: [notes]\n" } else { "" };
    write(
        &dir.join("flow.yaml"),
        &format!(
            "name: flow\nllm:\n  providers:\n    scripted: {{ kind: mock, turns: [{{ text: done }}] }}\n{skills}steps:\n  - {{ id: a, goal: do it }}\n"
        ),
    );
}

#[test]
fn project_skills_are_used_only_when_named_or_trusted() {
    let untrusted = TempDir::new().expect("tempdir");
    project(untrusted.path(), false);
    let config = TempDir::new().expect("tempdir");
    let env = [("XDG_CONFIG_HOME", config.path().to_str().expect("utf-8"))];
    let ls = archon_with(untrusted.path(), &["skills", "ls", "flow.yaml"], &env);
    assert_eq!(
        (ls.code, ls.stdout.as_str()),
        (0, "LLM steps without an agent: no skills\n")
    );

    let named = TempDir::new().expect("tempdir");
    project(named.path(), true);
    let ls = archon_with(named.path(), &["skills", "ls", "flow.yaml"], &env);
    assert_eq!(
        (ls.code, ls.stdout.as_str()),
        (
            0,
            "LLM steps without an agent: 1 skill(s), catalog 57 of 2000 tokens\n  notes  Keeps meeting notes tidy. [project]\n"
        )
    );

    let trusted = std::fs::canonicalize(untrusted.path()).expect("canonical");
    write(
        &config.path().join("archon/config.toml"),
        &format!(
            "[skills]\ntrusted = [\"{}\"]\n",
            trusted.join(".agents/skills").display()
        ),
    );
    let ls = archon_with(untrusted.path(), &["skills", "ls", "flow.yaml"], &env);
    assert_eq!(
        (ls.code, ls.stdout.as_str()),
        (
            0,
            "LLM steps without an agent: 1 skill(s), catalog 57 of 2000 tokens\n  notes  Keeps meeting notes tidy. [project]\n"
        )
    );
}

#[test]
fn a_broken_config_trusts_nothing_and_says_so() {
    let dir = TempDir::new().expect("tempdir");
    project(dir.path(), false);
    let config = TempDir::new().expect("tempdir");
    write(
        &config.path().join("archon/config.toml"),
        "[skills]\ntrusted = 3\n",
    );
    let env = [("XDG_CONFIG_HOME", config.path().to_str().expect("utf-8"))];
    let out = archon_with(
        dir.path(),
        &["validate", "--format", "json", "flow.yaml"],
        &env,
    );
    let report: Json = serde_json::from_str(&out.stdout).expect("json");
    let codes: Vec<&str> = report["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .filter_map(|d| d["code"].as_str())
        .collect();
    assert_eq!((out.code, codes), (0, vec!["archon::invalid_config"]));
}

#[test]
fn skills_ls_shows_what_each_agent_sees() {
    let text = archon(root(), &["skills", "ls", "workflows/skill-changelog.yaml"]);
    insta::assert_snapshot!(
        "skills_ls",
        format!("exit: {}\n{}{}", text.code, text.stdout, text.stderr)
    );
    let json = archon(
        root(),
        &["skills", "ls", "--json", "workflows/skill-changelog.yaml"],
    );
    let value: Json = serde_json::from_str(&json.stdout).expect("json");
    let writer = &value["agents"][1];
    assert_eq!(writer["agent"], "writer");
    assert_eq!(writer["catalog"]["listed"], json!(["changelog-entry"]));
    assert_eq!(writer["skills"][0]["allowed_tools"], json!(["word_count"]));
    assert_eq!(writer["skills"][0]["license"], "MIT");
}

#[tokio::test]
async fn the_bundled_skill_example_runs_offline() {
    let dir = TempDir::new().expect("tempdir");
    let from = root().join("workflows");
    let skill_dir = from.join("skills/changelog-entry");
    for file in ["SKILL.md", "references/style.md", "scripts/words.sh"] {
        let text = std::fs::read_to_string(skill_dir.join(file)).expect("read");
        write(&dir.path().join("skills/changelog-entry").join(file), &text);
    }
    let yaml = std::fs::read_to_string(from.join("skill-changelog.yaml")).expect("read");
    let (report, events) = run_agent(dir.path(), &yaml).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    let tools: Vec<String> = observations(&events)
        .into_iter()
        .map(|(t, _, _)| t)
        .collect();
    assert_eq!(tools, ["activate_skill", "read_skill_file", "word_count"]);
    assert_eq!(
        report.outputs["entry"],
        json!("**cli**: add `archon skills ls` to show what each agent sees")
    );
}

/// Regression: with skills, the agent's own tools stay callable before any skill is active, and a skill
/// without `allowed-tools` changes nothing.
#[tokio::test]
async fn an_agents_own_tools_stay_callable_beside_its_skills() {
    let dir = TempDir::new().expect("tempdir");
    skill(
        &dir.path().join("skills"),
        "maths",
        "description: Explains arithmetic.\n",
        "Show your working.",
    );
    let turns = [
        "        - tool_calls: [{ name: calculator, arguments: { expression: \"1 + 1\" } }]",
        "        - tool_calls: [{ name: activate_skill, arguments: { name: maths } }]",
        "        - tool_calls: [{ name: calculator, arguments: { expression: \"2 + 2\" } }]",
        "        - text: done",
    ]
    .join("\n");
    let yaml = format!(
        "name: maths\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n{turns}\n\
         skills: [skills]\nsteps:\n  - {{ id: answer, goal: add, tools: [calculator], max_iterations: 5 }}\n"
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    assert_eq!(
        report.steps["answer"].status,
        StepStatus::Succeeded,
        "{report:?}"
    );
    let observed: Vec<(String, bool)> = observations(&events)
        .into_iter()
        .map(|(tool, text, error)| {
            (
                format!("{tool}: {}", text.lines().next().unwrap_or_default()),
                error,
            )
        })
        .collect();
    assert_eq!(
        observed,
        [
            ("calculator: 2".to_owned(), false),
            (
                "activate_skill: Skill `maths` is active. Its instructions:".to_owned(),
                false
            ),
            ("calculator: 4".to_owned(), false),
        ]
    );
}

#[test]
fn skills_ls_without_a_spec_lists_the_project_skills_here_and_what_is_wrong() {
    let dir = TempDir::new().expect("tempdir");
    let skills = dir.path().join(".agents/skills");
    skill(
        &skills,
        "notes",
        "description: Keeps meeting notes tidy.\n",
        "Bullets.",
    );
    skill(&skills, "silent", "", "No description.");
    let ls = archon(dir.path(), &["skills", "ls"]);
    assert_eq!(
        (ls.code, ls.stdout.as_str()),
        (
            0,
            "warning: .agents/skills/silent/SKILL.md: skill `silent` has no description: it is skipped\n\
             project skills in `.agents/skills`: 1 skill(s), catalog 57 of 2000 tokens\n  notes  Keeps meeting notes tidy. [project]\n"
        )
    );
}

/// A resumed agent step still has the skills its conversation activated: the call the skill allowed,
/// which the spec's rule made wait, runs first thing once approved and resumed.
#[test]
fn a_resumed_agent_keeps_the_skills_it_activated() {
    let dir = TempDir::new().expect("tempdir");
    let at = skill(
        &dir.path().join("skills"),
        "deploy",
        "description: Deploys the site.\nallowed-tools: publish\n",
        "Run `publish` to deploy.",
    );
    write(
        &at.join("scripts/publish.sh"),
        "#!/bin/sh\necho published > published.txt\necho ok\n",
    );
    let turns = [
        "        - tool_calls: [{ name: activate_skill, arguments: { name: deploy } }]",
        "        - tool_calls: [{ name: publish, arguments: {} }]",
        "        - text: done",
    ]
    .join("\n");
    write(
        &dir.path().join("flow.yaml"),
        &format!(
            "name: deploy\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n{turns}\n\
             skills: [skills]\n\
             tools:\n  publish:\n    description: Publish the site\n    command: [sh, skills/deploy/scripts/publish.sh]\n\
             rules:\n  - {{ name: publishing-asks, on: before_tool, match: {{ tool: publish }}, action: ask }}\n\
             steps:\n  - {{ id: answer, goal: deploy the site, max_iterations: 5 }}\n"
        ),
    );
    let run = archon(dir.path(), &["run", "--no-input", "flow.yaml"]);
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    assert!(!dir.path().join("published.txt").exists());
    let approve = archon(dir.path(), &["approve", "--last"]);
    assert_eq!(approve.code, 0, "{}", approve.stderr);
    let resume = archon(dir.path(), &["resume", "--last"]);
    assert_eq!(resume.code, 0, "{}{}", resume.stdout, resume.stderr);
    let first = format!("{}{}", resume.stderr, resume.stdout)
        .lines()
        .find(|l| l.starts_with("observed"))
        .map(str::to_owned);
    assert_eq!(first.as_deref(), Some("observed  answer: publish -> ok"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("published.txt")).expect("published"),
        "published\n"
    );
}

/// In text mode the tools are written in the prompt: a tool only a skill unlocks is not there before the
/// skill is active, the activation tells it, and a resumed run still has the skill active (its
/// conversation has no tool calls to find the activation in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_text_mode_a_skill_unlocks_its_tools_in_the_prompt_and_stays_active_after_resume() {
    use wiremock::matchers::body_string_contains;
    use wiremock::{Mock, ResponseTemplate};
    let dir = TempDir::new().expect("tempdir");
    skill(
        &dir.path().join("skills"),
        "deploy",
        "description: Deploys the site.\nallowed-tools: publish\n",
        "Run `publish` to deploy.",
    );
    let server = MockServer::start().await;
    let text = |content: &str| {
        json!({
            "id": "chatcmpl-text", "object": "chat.completion", "created": 1_763_900_000, "model": "gpt-4o",
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": content }, "finish_reason": "stop" }],
            "usage": { "prompt_tokens": 100, "completion_tokens": 10 }
        })
    };
    for (priority, (seen, answer)) in (1u8..).zip([
        ("tool_output>\\npublished", "Final Answer: deployed"),
        (
            "Skill `deploy` is active",
            r#"Action: {"tool": "publish", "arguments": {}}"#,
        ),
        (
            "",
            r#"Action: {"tool": "activate_skill", "arguments": {"name": "deploy"}}"#,
        ),
    ]) {
        Mock::given(method("POST"))
            .and(body_string_contains(seen))
            .respond_with(ResponseTemplate::new(200).set_body_json(text(answer)))
            .with_priority(priority)
            .mount(&server)
            .await;
    }
    std::fs::write(
        dir.path().join("deploy.yaml"),
        format!(
            "name: deploy\nllm:\n  providers:\n    local: {{ kind: openai, model: gpt-4o, base_url: \"{}/v1\", tool_mode: text }}\n\
             skills: [skills]\n\
             tools:\n  publish:\n    description: Publish the site\n    parameters: {{ type: object, properties: {{}} }}\n    command: [sh, -c, \"echo once >> published.txt; echo published\"]\n\
             rules:\n  - {{ name: publishing, on: before_tool, match: {{ tool: publish }}, action: ask }}\n\
             steps:\n  - {{ id: answer, goal: deploy the site, max_iterations: 6 }}\n",
            server.uri()
        ),
    )
    .expect("write");
    let env = [("OPENAI_API_KEY", "sk-test")];
    let out = archon_with(dir.path(), &["run", "deploy.yaml"], &env);
    assert_eq!(out.code, 3, "{}", out.stderr);
    let sent = bodies(&server).await;
    let listed = |body: &Json| -> Vec<String> {
        system_prompt(body)
            .lines()
            .filter(|l| l.starts_with("- "))
            .map(|l| l.split(':').next().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(
        listed(&sent[0]),
        ["- `deploy`", "- activate_skill", "- read_skill_file"]
    );
    let activation = sent[1]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str())
        .find(|c| c.starts_with("Observation:"))
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        activation,
        "Observation: Skill `deploy` is active. Its instructions:\n\nRun `publish` to deploy.\n\nWhile it is active you may call only these tools (and the skill tools): `publish`\n\nTools you may call now besides the others:\n- publish: Publish the site Arguments (JSON Schema): {\"type\":\"object\",\"properties\":{}}"
    );
    let runs: Json =
        serde_json::from_str(&archon(dir.path(), &["runs", "--json"]).stdout).expect("JSON");
    let id = runs[0]["id"].as_str().expect("a run").to_owned();
    assert_eq!(archon(dir.path(), &["approve", &id]).code, 0);
    let out = archon_with(dir.path(), &["resume", &id], &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("published.txt")).expect("published"),
        "once\n"
    );
    assert_eq!(
        show_output(dir.path(), &id),
        "deployed",
        "the resumed step ran `publish` once, as the skill it had activated allows"
    );
}

fn show_output(dir: &Path, id: &str) -> Json {
    let run: Json =
        serde_json::from_str(&archon(dir, &["show", id, "--json"]).stdout).expect("JSON");
    run["results"]["answer"]["output"].clone()
}

#[test]
fn a_cached_agent_step_is_asked_again_when_a_file_of_its_skill_changes() {
    let dir = TempDir::new().expect("tempdir");
    let at = skill(
        &dir.path().join("skills"),
        "tone",
        "description: how to greet\n",
        "Read references/tone.md before greeting.",
    );
    write(
        &dir.path().join("cached.yaml"),
        r#"name: cached
llm:
  providers:
    model: { kind: mock, turns: [{ text: hello }] }
agents:
  greeter: { provider: model, skills: [skills/tone] }
steps:
  - { id: greet, goal: greet the team, agent: greeter, cache: true }
"#,
    );
    let cached = || -> bool {
        let out = archon(dir.path(), &["run", "cached.yaml"]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let run = crate::delegation::show(dir.path(), &crate::delegation::last_run(dir.path()));
        assert_eq!(run["results"]["greet"]["output"], "hello");
        !run["results"]["greet"]["cached"].is_null()
    };
    write(&at.join("references/tone.md"), "Be warm.");
    let first = [cached(), cached()];
    write(&at.join("references/tone.md"), "Be brief.");
    let after_reference = cached();
    write(&at.join("scripts/greet.sh"), "echo hello");
    let after_script = cached();
    let again = cached();
    assert_eq!(
        [first[0], first[1], after_reference, after_script, again],
        [false, true, false, false, true]
    );
}
