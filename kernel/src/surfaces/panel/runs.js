// @ts-check
// Runs: the tree of runs the token sees, and the picked run's state,
// budget use, reports and trace (its last 50 events, live).

import { api, sse } from "./api.js";
import { $, atEnd, el, sleep, status } from "./dom.js";
import { clearError, showError, task } from "./errors.js";
import { session } from "./session.js";

/** @typedef {import("./views.js").RunSummary} RunSummary */

/**
 * What is shown of the picked run.
 * @typedef {object} Picked
 * @property {string | null} run
 * @property {AbortController | null} trace stops its trace's stream
 * @property {string | null} treeSig the tree as last drawn
 * @property {string | null} reportsSig its reports as last drawn
 */

/** @type {Picked} */
const picked = { run: null, trace: null, treeSig: null, reportsSig: null };

/** Where a failure of the trace shows in the banner. */
const TRACE = "Trace";

/**
 * The runs in tree order with their depth (a run whose parent is not in
 * the list is a root).
 * @param {RunSummary[]} runs
 * @returns {[RunSummary, number][]}
 */
function tree(runs) {
  const ids = new Set(runs.map((r) => r.run_id));
  /** @type {Map<string | null, RunSummary[]>} */
  const kids = new Map();
  for (const r of runs) {
    const p = r.parent_run_id && ids.has(r.parent_run_id) ? r.parent_run_id : null;
    if (!kids.has(p)) kids.set(p, []);
    /** @type {RunSummary[]} */ (kids.get(p)).push(r);
  }
  /** @type {[RunSummary, number][]} */
  const items = [];
  /** @type {(p: string | null, d: number) => void} */
  const walk = (p, d) => (kids.get(p) || []).forEach((r) => {
    items.push([r, d]);
    walk(r.run_id, d + 1);
  });
  walk(null, 0);
  return items;
}

/**
 * A run's row in the tree (a button that picks it).
 * @param {RunSummary} r
 * @param {number} depth
 * @returns {HTMLElement}
 */
function runRow(r, depth) {
  const li = el("li", {
    tabindex: "0", role: "button", "data-run": r.run_id,
    class: r.run_id === picked.run ? "selected" : "",
    onclick: () => selectRun(r.run_id),
    onkeydown: (/** @type {KeyboardEvent} */ e) => {
      if (e.key !== "Enter" && e.key !== " ") return;
      e.preventDefault();
      selectRun(r.run_id);
    },
  }, el("span", { class: "name mono" }, r.run_id), status(r.state),
  el("span", { class: "muted" }, r.live_ops ? `${r.live_ops} live` : ""));
  li.style.paddingLeft = `${0.4 + depth * 1.1}rem`;
  return li;
}

/** The runs' tree; the first time, picks the token's run (or the newest). */
export const refreshRuns = task("Runs", async () => {
  /** @type {import("./views.js").RunList} */
  const list = await api("GET", "/v1/runs");
  session.runs = list.runs;
  const shown = tree(session.runs).slice(0, 300);
  // the same tree: nothing rebuilt (focus and scroll stay where they are)
  const sig = JSON.stringify(shown.map(([r, d]) => [r.run_id, r.state, r.live_ops, d]));
  if (sig !== picked.treeSig) {
    picked.treeSig = sig;
    $("runs").replaceChildren(...shown.map(([r, d]) => runRow(r, d)));
  }
  if (!picked.run && session.runs.length) {
    const who = session.who && session.who.run_id;
    selectRun(who || session.runs[session.runs.length - 1].run_id);
  }
});

/**
 * Picks a run: its detail now, then its trace, live.
 * @param {string} run
 */
function selectRun(run) {
  picked.run = run;
  $("run-name").textContent = run;
  for (const li of $("runs").querySelectorAll("li")) li.classList.toggle("selected", li.dataset.run === run);
  if (picked.trace) picked.trace.abort();
  const ctl = new AbortController();
  picked.trace = ctl;
  $("trace").replaceChildren();
  clearError(TRACE);
  picked.reportsSig = null;
  refreshRun();
  followTrace(run, ctl.signal);
}

