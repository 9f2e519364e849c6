// @ts-check
// Schedules: each with its timing, run, next and last firing, and state.
// The server derives `state` and `when`; older kernels' views are read
// the way the panel always did.

import { api } from "./api.js";
import { $, cmdline, el, emptyRow, status } from "./dom.js";
import { task } from "./errors.js";

/** @typedef {import("./views.js").ScheduleView} ScheduleView */

/**
 * A schedule's state: the server's, else derived from its flags.
 * @param {ScheduleView} s
 * @returns {string} waiting, running, paused or done
 */
export function scheduleState(s) {
  if (s.state) return s.state;
  return !s.enabled ? "done" : s.paused ? "paused" : s.current_operation_id ? "running" : "waiting";
}

/**
 * A schedule's timing as text: the server's, else from its cron, every or at.
 * @param {ScheduleView} s
 * @returns {string}
 */
export function scheduleWhen(s) {
  if (s.when) return s.when;
  return s.cron || (s.every_sec ? `every ${s.every_sec}s` : `at ${s.at}`);
}

/**
 * @param {ScheduleView} s
 * @returns {HTMLElement}
 */
function scheduleRow(s) {
  const exit = s.last_exit_code !== null && s.last_exit_code !== undefined ? ` ${s.last_exit_code}` : "";
  const next = `next ${s.next_due_at || "-"}`;
  const line = `${scheduleWhen(s)} · run ${s.run_id} · ${next} · last ${s.last_status || "-"}${exit}`;
  return el("li", {},
    el("span", { class: "grow" }, el("code", {}, cmdline(s.command)), el("br"), el("span", { class: "muted" }, line)),
    status(scheduleState(s)));
}

/** The schedules the token sees. */
export const refreshSchedules = task("Schedules", async () => {
  /** @type {ScheduleView[]} */
  const list = (await api("GET", "/v1/schedules")).schedules;
  $("schedules").replaceChildren(...(list.length ? list.map(scheduleRow) : [emptyRow("No schedule.")]));
});
