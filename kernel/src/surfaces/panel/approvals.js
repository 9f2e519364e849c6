// @ts-check
// Approvals waiting: each waiting op with approve and deny buttons for the
// operator (a run token sees its own, and that an operator decides). The
// escalated ones come first, marked.

import { api } from "./api.js";
import { $, age, cmdline, el, emptyRow, status } from "./dom.js";
import { clearError, showError, task } from "./errors.js";
import { refreshLive } from "./live.js";
import { isOperator } from "./session.js";

/** @typedef {import("./views.js").OpView} OpView */

/** @type {string | null} the list as last drawn */
let drawnSig = null;

/**
 * A waiting op's row: what it runs, how long it waited, the decision.
 * @param {OpView} op
 * @returns {HTMLElement}
 */
function approvalRow(op) {
  const id = op.operation_id;
  const mark = escalated(op) ? status("escalated") : null;
  const what = el("span", { class: "grow" }, mark, el("code", {}, cmdline(op.command)), el("br"),
    el("span", { class: "muted mono" }, `${id} · run ${op.run_id} · waiting ${age(op.duration_sec)}`));
  const attrs = { "data-op": id, class: mark ? "escalated" : null };
  if (!isOperator()) {
    return el("li", attrs, what, el("span", { class: "muted" }, "an operator decides"));
  }
  const reason = /** @type {HTMLInputElement} */ (
    el("input", { type: "text", placeholder: "reason to deny", "aria-label": `reason to deny ${id}` }));
  return el("li", attrs, what,
    el("button", { type: "button", class: "approve", onclick: () => decide(id, "approve") }, "Approve"),
    reason,
    el("button", { type: "button", class: "deny", onclick: () => decide(id, "deny", reason.value) }, "Deny"));
}

/**
 * Whether the op's approval escalated (it waited past its timeout).
 * @param {OpView} op
 * @returns {boolean}
 */
const escalated = (op) => Boolean(op.approval && op.approval.escalated_at);

/** The ops waiting for approval, the escalated ones first. */
export const refreshApprovals = task("Approvals", async () => {
  /** @type {OpView[]} */
  const waiting = (await api("GET", "/v1/approvals")).operations;
  // stable: each group keeps the server's order (oldest first)
  const ops = [...waiting.filter(escalated), ...waiting.filter((op) => !escalated(op))];
  $("approvals-count").textContent = ops.length ? `(${ops.length})` : "";
  const sig = JSON.stringify(ops.map((op) => [op.operation_id, op.approval && op.approval.escalated_at]));
  if (sig === drawnSig) return;
  drawnSig = sig;
  $("approvals").replaceChildren(...(ops.length ? ops.map(approvalRow) : [emptyRow("Nothing waits for approval.")]));
});

/**
 * Approves or denies an op; a refusal (it no longer waits, say) shows in
 * the banner.
 * @param {string} op
 * @param {"approve" | "deny"} verb
 * @param {string} [reason] why it is denied
 * @returns {Promise<void>}
 */
async function decide(op, verb, reason) {
  const source = `${verb === "deny" ? "Deny" : "Approve"} ${op}`;
  try {
    await api("POST", `/v1/operations/${op}/${verb}`, verb === "deny" ? { reason } : {});
    clearError(source);
  } catch (e) {
    showError(source, e);
  }
  refreshApprovals();
  refreshLive();
}
