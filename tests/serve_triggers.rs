//! Triggers under `archon serve`, over the real binary and real HTTP: webhook deliveries (signed,
//! badly signed, replayed, too large, refused by the input's schema) start runs outside the server's
//! own authentication; a cron slot missed while no server ran fires once when one starts, and not again
//! after a restart; the API shows each trigger's next fire time and the firings.

use std::path::Path;

use archon_engine::session::Session;
use archon_engine::trigger::{Due, Scheduler, Timestamp, sign};
use serde_json::{Value as Json, json};
use tempfile::TempDir;

use crate::support::serve::{PATIENCE, Server, serve};
use crate::support::{Output, archon};

const HOOK_SECRET: &str = "hook-secret-0123456789";
const OPERATOR: &str = "operator-token-0123456789abcdef";

const HOOKED: &str = r#"name: hooked
secrets: [HOOK_SECRET]
inputs:
  event:
    type: object
    properties: { action: { type: string } }
    required: [action]
  scope: { type: string, default: daily }
triggers:
  - name: github
    webhook: { secret: HOOK_SECRET, input: event }
steps:
  - id: say
    tool: echo
    with: { action: "{{ inputs.event.action }}", scope: "{{ inputs.scope }}" }
outputs:
  action: "{{ steps.say.output.action }}"
"#;

const HOURLY: &str = r#"name: hourly
triggers:
  - name: every-hour
    cron: "0 * * * *"
    timezone: Europe/Paris
    catch_up: 3h
steps:
  - id: tick
    tool: echo
    with: { ticked: true }
"#;

fn workflows() -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("hooked.yaml"), HOOKED).expect("write");
    std::fs::write(dir.path().join("hourly.yaml"), HOURLY).expect("write");
    std::fs::write(dir.path().join("tokens"), format!("operator {OPERATOR}\n")).expect("write");
    dir
}

/// A server with a token file (so that the hooks are seen to need none of its tokens).
fn start(dir: &Path) -> Server {
    serve(
        dir,
        &["--token-file", "tokens"],
        &[("HOOK_SECRET", HOOK_SECRET)],
    )
}

/// Posts a delivery to `/hooks/{workflow}`: no server token, only the webhook's headers.
async fn deliver(
    server: &Server,
    workflow: &str,
    body: &[u8],
    signature: Option<&str>,
    id: &str,
) -> (u16, Json) {
    let mut request = server
        .http
        .post(format!("{}/hooks/{workflow}", server.url))
        .header("content-type", "application/json")
        .header("x-archon-delivery", id)
        .body(body.to_vec());
    if let Some(signature) = signature {
        request = request.header("x-archon-signature", signature);
    }
    let response = request.send().await.expect("answered");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Json::String(text)),
    )
}

fn firings_of(page: &Json) -> Vec<(String, String)> {
    page["firings"]
        .as_array()
        .expect("firings")
        .iter()
        .map(|f| {
            (
                f["slot"].as_str().unwrap_or_default().to_owned(),
                f["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_signed_delivery_starts_one_run_with_its_body_and_bad_ones_are_refused() {
    let dir = workflows();
    let mut server = start(dir.path());
    let body = br#"{"action":"opened","number":7}"#;
    let good = sign(HOOK_SECRET.as_bytes(), body);

    // Unauthenticated: nothing is recorded.
    let (status, answer) = deliver(&server, "hooked", body, None, "d-0").await;
    assert_eq!(status, 401, "{answer}");
    assert_eq!(
        answer,
        json!({
            "error": "the delivery is not signed",
            "hint": "send `X-Archon-Signature: sha256=<hex>` (or `X-Hub-Signature-256`)"
        })
    );
    let forged = sign(b"not the secret", body);
    let (status, answer) = deliver(&server, "hooked", body, Some(&forged), "d-0").await;
    assert_eq!(status, 401, "{answer}");
    assert_eq!(answer["error"], "the signature does not match the body");

    // Signed: a run starts with the body as its input.
    let (status, answer) = deliver(&server, "hooked", body, Some(&good), "d-1").await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["delivery"], "d-1");
    let run = answer["run_id"].as_str().expect("a run id").to_owned();
    server.token = Some(OPERATOR.to_owned());
    let detail = server
        .poll(&format!("/api/v1/runs/{run}"), |r| {
            r["status"] == "succeeded"
        })
        .await;
    assert_eq!(
        detail["inputs"],
        json!({"event": {"action": "opened", "number": 7}, "scope": "daily"})
    );
    assert_eq!(detail["outputs"], json!({"action": "opened"}));

    // The same delivery again is a replay: nothing starts.
    server.token = None;
    let (status, answer) = deliver(&server, "hooked", body, Some(&good), "d-1").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"delivery": "d-1", "replayed": true}));

    // A body its input's schema refuses, signed: 400, recorded as refused.
    let wrong = br#"{"number":7}"#;
    let signed = sign(HOOK_SECRET.as_bytes(), wrong);
    let (status, answer) = deliver(&server, "hooked", wrong, Some(&signed), "d-2").await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"],
        "the body does not match input `event`: \"action\" is a required property"
    );

    // Too large: refused before it is read whole.
    let huge = vec![b' '; archon_engine::trigger::MAX_BODY_BYTES + 1];
    let signed = sign(HOOK_SECRET.as_bytes(), &huge);
    let (status, answer) = deliver(&server, "hooked", &huge, Some(&signed), "d-3").await;
    assert_eq!(status, 413, "{answer}");
    // Unsigned, it is refused for that before a byte of it is read.
    let (status, answer) = deliver(&server, "hooked", &huge, None, "d-3").await;
    assert_eq!(
        (status, &answer["error"]),
        (401, &json!("the delivery is not signed")),
        "{answer}"
    );

    // No such webhook.
    let (status, _) = deliver(&server, "nope", body, Some(&good), "d-4").await;
    assert_eq!(status, 404);
    let (status, answer) = deliver(&server, "hourly", body, Some(&good), "d-4").await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["error"], "no webhook for workflow `hourly`");

    // The rest of the server still wants its own token.
    let (status, _) = server.get("/api/v1/firings").await;
    assert_eq!(status, 401);

    server.token = Some(OPERATOR.to_owned());
    let (status, page) = server.get("/api/v1/firings?workflow=hooked").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        firings_of(&page),
        [
            ("d-2".to_owned(), "refused".to_owned()),
            ("d-1".to_owned(), "started".to_owned())
        ]
    );
    assert_eq!(page["firings"][1]["run_id"], json!(run));
    let (_, runs) = server.get("/api/v1/runs?workflow=hooked").await;
    assert_eq!(runs["total"], 1, "{runs}");

    // The pages go one by one.
    let (_, first) = server.get("/api/v1/firings?limit=1").await;
    assert_eq!(
        firings_of(&first),
        [("d-2".to_owned(), "refused".to_owned())]
    );
    assert_eq!(first["next_offset"], 1);
    let (_, second) = server.get("/api/v1/firings?limit=1&offset=1").await;
    assert_eq!(
        firings_of(&second),
        [("d-1".to_owned(), "started".to_owned())]
    );
    assert_eq!(second.get("next_offset"), None);

    // The workflow's triggers.
    let (status, triggers) = server.get("/api/v1/workflows/hooked/triggers").await;
    assert_eq!(status, 200);
    assert_eq!(
        triggers,
        json!([{"name": "github", "kind": "webhook", "endpoint": "/hooks/hooked", "signed": true, "token": false}])
    );
}

