// Live updates for Archon's dashboard. The pages are complete without this script: it only follows the
// server-sent events of the API (`/api/v1/runs/{id}/stream`, `/api/v1/runs/stream`) and changes in
// place what they change — a step's status in the graph and the steps table, the run's status, new log
// lines — then fetches the page again and swaps in its live regions (`[data-live]`) to show the rest.
// Nothing from an event is ever written as HTML: text goes in with `textContent`.
"use strict";

(function () {
  const main = document.getElementById("main");
  if (!main || typeof EventSource === "undefined") {
    return;
  }
  const page = main.dataset.page;

  // Every status a badge can show: its word and symbol (the same as the server's).
  const LABEL = {
    running: "running", waiting_approval: "waiting for approval", interrupted: "interrupted",
    succeeded: "succeeded", failed: "failed", cancelled: "cancelled", queued: "queued",
    pending: "not started", skipped: "skipped", timed_out: "timed out", stuck: "stuck",
    incomplete: "incomplete", retrying: "retrying", in_doubt: "in doubt",
  };
  const SYMBOL = {
    running: "▶", retrying: "▶", waiting_approval: "◷", interrupted: "‖", in_doubt: "‖",
    succeeded: "✓", failed: "✗", timed_out: "✗", stuck: "✗", incomplete: "✗", cancelled: "⊘",
    queued: "…", skipped: "↷",
  };
  const known = (status) => Object.prototype.hasOwnProperty.call(LABEL, status);
  const statusClass = (status) => "status-" + (known(status) ? status : "unknown");
  const label = (status) => (known(status) ? LABEL[status] : "unknown");
  const symbol = (status) => SYMBOL[status] || "○";

  // What arrived, for measuring: each event's delay from its recording to its arrival here.
  const live = { latencies: [], received: 0, refreshed: 0, state: "connecting" };
  window.archonLive = live;

  function badge(status) {
    const outer = document.createElement("span");
    outer.className = "badge " + statusClass(status);
    const mark = document.createElement("span");
    mark.setAttribute("aria-hidden", "true");
    mark.textContent = symbol(status);
    outer.append(mark, " " + label(status));
    return outer;
  }

  function setClass(element, status) {
    for (const name of Array.from(element.classList)) {
      if (name.startsWith("status-")) {
        element.classList.remove(name);
      }
    }
    element.classList.add(statusClass(status));
  }

  // The status line the script adds under the heading: whether live updates are on.
  const indicator = document.createElement("p");
  indicator.className = "live-state";
  function say(state) {
    live.state = state;
    indicator.textContent =
      state === "live" ? "Live: updates as it happens." :
      state === "connecting" ? "Connecting for live updates…" :
      "Live updates paused: reconnecting…";
    indicator.dataset.state = state;
  }
  const heading = main.querySelector("h1");
  if (heading) {
    heading.after(indicator);
  }
  say("connecting");

  // Fetches the page again and swaps in its live regions, one fetch at a time, at most every 300 ms. A
  // region holding the focus (a form being filled) is left alone.
  let refreshTimer = null;
  let refreshing = false;
  let again = false;
  function scheduleRefresh() {
    if (refreshing) {
      again = true;
      return;
    }
    if (refreshTimer === null) {
      refreshTimer = setTimeout(refresh, 300);
    }
  }
  async function refresh() {
    refreshTimer = null;
    refreshing = true;
    try {
      const response = await fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (response.ok) {
        const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
        for (const region of document.querySelectorAll("[data-live][id]")) {
          const focused = document.activeElement;
          if (focused && focused !== document.body && region.contains(focused)) {
            continue;
          }
          const replacement = fresh.getElementById(region.id);
          if (replacement) {
            region.replaceChildren(...Array.from(replacement.childNodes).map((n) => document.adoptNode(n)));
          }
        }
        const freshMain = fresh.getElementById("main");
        if (freshMain && page === "run") {
          main.dataset.status = freshMain.dataset.status || main.dataset.status;
          showRunStatus(main.dataset.status);
        }
        live.refreshed += 1;
      }
    } catch (_) {
      // The server went away: the stream reconnects, and its next event refreshes again.
    } finally {
      refreshing = false;
      if (again) {
        again = false;
        scheduleRefresh();
      }
    }
  }

  // An event source that reopens itself, from the cursors `url()` gives at that moment, when the
  // connection drops (the browser's own retry would start again from the first cursors).
  function follow(url, handlers) {
    let source = null;
    let delay = 500;
    function open() {
      source = new EventSource(url());
      source.onopen = () => {
        delay = 500;
        say("live");
      };
      source.onerror = () => {
        source.close();
        say("reconnecting");
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 10000);
      };
      for (const [name, handle] of Object.entries(handlers)) {
        source.addEventListener(name, (message) => {
          let data = null;
          try {
            data = JSON.parse(message.data);
          } catch (_) {
            return;
          }
          handle(data);
        });
      }
    }
    open();
    window.addEventListener("pagehide", () => source && source.close());
  }

  function showRunStatus(status) {
    const holder = document.getElementById("run-status");
    if (holder) {
      holder.replaceChildren(badge(status));
    }
  }

  // ---- One run ------------------------------------------------------------------------------------
  function runPage() {
    const run = main.dataset.run;
    let eventsAfter = Number(main.dataset.eventsAfter || 0);
    let logsAfter = Number(main.dataset.logsAfter || 0);
    const following = main.dataset.follow === "yes";
    const log = document.getElementById("log");
    const MAX_LINES = 5000;

    function setStep(step, status) {
      for (const element of document.querySelectorAll("[data-step]")) {
        if (element.dataset.step !== step) {
          continue;
        }
        if (element.classList.contains("node")) {
          setClass(element, status);
          const word = element.querySelector(".node-label");
          const mark = element.querySelector(".node-symbol");
          if (word) word.textContent = label(status);
          if (mark) mark.textContent = symbol(status);
          const title = element.querySelector("title");
          if (title) title.textContent = title.textContent.replace(/, [^,]*$/, ", " + label(status));
        } else {
          element.replaceChildren(badge(status));
        }
      }
    }

    // What an event says about its step's status; only a step's own events end it (not an item's or a
    // nested step's).
    function stepEvent(event) {
      if (typeof event.step !== "string") {
        return;
      }
      const top = event.step.split("[")[0].split("/")[0];
      const own = top === event.step;
      switch (event.event) {
        case "step_started":
          setStep(top, "running");
          break;
        case "step_retried":
          if (own) setStep(top, "retrying");
          break;
        case "step_finished":
        case "step_reused":
        case "step_resolved":
          if (own && typeof event.status === "string") setStep(top, event.status);
          break;
        case "step_skipped":
          if (own) setStep(top, "skipped");
          break;
        case "step_cached":
          if (own) setStep(top, "succeeded");
          break;
        case "approval_requested":
          setStep(top, "waiting_approval");
          break;
        default:
          break;
      }
    }

    function addLog(piece) {
      if (!log || !following || typeof piece.seq !== "number" || piece.seq <= logsAfter) {
        return;
      }
      logsAfter = piece.seq;
      const nearBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
      const line = document.createElement("div");
      line.className = "log-line stream-" + (piece.stream === "stderr" ? "stderr" : "stdout");
      line.dataset.seq = String(piece.seq);
      const source = document.createElement("span");
      source.className = "log-src";
      source.textContent = String(piece.source) + "#" + String(piece.attempt) + " " + (piece.stream === "stderr" ? "stderr" : "stdout");
      const text = document.createElement("span");
      text.className = "log-text";
      text.textContent = String(piece.text);
      line.append(source, text);
      log.append(line);
      while (log.childElementCount > MAX_LINES) {
        log.firstElementChild.remove();
      }
      const state = document.getElementById("log-state");
      if (state) state.textContent = "What the run's commands wrote, oldest first (following live).";
      if (nearBottom) {
        log.scrollTop = log.scrollHeight;
      }
    }

    follow(
      () => "/api/v1/runs/" + encodeURIComponent(run) + "/stream?events_after=" + eventsAfter + "&logs_after=" + logsAfter,
      {
        event: (data) => {
          if (typeof data.seq !== "number" || data.seq <= eventsAfter || !data.event) {
            return;
          }
          eventsAfter = data.seq;
          live.received += 1;
          if (typeof data.event.at_ms === "number") {
            live.latencies.push(Date.now() - data.event.at_ms);
            if (live.latencies.length > 1000) live.latencies.shift();
          }
          stepEvent(data.event);
          scheduleRefresh();
        },
        log: addLog,
        run: (summary) => {
          if (typeof summary.status !== "string") {
            return;
          }
          if (summary.status !== main.dataset.status) {
            main.dataset.status = summary.status;
            showRunStatus(summary.status);
            scheduleRefresh();
          }
        },
      },
    );
  }

  // ---- The run list and the approvals -----------------------------------------------------------
  function runsPage() {
    const first = main.dataset.first === "yes";
    follow(() => "/api/v1/runs/stream", {
      run: (summary) => {
        live.received += 1;
        let found = false;
        for (const row of document.querySelectorAll("tr[data-run]")) {
          if (row.dataset.run === summary.id) {
            found = true;
            const cell = row.querySelector(".run-status");
            if (cell && typeof summary.status === "string") cell.replaceChildren(badge(summary.status));
          }
        }
        if (!found && first) scheduleRefresh();
      },
      queue: () => scheduleRefresh(),
      reload: () => scheduleRefresh(),
    });
  }

  function approvalsPage() {
    follow(() => "/api/v1/runs/stream", {
      run: () => {
        live.received += 1;
        scheduleRefresh();
      },
      reload: () => scheduleRefresh(),
    });
  }

  if (page === "run") {
    runPage();
  } else if (page === "runs") {
    runsPage();
  } else if (page === "approvals") {
    approvalsPage();
  } else {
    indicator.remove();
  }
})();
