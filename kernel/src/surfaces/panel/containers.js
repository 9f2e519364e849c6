// @ts-check
// Operator only: the managed containers with their live ops, and the
// reaper's decisions as a dry run.

import { api } from "./api.js";
import { $, el, emptyRow, status } from "./dom.js";
import { task } from "./errors.js";
import { isLive } from "./live.js";
import { isOperator } from "./session.js";

/**
 * @param {import("./views.js").ContainerView} c
 * @param {number} live its live ops
 * @returns {HTMLElement}
 */
function containerRow(c, live) {
  const owner = `run ${c.run_id || "-"}${c.registered ? "" : " · not registered"}`;
  return el("li", {},
    el("span", { class: "grow mono" }, c.name, el("br"), el("span", { class: "muted" }, owner)),
    status(c.state), el("span", { class: "muted" }, `${live} live ops`));
}

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