#[tokio::test]
async fn a_slot_missed_while_no_server_ran_fires_once_at_start_and_not_again_after_a_restart() {
    let dir = workflows();
    let state = dir.path().join(".archon");
    // A server watched the trigger from 30 s into the hour before this one, then stopped: this hour's
    // slot was missed, and is within `catch_up`.
    let now = Timestamp::now().as_second();
    let hour = now - now.rem_euclid(3600);
    let armed = Timestamp::from_second(hour - 3600 + 30).expect("in range");
    {
        let validation = archon_engine::validate::validate_file(&dir.path().join("hourly.yaml"));
        let workflow = validation.workflow.expect("valid");
        let session = Session::open(&state).expect("the store opens");
        let mut scheduler = Scheduler::new();
        assert_eq!(scheduler.add(&workflow), Ok(1));
        let fired = session
            .due_firings(&mut scheduler, armed, &|_| false)
            .expect("armed");
        assert_eq!(fired, []);
    }
    let slot = Timestamp::from_second(hour)
        .expect("in range")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();

    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    server
        .wait_said("cron triggers: 1 watched, 1 missed slot fired")
        .await;
    let page = server
        .poll("/api/v1/firings?workflow=hourly", |p| {
            p["firings"].as_array().is_some_and(|f| !f.is_empty())
        })
        .await;
    assert_eq!(firings_of(&page), [(slot.clone(), "started".to_owned())]);
    let run = page["firings"][0]["run_id"]
        .as_str()
        .expect("a run")
        .to_owned();
    let detail = server
        .poll(&format!("/api/v1/runs/{run}"), |r| {
            r["status"] == "succeeded"
        })
        .await;
    assert_eq!(detail["workflow"], "hourly");

    // The next fire time: the next hour, in Paris time with its offset.
    let (_, triggers) = server.get("/api/v1/workflows/hourly/triggers").await;
    let next = triggers[0]["next_fire"].as_str().expect("a next fire time");
    let at: Timestamp = next.parse().expect("RFC 3339");
    assert_eq!(at.as_second(), hour + 3600, "{next}");
    assert!(
        next.ends_with("+01:00") || next.ends_with("+02:00"),
        "{next}"
    );
    assert_eq!(triggers[0]["cron"], "0 * * * *");
    assert_eq!(triggers[0]["timezone"], "Europe/Paris");
    assert_eq!(triggers[0]["overlap"], "skip");
    assert_eq!(triggers[0]["catch_up"], "3h");
    // The workflow's page says the same.
    let (status, page) = server.get("/workflows/hourly").await;
    assert_eq!(status, 200);
    let page = page.as_str().expect("HTML");
    let from = page
        .find(r#"<section aria-labelledby="triggers">"#)
        .expect("a triggers section");
    let to = from + page[from..].find("</section>").expect("its end");
    assert_eq!(
        &page[from..to],
        format!(
            r#"<section aria-labelledby="triggers"><h2 id="triggers">Triggers</h2><table><thead><tr><th>name</th><th>kind</th><th>when</th><th>next</th></tr></thead><tbody><tr><td><code>{name}</code></td><td>cron</td><td><code>0 * * * *</code> in Europe/Paris, overlap <code>skip</code>, missed slots within 3h caught up</td><td><time datetime="{next}">{next}</time></td></tr></tbody></table>"#,
            name = triggers[0]["name"].as_str().expect("a name"),
        )
    );
    drop(server);

    // A restart: the slot is recorded, so nothing fires again.
    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    server
        .wait_said("cron triggers: 1 watched, 0 missed slots fired")
        .await;
    let (_, page) = server.get("/api/v1/firings?workflow=hourly").await;
    assert_eq!(firings_of(&page), [(slot, "started".to_owned())]);
    let (_, runs) = server.get("/api/v1/runs?workflow=hourly").await;
    assert_eq!(runs["total"], 1, "{runs}");
}

#[tokio::test]
async fn a_firing_recorded_whose_run_never_started_starts_when_the_server_does() {
    let dir = workflows();
    let state = dir.path().join(".archon");
    let body = br#"{"action":"closed"}"#;
    // The delivery was recorded, then the server stopped before its run was created.
    let run = {
        let validation = archon_engine::validate::validate_file(&dir.path().join("hooked.yaml"));
        let workflow = validation.workflow.expect("valid");
        let env = [("HOOK_SECRET".to_owned(), HOOK_SECRET.to_owned())].into();
        let hook = archon_engine::trigger::Webhook::of(&workflow, &env)
            .expect("its secret")
            .expect("a webhook");
        let session = Session::open(&state).expect("the store opens");
        let signature = sign(HOOK_SECRET.as_bytes(), body);
        let delivery = archon_engine::trigger::Delivery {
            body,
            signature: Some(&signature),
            authorization: None,
            id: Some("early"),
        };
        match session
            .receive_delivery(&hook, &delivery, Timestamp::now())
            .expect("recorded")
        {
            archon_engine::trigger::Received::Fired(firing) => firing.run_id.expect("a run"),
            other => panic!("{other:?}"),
        }
    };
    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    let detail = server
        .poll(&format!("/api/v1/runs/{run}"), |r| {
            r["status"] == "succeeded"
        })
        .await;
    assert_eq!(detail["outputs"], json!({"action": "closed"}));
}

/// A delivery the server has no room for (`--max-runs 1 --max-queue 1`, one run going and one
/// waiting) is refused with `503` and not recorded, so that the sender's next attempt starts a run
/// rather than being taken for a replay.
#[tokio::test]
async fn a_delivery_the_full_queue_cannot_take_is_refused_unrecorded_and_runs_when_delivered_again()
{
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("held.yaml"),
        r#"name: held
secrets: [HOOK_SECRET]
inputs:
  event: { type: object }
triggers:
  - name: hook
    webhook: { secret: HOOK_SECRET, input: event }
steps:
  - id: wait
    tool: exec
    with: { argv: [sleep, "600"] }
"#,
    )
    .expect("write");
    std::fs::write(dir.path().join("tokens"), format!("operator {OPERATOR}\n")).expect("write");
    let mut server = serve(
        dir.path(),
        &[
            "--token-file",
            "tokens",
            "--max-runs",
            "1",
            "--max-queue",
            "1",
        ],
        &[("HOOK_SECRET", HOOK_SECRET)],
    );
    server.token = Some(OPERATOR.to_owned());
    let body = br#"{"n": 1}"#;
    let signature = sign(HOOK_SECRET.as_bytes(), body);
    let (status, first) = deliver(&server, "held", body, Some(&signature), "d1").await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["queued"], false);
    let (status, second) = deliver(&server, "held", body, Some(&signature), "d2").await;
    assert_eq!(status, 202, "{second}");
    assert_eq!(second["queued"], true);
    let (status, refused) = deliver(&server, "held", body, Some(&signature), "d3").await;
    assert_eq!(status, 503, "{refused}");
    assert_eq!(
        refused,
        json!({
            "error": "1 run waits in the queue already, the most it holds (`--max-queue`)",
            "hint": "the delivery is not recorded: deliver it again later",
        })
    );
    let (_, firings) = server.get("/api/v1/firings?workflow=held").await;
    assert_eq!(
        firings_of(&firings),
        [
            ("d2".into(), "started".into()),
            ("d1".into(), "started".into())
        ]
    );
    // The first run ends: the second starts, and the queue has room for the delivery sent again.
    let running = first["run_id"].as_str().expect("a run id");
    let (status, cancelled) = server
        .post(&format!("/api/v1/runs/{running}/cancel"), Json::Null)
        .await;
    assert_eq!(status, 200, "{cancelled}");
    let queued = second["run_id"].as_str().expect("a run id").to_owned();
    server
        .poll("/api/v1/queue", |queue| {
            queue
                .as_array()
                .is_some_and(|q| q.iter().all(|j| j["run_id"] != queued.as_str()))
        })
        .await;
    let (status, again) = deliver(&server, "held", body, Some(&signature), "d3").await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(again["queued"], true);
    let (_, firings) = server.get("/api/v1/firings?workflow=held").await;
    assert_eq!(
        firings_of(&firings),
        [
            ("d3".into(), "started".into()),
            ("d2".into(), "started".into()),
            ("d1".into(), "started".into())
        ]
    );
}

