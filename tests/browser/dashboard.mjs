// Drives `archon serve`'s dashboard in a real headless Chromium (the system's, through playwright-core)
// for tests/serve_browser.rs, which starts the server and reads what this prints.
//
// usage: node tests/browser/dashboard.mjs SCENARIO
// environment: ARCHON_URL (the server), WORKDIR (the served directory, where files that steps wait for
// are created), SCREENSHOTS (a directory), CHROMIUM (the browser's executable), RUN (a run id, for the
// scenarios that open one).
//
// Each scenario waits for what it expects to see (never for a fixed time), takes screenshots, and prints
// one line of JSON: what it observed, which the Rust test compares exactly. Any console error in a page
// (a refused inline script or style among them) fails the scenario.

import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

// playwright-core is installed in tests/npm (scripts/install-test-deps.sh).
const { chromium } = createRequire(new URL("../npm/package.json", import.meta.url))("playwright-core");

const url = process.env.ARCHON_URL;
const workdir = process.env.WORKDIR;
const shots = process.env.SCREENSHOTS;
const scenario = process.argv[2];
const TIMEOUT = 20000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, colorScheme: "light" });
context.setDefaultTimeout(TIMEOUT);
const page = await context.newPage();
const problems = [];
// Responses a scenario expects to be refused (the browser logs each as an error).
const expectedStatuses = new Set();
page.on("console", (message) => {
  const refused = /the server responded with a status of (\d+)/.exec(message.text());
  if (refused && expectedStatuses.has(Number(refused[1]))) return;
  if (message.type() === "error") problems.push(`console: ${message.text()}`);
});
page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));

const observed = {};

// The status a step shows in the graph and in the steps table: its class and its word.
async function stepStatus(step) {
  return page.evaluate((step) => {
    const node = Array.from(document.querySelectorAll("g.node")).find((g) => g.dataset.step === step);
    const cell = Array.from(document.querySelectorAll("td.step-status")).find((td) => td.dataset.step === step);
    const statusOf = (element) =>
      element ? Array.from(element.classList).find((c) => c.startsWith("status-")) : null;
    return {
      node: statusOf(node),
      word: node ? node.querySelector(".node-label").textContent : null,
      cell: cell ? statusOf(cell.querySelector(".badge")) : null,
    };
  }, step);
}

async function waitForStep(step, status) {
  await page.waitForFunction(
    ([step, status]) => {
      const node = Array.from(document.querySelectorAll("g.node")).find((g) => g.dataset.step === step);
      const cell = Array.from(document.querySelectorAll("td.step-status")).find((td) => td.dataset.step === step);
      return node && node.classList.contains(`status-${status}`) && cell && cell.querySelector(`.badge.status-${status}`);
    },
    [step, status],
  );
  return stepStatus(step);
}

async function waitForRun(status) {
  await page.waitForSelector(`#run-status .badge.status-${status}`);
}

// Marks the document, to tell later whether what changed came live or from loading the page again.
async function mark() {
  await page.evaluate(() => {
    window.notReloaded = true;
  });
}
async function stillMarked() {
  return page.evaluate(() => window.notReloaded === true);
}

