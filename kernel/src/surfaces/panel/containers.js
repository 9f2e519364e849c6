// @ts-check
// Operator only: the managed containers with their live ops, each one
// inspected on demand (GET /v1/containers/{id}), and the reaper's decisions
// as a dry run.

import { api } from "./api.js";
import { $, age, el, emptyRow, status } from "./dom.js";
import { task } from "./errors.js";
import { isLive } from "./live.js";
import { isOperator } from "./session.js";

/**
 * @param {import("./views.js").ContainerView} c
 * @param {number} live its live ops
 * @returns {HTMLElement}
 */
function containerRow(c, live) {
  const pool = c.pool ? ` · warm pool: ${c.pool}` : "";
  const owner = c.pool === "free"
    ? "warm pool: free, for a new run"
    : `run ${c.run_id || "-"}${pool}${c.registered || c.pool ? "" : " · not registered"}`;
  return el("li", { "data-container": c.container_id },
    el("span", { class: "grow mono" }, c.name, el("br"), el("span", { class: "muted" }, owner)),
    status(c.state), el("span", { class: "muted" }, `${live} live ops`),
    el("button", { type: "button", class: "inspect", onclick: () => inspect(c.container_id) }, "Inspect"));
}

/**
 * The inspect view: one line per fact, the ops, the process table.
 * @param {import("./views.js").ContainerInspect} c
 * @returns {HTMLElement[]}
 */
function inspectView(c) {
  const p = c.profile;
  const facts = [
    ["container", `${c.name} (${c.container_id.slice(0, 12)}) · ${c.state}`],
    ["run", c.run_id || "-"],
    ["profile", p
      ? `${p.image} · ${p.cpus} CPUs · ${p.memory_bytes} bytes · ${p.pids_limit} pids`
        + ` · network ${p.network} · user ${p.run_as || "root"}`
      : "-"],
    ["scratch", c.scratch_bytes === null ? "-" : `${c.scratch_bytes} bytes`],
    ["reaper", `${c.reaper.verdict}: ${c.reaper.reason}`],
  ].map(([k, v]) => el("li", {}, el("span", { class: "muted" }, k), el("span", { class: "grow mono" }, v)));
  const ops = c.ops.map((o) => el("li", {}, status(o.status),
    el("span", { class: "grow mono" }, o.command), el("span", { class: "muted" }, `${age(o.age_ms / 1000)} ago`)));
  const procs = (c.processes || []).map((r) => [
    String(r.pid).padStart(7), r.user.padEnd(10), `${r.cpu.toFixed(2).padStart(7)}s`,
    `${String(Math.round(r.rss / 1024)).padStart(8)}K`, age(r.age).padStart(7), ` ${r.command}`,
  ].join(" "));
  const table = c.processes
    ? `    PID USER            CPU       RSS     AGE  COMMAND\n${procs.join("\n")}`
    : `process table unknown: ${c.processes_error}`;
  return [el("ul", { class: "rows" }, ...facts, ...ops), el("pre", { class: "processes" }, table)];
}

/**
 * Shows one container inside and out below the list.
 * @param {string} id
 */
const inspect = (id) => task("Inspect", async () => {
  /** @type {import("./views.js").ContainerInspect} */
  const c = await api("GET", `/v1/containers/${encodeURIComponent(id)}`);
  const box = $("inspect");
  box.replaceChildren(...inspectView(c));
  box.dataset.container = c.container_id;
  box.hidden = false;
})();

/** The containers, each with its count of live ops. */
export const refreshContainers = task("Containers", async () => {
  if (!isOperator()) return;
  /** @type {[import("./views.js").ContainerList, import("./views.js").OpList]} */
  const [cs, ops] = await Promise.all([api("GET", "/v1/containers"), api("GET", "/v1/ops?live=true&limit=5000")]);
  /** @type {Map<string, number>} */
  const live = new Map();
  for (const op of ops.operations) {
    if (isLive(op) && op.container_id) live.set(op.container_id, (live.get(op.container_id) || 0) + 1);
  }
  const rows = cs.containers.map((c) => containerRow(c, live.get(c.container_id) || 0));
  $("containers").replaceChildren(...(rows.length ? rows : [emptyRow("No container.")]));
});

/**
 * @param {import("./views.js").ReapDecision} d
 * @returns {HTMLElement}
 */
function decisionRow(d) {
  return el("li", {},
    status(String(d.action)), el("span", { class: "grow mono" }, d.name), el("span", { class: "muted" }, d.reason));
}

/** What the reaper would do now (nothing is removed). */
export const dryRunReaper = task("Reaper", async () => {
  /** @type {import("./views.js").ReapList} */
  const list = await api("POST", "/v1/reap?dry_run=true");
  const rows = list.decisions.map(decisionRow);
  $("reaper").replaceChildren(...(rows.length ? rows : [emptyRow("No container to decide about.")]));
});