/// Hourly, each run queued behind the one before; its step says it started, then waits for the file
/// `go` beside it (safe to run again, so a restart resumes it).
const CHAIN: &str = r#"name: chain
triggers:
  - name: tick
    cron: "0 * * * *"
    overlap: queue
    catch_up: 5h
steps:
  - id: work
    tool: exec
    idempotent: true
    with: { argv: ["sh", "-c", "touch started-$$; while [ ! -f go ]; do sleep 0.05; done"] }
"#;

/// As `chain`, but a firing cancels the runs before it.
const REPLACE: &str = r#"name: replace
triggers:
  - name: tick
    cron: "0 * * * *"
    overlap: cancel_previous
    catch_up: 5h
steps:
  - id: work
    tool: exec
    idempotent: true
    with: { argv: ["sh", "-c", "touch started-$$; while [ ! -f go ]; do sleep 0.05; done"] }
"#;

/// A directory holding one workflow and the tokens file.
fn holding(file: &str, text: &str) -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join(file), text).expect("write");
    std::fs::write(dir.path().join("tokens"), format!("operator {OPERATOR}\n")).expect("write");
    dir
}

/// The start of the current hour, in seconds since the epoch.
fn this_hour() -> i64 {
    let now = Timestamp::now().as_second();
    now - now.rem_euclid(3600)
}