/**
 * A run's trace: its last 50 events, then live from there on, reconnecting
 * (from the last event seen) if the stream drops. A failure shows in the
 * banner until the trace is back.
 * @param {string} run
 * @param {AbortSignal} signal
 * @returns {Promise<void>}
 */
async function followTrace(run, signal) {
  const path = `/v1/runs/${encodeURIComponent(run)}/events`;
  /** @type {number | null} */
  let after = null;
  const onEvent = (/** @type {string} */ _, /** @type {string} */ data) => {
    /** @type {import("./views.js").EventView} */
    const e = JSON.parse(data);
    after = e.seq;
    traceLine(e);
    return true;
  };
  while (!signal.aborted) {
    try {
      if (after === null) {
        /** @type {import("./views.js").EventPage} */
        const tail = await api("GET", `${path}?tail=50`);
        if (signal.aborted) return;
        tail.events.forEach(traceLine);
        after = tail.last_seq;
        clearError(TRACE);
      }
      await sse(`${path}/stream?after=${after}`, onEvent, signal, () => clearError(TRACE));
    } catch (e) {
      if (signal.aborted) return;
      showError(TRACE, e);
    }
    await sleep(2000);
  }
}

/**
 * One event at the end of the trace (which keeps 50).
 * @param {import("./views.js").EventView} e
 */
function traceLine(e) {
  const list = $("trace");
  const end = atEnd(list);
  const at = new Date(e.at).toISOString().slice(11, 23);
  const data = JSON.stringify(e.data);
  const op = e.operation_id ? ` ${e.operation_id.slice(0, 8)}` : "";
  const shown = data.length > 160 ? data.slice(0, 160) + "…" : data;
  list.append(el("li", {}, `${at} `, el("span", { class: "kind" }, e.kind), op, ` ${shown}`));
  while (list.children.length > 50) list.children[0].remove();
  if (end) list.scrollTop = list.scrollHeight;
}

/**
 * A run's state, parent and children, then its budget use.
 * @param {import("./views.js").RunView} r
 * @returns {HTMLElement[]}
 */
function runDetail(r) {
  const budget = el("div", { class: "budget" });
  for (const [k, v] of Object.entries(r.used)) {
    const limit = r.budget[k];
    const use = limit === undefined ? `${v} used` : `${v} of ${limit} (${r.remaining[k]} left)`;
    budget.append(el("span", { class: "muted" }, k), el("span", {}, use));
  }
  const parent = r.parent_run_id ? ` child of ${r.parent_run_id}` : " top-level";
  const children = r.children.length ? ` · ${r.children.length} children` : "";
  return [el("div", {}, status(r.state), parent, children), el("h3", {}, "Budget"), budget];
}

/**
 * A report, folded: when, how many results, whether it was acknowledged.
 * @param {import("./views.js").ReportSummary} p
 * @returns {HTMLElement}
 */
function reportItem(p) {
  const line = `${p.created_at} · ${p.resolved} results · ${p.acked_at ? "acked" : "not acked yet"}`;
  return el("details", { class: "report" }, el("summary", {}, line), el("pre", {}, p.text));
}

/** The picked run's detail and its last five reports. */
export const refreshRun = task("Run", async () => {
  const picking = picked.run;
  if (!picking) return;
  const run = encodeURIComponent(picking);
  /** @type {[import("./views.js").RunView, import("./views.js").ReportList]} */
  const [r, reports] = await Promise.all([
    api("GET", `/v1/runs/${run}`),
    api("GET", `/v1/runs/${run}/reports?limit=5`),
  ]);
  // another run was picked meanwhile: its own refresh draws it
  if (picking !== picked.run) return;
  $("run-detail").replaceChildren(...runDetail(r));
  const sig = JSON.stringify(reports.reports.map((p) => [p.report_id, p.acked_at]));
  if (sig === picked.reportsSig) return;
  picked.reportsSig = sig;
  const items = reports.reports.map(reportItem);
  $("reports").replaceChildren(...(items.length ? items : [el("p", { class: "muted" }, "No report yet.")]));
});
