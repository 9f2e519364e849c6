// @ts-check
// Start a background command in a run from the panel (its origin says
// `panel`, SPEC §28): a shell line, run by `sh -c`; its card appears with
// the live operations.

import { api } from "./api.js";
import { $ } from "./dom.js";
import { message } from "./errors.js";
import { session } from "./session.js";

/** @returns {HTMLInputElement} */
const field = (/** @type {string} */ id) => /** @type {HTMLInputElement} */ ($(id));

/**
 * Submits the start form: the line, in the background, in the run named.
 * @param {SubmitEvent} e
 */
export async function startCommand(e) {
  e.preventDefault();
  const run = field("start-run").value.trim();
  const line = field("start-cmd").value;
  const said = $("start-said");
  try {
    /** @type {import("./views.js").OpView} */
    const op = await api("POST", `/v1/runs/${encodeURIComponent(run)}/tools/run_command`,
      { command: ["sh", "-c", line], background: true });
    field("start-cmd").value = "";
    said.textContent = `started ${op.operation_id}`;
  } catch (err) {
    said.textContent = `not started: ${message(err)}`;
  }
}

/** A run token's form names its own run. */
export function prefillRun() {
  const who = session.who;
  if (who && who.run_id && !field("start-run").value) field("start-run").value = who.run_id;
}