async function shot(name) {
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

const scenarios = {
  // A run started from its form, followed while it executes: its `gate` step waits for a file this
  // script creates once the page shows it running; the steps after it change state on the open page.
  async live() {
    // The run list, open before the run starts: the run appears on it and its status changes there.
    const list = await context.newPage();
    list.on("console", (message) => {
      if (message.type() === "error") problems.push(`runs page console: ${message.text()}`);
    });
    await list.goto(`${url}/runs`);
    await list.waitForSelector("#main .live-state[data-state='live']");
    await list.evaluate(() => {
      window.notReloaded = true;
    });
    await page.goto(`${url}/workflows/release`);
    await page.getByRole("button", { name: "Start a run" }).click();
    await page.waitForURL(/\/runs\/r[0-9a-f]+$/);
    observed.run = page.url().split("/").pop();
    observed.gate_running = await waitForStep("gate", "running");
    observed.publish_before = await stepStatus("publish");
    await page.waitForSelector("#main .live-state[data-state='live']");
    await mark();
    await shot("run-live");
    writeFileSync(join(workdir, "go"), "");
    observed.gate_done = await waitForStep("gate", "succeeded");
    observed.publish_done = await waitForStep("publish", "succeeded");
    await waitForRun("succeeded");
    observed.run_status = await page.textContent("#run-status");
    // The log of the step that waited, added live.
    await page.waitForFunction(() =>
      Array.from(document.querySelectorAll("#log .log-text")).some((t) => t.textContent.includes("released 1.2.3")),
    );
    observed.live_without_reload = await stillMarked();
    const row = (status) => `tr[data-run="${observed.run}"] .run-status .badge.status-${status}`;
    await list.waitForSelector(row("succeeded"));
    observed.listed = await list.evaluate(() => ({
      rows: document.querySelectorAll("tr[data-run]").length,
      count: document.querySelector(".count").textContent,
      notReloaded: window.notReloaded === true,
    }));
    await list.close();
    observed.latencies = await page.evaluate(() => window.archonLive.latencies.length > 0);
    await page.waitForFunction(() => document.querySelector("#run-facts h2") !== null);
    observed.outputs = await page.textContent("#run-facts pre.outputs");
    await shot("run");
  },

  // A call waiting for approval: its exact arguments with the secret masked, approved from the
  // approvals page; the run then finishes.
  async approve() {
    await page.goto(`${url}/approvals`);
    const card = page.locator("article.approval");
    await card.waitFor();
    observed.cards = await card.count();
    observed.arguments = await card.locator("pre.arguments").textContent();
    observed.why = await card.locator("dd").first().textContent();
    await shot("approvals");
    await card.getByLabel(/Reason/).fill("looks right");
    await card.getByRole("button", { name: "Approve" }).click();
    await page.waitForURL(`${url}/approvals`);
    observed.after = await page.textContent("#approvals-region");
    await page.goto(`${url}/runs/${process.env.RUN}`);
    await waitForRun("succeeded");
    observed.decision = await page.evaluate(() => {
      const decision = document.querySelector("#run-approvals article.approval p:last-child").cloneNode(true);
      decision.querySelectorAll("time").forEach((t) => t.replaceWith("TIME"));
      return decision.textContent;
    });
    observed.pay = await stepStatus("pay");
    observed.page_holds_secret = (await page.content()).includes(process.env.SECRET);
  },

  // A failed run: its failing step shown failed; once the file it checks exists, "Retry failed steps"
  // runs it again and the run succeeds on the page.
  async retry() {
    await page.goto(`${url}/runs/${process.env.RUN}`);
    await waitForRun("failed");
    observed.check_failed = await stepStatus("check");
    observed.after_skipped = await stepStatus("after");
    observed.error = await page.textContent("tr#step-check td:last-child");
    await shot("retry-failed");
    writeFileSync(join(workdir, "ok"), "");
    await page.getByRole("button", { name: "Retry failed steps" }).click();
    observed.check_done = await waitForStep("check", "succeeded");
    observed.after_done = await waitForStep("after", "succeeded");
    await waitForRun("succeeded");
    // The rest of the page follows once the script has fetched it again: the second attempt is listed.
    await page.waitForFunction(() => document.querySelector("tr#step-check td:nth-child(3) summary").textContent !== "1");
    observed.attempts = await page.textContent("tr#step-check td:nth-child(3) summary");
    await shot("retry-succeeded");
  },

  // The run form with a value its schema refuses: the problem next to the field, the values kept; then
  // a valid value starts the run.
  async form() {
    expectedStatuses.add(422);
    await page.goto(`${url}/workflows/release`);
    await page.getByLabel("version").fill("1.2.3");
    await page.getByLabel("replicas").fill("9");
    await page.getByRole("button", { name: "Start a run" }).click();
    await page.waitForSelector(".field.invalid");
    observed.invalid_fields = await page.locator(".field.invalid label").allTextContents();
    observed.error = await page.locator(".field.invalid .field-errors").textContent();
    observed.described = await page.getByLabel("replicas").getAttribute("aria-describedby");
    observed.kept = {
      version: await page.getByLabel("version").inputValue(),
      replicas: await page.getByLabel("replicas").inputValue(),
    };
    observed.summary = await page.textContent(".problem");
    await shot("form-invalid");
    await page.getByLabel("replicas").fill("2");
    await page.getByRole("button", { name: "Start a run" }).click();
    await page.waitForURL(/\/runs\/r[0-9a-f]+$/);
    observed.started = true;
  },

  // For benches/serve.rs: a run's page open while the run executes; the delay of each event from its
  // recording to its arrival in the page, once the run is let through its gate.
  async latency() {
    await page.goto(`${url}/workflows/ticks`);
    await page.getByRole("button", { name: "Start a run" }).click();
    await page.waitForURL(/\/runs\/r[0-9a-f]+$/);
    await waitForStep("gate", "running");
    await page.waitForSelector("#main .live-state[data-state='live']");
    const before = await page.evaluate(() => window.archonLive.latencies.length);
    writeFileSync(join(workdir, "go"), "");
    await waitForRun("succeeded");
    observed.latencies = await page.evaluate((before) => window.archonLive.latencies.slice(before), before);
  },
};

try {
  if (!scenarios[scenario]) throw new Error(`no scenario \`${scenario}\``);
  await scenarios[scenario]();
  observed.problems = problems;
  process.stdout.write(JSON.stringify(observed) + "\n");
} catch (error) {
  try {
    await shot(`${scenario}-failure`);
  } catch (_) {
    // Nothing more to show.
  }
  process.stderr.write(`scenario \`${scenario}\` failed: ${error.stack || error}\nproblems: ${JSON.stringify(problems)}\nobserved: ${JSON.stringify(observed)}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