/// A cron slot as firings name it.
fn slot(second: i64) -> String {
    Timestamp::from_second(second)
        .expect("in range")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// What a server watching the triggers of `file` would have recorded `at` (seconds since the epoch)
/// before it stopped without creating any run: the engine's scheduler, on the store of `dir`.
fn recorded_at(dir: &Path, file: &str, at: i64) -> Vec<Due> {
    let validation = archon_engine::validate::validate_file(&dir.join(file));
    let workflow = validation.workflow.expect("valid");
    let session = Session::open(&dir.join(".archon")).expect("the store opens");
    let mut scheduler = Scheduler::new();
    assert_eq!(scheduler.add(&workflow), Ok(1));
    session
        .due_firings(
            &mut scheduler,
            Timestamp::from_second(at).expect("in range"),
            &|_| false,
        )
        .expect("recorded")
}

/// Each firing of a page as `{slot, outcome, run_id, reason}` (null when absent).
fn outcomes(page: &Json) -> Vec<Json> {
    page["firings"]
        .as_array()
        .expect("firings")
        .iter()
        .map(|f| {
            json!({
                "slot": f["slot"],
                "outcome": f["outcome"],
                "run_id": f.get("run_id").cloned().unwrap_or(Json::Null),
                "reason": f.get("reason").cloned().unwrap_or(Json::Null),
            })
        })
        .collect()
}

/// How many runs of the gated step have started in `dir`.
fn started(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .expect("reads")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("started-"))
        .count()
}

#[tokio::test]
async fn after_a_restart_the_queued_firings_of_a_trigger_run_one_by_one_behind_the_run_taken_up() {
    let dir = holding("chain.yaml", CHAIN);
    let hour = this_hour();
    // A server first watched the trigger three hours ago, then stopped: three slots were missed.
    assert_eq!(
        recorded_at(dir.path(), "chain.yaml", hour - 3 * 3600 + 30),
        []
    );

    // The first run goes and waits at `go`; the other two are queued behind it when the server stops.
    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    server
        .wait_said("cron triggers: 1 watched, 3 missed slots fired")
        .await;
    let (_, page) = server.get("/api/v1/firings?workflow=chain").await;
    assert_eq!(
        firings_of(&page),
        [
            (slot(hour), "queued".to_owned()),
            (slot(hour - 3600), "queued".to_owned()),
            (slot(hour - 2 * 3600), "started".to_owned()),
        ]
    );
    let runs: Vec<String> = page["firings"]
        .as_array()
        .expect("firings")
        .iter()
        .rev()
        .map(|f| f["run_id"].as_str().expect("a run").to_owned())
        .collect();
    server
        .poll(&format!("/api/v1/runs/{}", runs[0]), |r| {
            r["status"] == "running"
        })
        .await;
    assert!(
        crate::support::wait_until(PATIENCE, || started(dir.path()) == 1),
        "the first run's step never started"
    );
    let stopped = server.stop();
    assert_eq!(stopped.code(), Some(0), "{}", server.said());
    assert_eq!(
        server.said().lines().last(),
        Some("stopped: 1 run to resume and 0 queued, taken up by the next `archon serve`")
    );
    drop(server);

    // The next server resumes the first run; the two firings whose run was never created wait
    // behind it, the newer behind the older.
    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    server
        .wait_said("cron triggers: 1 watched, 0 missed slots fired")
        .await;
    server
        .poll(&format!("/api/v1/runs/{}", runs[0]), |r| {
            r["status"] == "running"
        })
        .await;
    for (i, run) in runs.iter().enumerate().skip(1) {
        let (status, body) = server.get(&format!("/api/v1/runs/{run}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["status"], "queued",
            "run `{run}` started already: {body}"
        );
        assert_eq!(
            body["queued"]["reason"],
            format!("queued behind run {}", runs[i - 1])
        );
    }
    std::fs::write(dir.path().join("go"), "").expect("write");
    let mut details = Vec::new();
    for run in &runs {
        details.push(
            server
                .poll(&format!("/api/v1/runs/{run}"), |r| {
                    r["status"] == "succeeded"
                })
                .await,
        );
    }
    for pair in details.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let ended = before["finished_at"].as_u64().expect("it ended");
        let began = after["started_at"].as_u64().expect("it started");
        assert!(
            ended <= began,
            "run `{}` started at {began}, before run `{}` ended at {ended}",
            after["id"],
            before["id"]
        );
    }
    let (_, page) = server.get("/api/v1/firings?workflow=chain").await;
    assert_eq!(page["firings"].as_array().map(Vec::len), Some(3), "{page}");
}

#[tokio::test]
async fn a_queued_firing_that_cancel_previous_replaces_is_recorded_skipped_and_never_starts() {
    let dir = holding("replace.yaml", REPLACE);
    let hour = this_hour();
    // A server watched the trigger from four hours ago, caught up three slots an hour ago (their runs
    // one after another: the first started, two queued) and stopped before it created any run.
    assert_eq!(
        recorded_at(dir.path(), "replace.yaml", hour - 4 * 3600 + 30),
        []
    );
    let recorded = recorded_at(dir.path(), "replace.yaml", hour - 3600 + 30);
    assert_eq!(
        recorded
            .iter()
            .map(|d| (d.firing.slot.clone(), d.firing.outcome.as_str()))
            .collect::<Vec<_>>(),
        [
            (slot(hour - 3 * 3600), "started"),
            (slot(hour - 2 * 3600), "queued"),
            (slot(hour - 3600), "queued"),
        ]
    );
    let runs: Vec<String> = recorded
        .iter()
        .map(|d| d.firing.run_id.clone().expect("a run"))
        .collect();

    // This hour's slot fires at start and replaces them all: the first one's run is cancelled, the two
    // queued behind it are dropped for good.
    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    server
        .wait_said("cron triggers: 1 watched, 1 missed slot fired")
        .await;
    let page = server
        .poll("/api/v1/firings?workflow=replace", |p| {
            p["firings"][1]["outcome"] != "queued" && p["firings"][2]["outcome"] != "queued"
        })
        .await;
    let new = page["firings"][0]["run_id"]
        .as_str()
        .expect("a run")
        .to_owned();
    let dropped = format!(
        "dropped from the queue before its run started: firing `{}` replaced it (overlap `cancel_previous`)",
        slot(hour)
    );
    let expected = vec![
        json!({"slot": slot(hour), "outcome": "started", "run_id": new,
            "reason": format!("cancelled run `{}`, `{}`, `{}`", runs[0], runs[1], runs[2])}),
        json!({"slot": slot(hour - 3600), "outcome": "skipped", "run_id": null, "reason": dropped}),
        json!({"slot": slot(hour - 2 * 3600), "outcome": "skipped", "run_id": null, "reason": dropped}),
        json!({"slot": slot(hour - 3 * 3600), "outcome": "started", "run_id": runs[0], "reason": null}),
    ];
    assert_eq!(outcomes(&page), expected);
    // The workflow's page says the same.
    let (status, html) = server.get("/workflows/replace").await;
    assert_eq!(status, 200);
    let html = html.as_str().expect("HTML");
    let from = html
        .find(r#"<section aria-labelledby="firings">"#)
        .expect("a firings section");
    let to = from + html[from..].find("</section>").expect("its end");
    let row = |slot: &str, outcome: &str, run: Option<&str>, why: &str| {
        let run = run.map_or_else(
            || "—".to_owned(),
            |run| format!(r#"<a href="/runs/{run}"><code>{run}</code></a>"#),
        );
        format!(
            "<tr><td><code>tick</code></td><td><code>{slot}</code></td><td>{outcome}</td><td>{run}</td><td>{why}</td></tr>"
        )
    };
    assert_eq!(
        &html[from..to],
        format!(
            r#"<section aria-labelledby="firings"><h2 id="firings">Firings</h2><p>The latest 20 at most, newest first (<code>GET /api/v1/firings?workflow=replace</code> has them all).</p><table><thead><tr><th>trigger</th><th>slot or delivery</th><th>outcome</th><th>run</th><th>why</th></tr></thead><tbody>{}{}{}{}</tbody></table>"#,
            row(
                &slot(hour),
                "started",
                Some(&new),
                &format!("cancelled run `{}`, `{}`, `{}`", runs[0], runs[1], runs[2])
            ),
            row(&slot(hour - 3600), "skipped", None, &dropped),
            row(&slot(hour - 2 * 3600), "skipped", None, &dropped),
            row(&slot(hour - 3 * 3600), "started", Some(&runs[0]), ""),
        )
    );
    server
        .poll(&format!("/api/v1/runs/{}", runs[0]), |r| {
            r["status"] == "cancelled"
        })
        .await;
    std::fs::write(dir.path().join("go"), "").expect("write");
    server
        .poll(&format!("/api/v1/runs/{new}"), |r| {
            r["status"] == "succeeded"
        })
        .await;
    for run in &runs[1..] {
        let (status, body) = server.get(&format!("/api/v1/runs/{run}")).await;
        assert_eq!(status, 404, "the dropped run `{run}` started: {body}");
    }
    let stopped = server.stop();
    assert_eq!(stopped.code(), Some(0), "{}", server.said());
    drop(server);

    // The next start finds nothing to start: the dropped firings are recorded as such.
    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    server
        .wait_said("cron triggers: 1 watched, 0 missed slots fired")
        .await;
    for run in &runs[1..] {
        let (status, body) = server.get(&format!("/api/v1/runs/{run}")).await;
        assert_eq!(status, 404, "the dropped run `{run}` started: {body}");
    }
    let (_, page) = server.get("/api/v1/firings?workflow=replace").await;
    assert_eq!(outcomes(&page), expected);
    let (_, runs_page) = server.get("/api/v1/runs?workflow=replace").await;
    assert_eq!(runs_page["total"], 2, "{runs_page}");
}

/// A webhook's run cancelled while it waits in the server's queue never starts: its firing is
/// recorded as skipped, so the next server does not start it either.
#[tokio::test]
async fn a_webhook_run_cancelled_in_the_queue_is_recorded_skipped_and_never_starts() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("held.yaml"),
        r#"name: held
secrets: [HOOK_SECRET]
inputs:
  event: { type: object }
triggers:
  - name: hook
    webhook: { secret: HOOK_SECRET, input: event }
steps:
  - id: wait
    tool: exec
    with: { argv: [sleep, "600"] }
"#,
    )
    .expect("write");
    std::fs::write(dir.path().join("tokens"), format!("operator {OPERATOR}\n")).expect("write");
    let mut server = serve(
        dir.path(),
        &["--token-file", "tokens", "--max-runs", "1"],
        &[("HOOK_SECRET", HOOK_SECRET)],
    );
    server.token = Some(OPERATOR.to_owned());
    let body = br#"{"n": 1}"#;
    let signature = sign(HOOK_SECRET.as_bytes(), body);
    let (status, first) = deliver(&server, "held", body, Some(&signature), "d1").await;
    assert_eq!(status, 202, "{first}");
    let (status, second) = deliver(&server, "held", body, Some(&signature), "d2").await;
    assert_eq!((status, &second["queued"]), (202, &json!(true)), "{second}");
    let queued = second["run_id"].as_str().expect("a run id");
    let (status, cancelled) = server
        .post(&format!("/api/v1/runs/{queued}/cancel"), Json::Null)
        .await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "dequeued");
    let (_, firings) = server.get("/api/v1/firings?workflow=held").await;
    assert_eq!(
        (
            &firings["firings"][0]["slot"],
            &firings["firings"][0]["outcome"],
            &firings["firings"][0]["reason"]
        ),
        (
            &json!("d2"),
            &json!("skipped"),
            &json!("cancelled before its run started")
        )
    );
    // One `archon cancel` drops while it waits in the server's queue never starts either.
    let (status, third) = deliver(&server, "held", body, Some(&signature), "d3").await;
    assert_eq!((status, &third["queued"]), (202, &json!(true)), "{third}");
    let third = third["run_id"].as_str().expect("a run id");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["show", third, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let shown: Json = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        (&shown["status"], &shown["reason"]),
        (
            &json!("queued"),
            &json!("waiting for a free slot on the server")
        )
    );
    let Output { code, stderr, .. } = archon(dir.path(), &["cancel", third]);
    assert_eq!(code, 0, "{stderr}");
    let running = first["run_id"].as_str().expect("a run id");
    let (status, _) = server
        .post(&format!("/api/v1/runs/{running}/cancel"), Json::Null)
        .await;
    assert_eq!(status, 200);
    server
        .wait_said(&format!(
            "run `{third}` does not start: it was cancelled before it started"
        ))
        .await;
    // Once its thread has let it go, it is nowhere.
    let deadline = std::time::Instant::now() + PATIENCE;
    while server.get(&format!("/api/v1/runs/{third}")).await.0 != 404 {
        assert!(
            std::time::Instant::now() < deadline,
            "run `{third}` is still shown"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(server.stop().success());
    // Durably: nothing is left for the next start to run.
    let session = Session::open(&dir.path().join(".archon")).expect("the store opens");
    assert_eq!(
        session
            .unstarted_firings()
            .expect("read")
            .iter()
            .map(|f| f.slot.as_str())
            .collect::<Vec<_>>(),
        Vec::<&str>::new()
    );
}

/// A raw delivery to `hooked` on a connection of its own: headers announcing `body` (signed, with
/// `Expect: 100-continue`), and the first `sent` bytes of it.
async fn start_delivery(
    server: &Server,
    id: &str,
    body: &[u8],
    sent: usize,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let address = server.url.strip_prefix("http://").expect("an http URL");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connected");
    let head = format!(
        "POST /hooks/hooked HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nX-Archon-Delivery: {id}\r\nX-Archon-Signature: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len(),
        sign(HOOK_SECRET.as_bytes(), body)
    );
    stream.write_all(head.as_bytes()).await.expect("sent");
    stream.write_all(&body[..sent]).await.expect("sent");
    stream
}

/// What the server sends on `stream` up to the end of a head (`\r\n\r\n`), [`PATIENCE`] at most.
async fn head_of(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    let deadline = std::time::Instant::now() + PATIENCE;
    while !got.ends_with(b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match tokio::time::timeout(left, stream.read(&mut byte)).await {
            Ok(Ok(1)) => got.push(byte[0]),
            other => panic!(
                "no whole head ({other:?}): {}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// At most 32 delivery bodies are read at once: while 32 deliveries stall halfway through their
/// bodies, a 33rd is answered `503` without its body being read (no `100 Continue`), and once they
/// go, deliveries are taken again. A body's read begins (and takes its place) when the server answers
/// `Expect: 100-continue`: that is what the test waits for, so that each of the 32 holds its place
/// before the 33rd comes.
#[tokio::test]
async fn a_delivery_beyond_the_32_bodies_being_read_is_refused_unread() {
    let dir = workflows();
    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    let body = br#"{"action":"opened","padding":"................................"}"#;
    let mut stalled = Vec::new();
    for i in 0..32 {
        let mut stream = start_delivery(&server, &format!("stall-{i}"), body, 0).await;
        assert_eq!(head_of(&mut stream).await, "HTTP/1.1 100 Continue\r\n\r\n");
        use tokio::io::AsyncWriteExt as _;
        stream.write_all(&body[..10]).await.expect("sent");
        stalled.push(stream);
    }
    let mut refused = start_delivery(&server, "one-too-many", body, 0).await;
    let head = head_of(&mut refused).await;
    assert!(
        head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{head}"
    );
    assert!(
        head.to_lowercase().contains("\r\nconnection: close\r\n"),
        "{head}"
    );
    let mut rest = Vec::new();
    use tokio::io::AsyncReadExt as _;
    tokio::time::timeout(PATIENCE, refused.read_to_end(&mut rest))
        .await
        .expect("closed")
        .expect("read");
    let error: Json = serde_json::from_slice(&rest).expect("a JSON body");
    assert_eq!(
        error,
        json!({"error": "32 deliveries are being read already, the most at once", "hint": "deliver it again in a moment"})
    );
    // Nothing of those was recorded.
    let (_, page) = server.get("/api/v1/firings?workflow=hooked").await;
    assert_eq!(page["firings"], json!([]));
    // The stalled ones go: their places come back.
    drop(stalled);
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (status, answer) = deliver(
            &server,
            "hooked",
            body,
            Some(&sign(HOOK_SECRET.as_bytes(), body)),
            "after",
        )
        .await;
        if status == 202 {
            break;
        }
        assert_eq!(status, 503, "{answer}");
        assert!(std::time::Instant::now() < deadline, "never taken again");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The runs a cron trigger holds back behind the one going (`overlap: queue`) show as queued, with what
/// they wait for, in the API and in `archon runs` and `archon show` on the same state directory; one
/// cancelled over HTTP and one with `archon cancel` never start, not after a restart either.
#[tokio::test]
async fn queued_runs_of_a_trigger_are_shown_and_cancelled_from_the_api_and_the_cli() {
    use crate::support::{Output, archon};
    let dir = holding("chain.yaml", CHAIN);
    let hour = this_hour();
    assert_eq!(
        recorded_at(dir.path(), "chain.yaml", hour - 3 * 3600 + 30),
        []
    );
    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    server
        .wait_said("cron triggers: 1 watched, 3 missed slots fired")
        .await;
    let (_, page) = server.get("/api/v1/firings?workflow=chain").await;
    let runs: Vec<String> = page["firings"]
        .as_array()
        .expect("firings")
        .iter()
        .rev()
        .map(|f| f["run_id"].as_str().expect("a run").to_owned())
        .collect();
    server
        .poll(&format!("/api/v1/runs/{}", runs[0]), |r| {
            r["status"] == "running"
        })
        .await;

    // The API: the queue, and each run.
    let (status, queue) = server.get("/api/v1/queue").await;
    assert_eq!(status, 200);
    let shown: Vec<(Json, Json, Json)> = queue
        .as_array()
        .expect("a list")
        .iter()
        .map(|q| {
            (
                q["run_id"].clone(),
                q["reason"].clone(),
                q["position"].clone(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (
                json!(runs[1]),
                json!(format!("queued behind run {}", runs[0])),
                json!(1)
            ),
            (
                json!(runs[2]),
                json!(format!("queued behind run {}", runs[1])),
                json!(2)
            ),
        ]
    );
    let (status, detail) = server.get(&format!("/api/v1/runs/{}", runs[2])).await;
    assert_eq!(
        (status, &detail["status"]),
        (200, &json!("queued")),
        "{detail}"
    );
    assert_eq!(detail["trigger"]["name"], "tick");
    let (_, listed) = server.get("/api/v1/runs").await;
    assert_eq!(listed["queued"], queue);

    // The CLI on the same state directory.
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["runs", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let listed: Json = serde_json::from_str(&stdout).expect("json");
    let queued: Vec<(&str, &str)> = listed
        .as_array()
        .expect("a list")
        .iter()
        .filter(|r| r["status"] == "queued")
        .map(|r| {
            (
                r["id"].as_str().unwrap_or_default(),
                r["reason"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    let behind = "queued behind the run before it of trigger `tick`";
    assert_eq!(
        queued,
        [(runs[2].as_str(), behind), (runs[1].as_str(), behind)]
    );
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["show", &runs[2], "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let shown: Json = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        shown,
        json!({"id": runs[2], "workflow": "chain", "status": "queued", "queued_at": shown["queued_at"],
            "trigger": "tick", "kind": "cron", "slot": slot(hour), "reason": behind})
    );

    // One cancelled with `archon cancel`, one over HTTP.
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["cancel", &runs[2]]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        format!(
            "run {} is cancelled: it was queued and never starts\n",
            runs[2]
        )
    );
    let (status, cancelled) = server
        .post(&format!("/api/v1/runs/{}/cancel", runs[1]), Json::Null)
        .await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "dequeued");
    let (_, queue) = server.get("/api/v1/queue").await;
    assert_eq!(queue, json!([]));

    // The first run ends: neither starts.
    std::fs::write(dir.path().join("go"), "").expect("write");
    server
        .poll(&format!("/api/v1/runs/{}", runs[0]), |r| {
            r["status"] == "succeeded"
        })
        .await;
    server
        .wait_said(&format!(
            "run `{}` does not start: it was cancelled before it started",
            runs[2]
        ))
        .await;
    let skipped = |page: &Json| {
        outcomes(page)
            .iter()
            .take(2)
            .map(|f| (f["outcome"].clone(), f["reason"].clone()))
            .collect::<Vec<_>>()
    };
    let (_, page) = server.get("/api/v1/firings?workflow=chain").await;
    let reason = json!("cancelled before its run started");
    assert_eq!(
        skipped(&page),
        [
            (json!("skipped"), reason.clone()),
            (json!("skipped"), reason.clone())
        ]
    );
    let stopped = server.stop();
    assert_eq!(stopped.code(), Some(0), "{}", server.said());
    drop(server);

    // Nor after a restart.
    let mut server = start(dir.path());
    server.token = Some(OPERATOR.to_owned());
    server
        .wait_said("cron triggers: 1 watched, 0 missed slots fired")
        .await;
    for run in &runs[1..] {
        let (status, body) = server.get(&format!("/api/v1/runs/{run}")).await;
        assert_eq!(status, 404, "run `{run}` started: {body}");
    }
    assert_eq!(started(dir.path()), 1);
    let Output { code, stderr, .. } = archon(dir.path(), &["show", &runs[1]]);
    assert_eq!(code, 2, "{stderr}");
}

/// A delivery that stalls in its body is answered `408` once the body timeout (the header timeout)
/// passes, and its place among the bodies read comes back: 32 stalled senders do not shut the webhooks.
#[tokio::test]
async fn stalled_delivery_bodies_time_out_and_give_their_places_back() {
    let dir = workflows();
    let server = serve(
        dir.path(),
        &["--token-file", "tokens", "--header-timeout-ms", "500"],
        &[("HOOK_SECRET", HOOK_SECRET)],
    );
    let body = br#"{"action":"opened"}"#;
    let mut stalled = Vec::new();
    for i in 0..32 {
        let mut stream = start_delivery(&server, &format!("stall-{i}"), body, 0).await;
        assert_eq!(head_of(&mut stream).await, "HTTP/1.1 100 Continue\r\n\r\n");
        stalled.push(stream);
    }
    for stream in &mut stalled {
        let head = head_of(stream).await;
        assert!(
            head.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{head}"
        );
    }
    // Still open on the sender's side, they hold nothing any more.
    let (status, answer) = deliver(
        &server,
        "hooked",
        body,
        Some(&sign(HOOK_SECRET.as_bytes(), body)),
        "after",
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    drop(stalled);
}

#[tokio::test]
async fn two_specs_of_the_same_name_are_both_invalid_and_their_webhooks_do_not_fire() {
    let dir = workflows();
    std::fs::create_dir(dir.path().join("copy")).expect("mkdir");
    std::fs::write(dir.path().join("copy/again.yaml"), HOOKED).expect("write");
    let mut server = start(dir.path());
    server
        .wait_said(
            "warning: `copy/again.yaml` and `hooked.yaml` name their workflow `hooked`: none of them runs, and their triggers do not fire",
        )
        .await;
    server.token = Some(OPERATOR.to_owned());
    let (status, listed) = server.get("/api/v1/workflows").await;
    assert_eq!(status, 200, "{listed}");
    let shown: Vec<(String, bool, u64)> = listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap_or_default().to_owned(),
                w["valid"].as_bool().unwrap_or(true),
                w["errors"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("copy/again.yaml".to_owned(), false, 1),
            ("hooked.yaml".to_owned(), false, 1),
            ("hourly".to_owned(), true, 0),
        ]
    );
    let (status, detail) = server.get("/api/v1/workflows/hooked.yaml").await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(
        detail["diagnostics"],
        "error: the workflow name `hooked` is also the name of `copy/again.yaml`\n  = hint: give each workflow a name of its own: none of them runs, and their triggers do not fire, until then\n"
    );
    let page = server
        .request(reqwest::Method::GET, "/workflows")
        .send()
        .await
        .expect("answered")
        .text()
        .await
        .expect("a page");
    assert!(
        page.contains("copy/again.yaml") && page.contains("hooked.yaml"),
        "{page}"
    );
    // No webhook takes the delivery, under the name or either file; nothing is recorded.
    server.token = None;
    let body = br#"{"action":"opened"}"#;
    let good = sign(HOOK_SECRET.as_bytes(), body);
    for target in ["hooked", "hooked.yaml"] {
        let (status, answer) = deliver(&server, target, body, Some(&good), "d-1").await;
        assert_eq!(status, 404, "{target}: {answer}");
    }
    server.token = Some(OPERATOR.to_owned());
    let (_, firings) = server.get("/api/v1/firings").await;
    assert_eq!(firings, json!({"firings": []}));
    let (_, runs) = server.get("/api/v1/runs").await;
    assert_eq!(runs["total"], 0);
}

#[tokio::test]
async fn a_delivery_id_beyond_ascii_is_refused_as_malformed() {
    let dir = workflows();
    let server = start(dir.path());
    let body = br#"{"action":"opened"}"#;
    let good = sign(HOOK_SECRET.as_bytes(), body);
    let response = server
        .http
        .post(format!("{}/hooks/hooked", server.url))
        .header("content-type", "application/json")
        .header(
            "x-archon-delivery",
            reqwest::header::HeaderValue::from_bytes("d-é".as_bytes()).expect("a header"),
        )
        .header("x-archon-signature", good)
        .body(body.to_vec())
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 400);
    let answer: Json = serde_json::from_str(&response.text().await.expect("a body")).expect("JSON");
    assert_eq!(
        answer,
        json!({
            "error": "the delivery id is not 1 to 128 visible ASCII characters",
            "hint": "send `X-Archon-Delivery` as letters, digits and punctuation, without spaces"
        })
    );
}

#[tokio::test]
async fn prune_says_how_many_firings_that_started_no_run_it_deleted() {
    let dir = workflows();
    let mut server = start(dir.path());
    // A signed body its input's schema refuses: recorded as refused, no run.
    let wrong = br#"{"number":7}"#;
    let signed = sign(HOOK_SECRET.as_bytes(), wrong);
    let (status, answer) = deliver(&server, "hooked", wrong, Some(&signed), "d-1").await;
    assert_eq!(status, 400, "{answer}");
    server.stop();
    let prune = |args: &[&str]| {
        let Output {
            code,
            stdout,
            stderr,
        } = archon(dir.path(), args);
        assert_eq!(code, 0, "{stderr}");
        stdout
    };
    let said = prune(&["prune", "--older-than", "0s", "--dry-run"]);
    let (head, tail) = said.split_once(": ").expect("a size");
    assert_eq!(
        head,
        "no finished run ended more than 0s ago; would delete 1 firing that started no run (skipped or refused) recorded before then",
    );
    assert!(tail.ends_with(" B of records\n"), "{said}");
    let said = prune(&["prune", "--older-than", "0s"]);
    assert!(
        said.starts_with("no finished run ended more than 0s ago; deleted 1 firing that started no run (skipped or refused) recorded before then: "),
        "{said}"
    );
    assert_eq!(
        prune(&["prune", "--older-than", "0s"]),
        "no finished run ended more than 0s ago\n"
    );
}
