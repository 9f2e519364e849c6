// @ts-check
// Pinned at the top: the live background operations, one card each with
// its output as it arrives; a card leaves when its op resolves.

import { api, logFrom, sse } from "./api.js";
import { $, age, atEnd, cmdline, el, sleep, status } from "./dom.js";
import { message, task } from "./errors.js";
import { isOperator, session } from "./session.js";

/** @typedef {import("./views.js").OpView} OpView */

/**
 * A live op's card: its elements, the op as last seen, how its output is read.
 * @typedef {object} Card
 * @property {HTMLElement} li
 * @property {HTMLElement} out the output box
 * @property {HTMLElement} bar the time used of the timeout
 * @property {HTMLElement} meta age and timeout
 * @property {HTMLElement} st where the status badge goes
 * @property {HTMLElement} err why its output could not be read, if it could not
 * @property {OpView} op
 * @property {AbortController} ctl stops its stream or polls
 * @property {boolean} done its op resolved: it is leaving
 * @property {number} offset bytes of output shown
 */

/** The statuses of a live op, for a kernel whose views do not say `live` yet. */
const LIVE = new Set(["starting", "running"]);

/**
 * Whether an op is still starting or running: the server's `live`, else
 * its status.
 * @param {{status: string, live?: boolean}} op
 * @returns {boolean}
 */
export function isLive(op) {
  return typeof op.live === "boolean" ? op.live : LIVE.has(op.status);
}

/** @type {Map<string, Card>} the cards shown, by op id */
const cards = new Map();
/** Live ops counted but not shown (past MAX_CARDS). */
let hidden = 0;

/** @returns {Promise<OpView[]>} the live ops the token sees */
async function liveOps() {
  if (isOperator()) {
    return (await api("GET", "/v1/ops?live=true&limit=1000")).operations;
  }
  // a run token: its run and its descendants, run by run
  const all = [];
  for (const run of session.runs) {
    const query = `live=true&run=${encodeURIComponent(run.run_id)}&limit=500`;
    all.push(...(await api("GET", `/v1/ops?${query}`)).operations);
  }
  return all;
}

/**
 * A new card for an op, following its output.
 * @param {OpView} op
 * @returns {Card}
 */
function card(op) {
  const id = op.operation_id;
  const out = el("pre", { "aria-live": "off", tabindex: "0", "aria-label": `output of ${id}` });
  const bar = el("span");
  const meta = el("span", { class: "meta" });
  const err = el("span", { class: "error" });
  const st = el("span");
  const li = el("li", { class: "card", "data-op": id },
    el("div", { class: "head" }, st, el("code", { class: "cmd", title: cmdline(op.command) }, cmdline(op.command))),
    el("div", { class: "meta mono" }, `${id} · run ${op.run_id} · `, meta, err),
    op.origin ? el("div", { class: "meta origin", "data-origin": op.origin.surface },
      `via ${op.origin.surface} (${op.origin.channel}) by ${op.origin.principal}`) : null,
    el("div", { class: "bar", role: "progressbar", "aria-label": "time used of the timeout" }, bar),
    out);
  const c = { li, out, bar, meta, err, st, op, ctl: new AbortController(), done: false, offset: 0 };
  if (op.stdin) li.append(inputLine(c));
  follow(c);
  return c;
}

/**
 * The input line of an op with stdin (SPEC §25): a line typed here is
 * written to its stdin (Enter on a terminal); its answer shows in the
 * output as the op prints it.
 * @param {Card} c
 * @returns {HTMLElement}
 */
function inputLine(c) {
  const id = c.op.operation_id;
  const field = el("input", { type: "text", class: "mono", "aria-label": `input for ${id}`,
    placeholder: c.op.tty ? "keys for its terminal" : "a line for its stdin", autocomplete: "off" });
  const send = async (/** @type {SubmitEvent} */ e) => {
    e.preventDefault();
    const input = /** @type {HTMLInputElement} */ (field);
    const text = input.value + (c.op.tty ? "\r" : "\n");
    try {
      await api("POST", `/v1/runs/${encodeURIComponent(c.op.run_id)}/tools/write_stdin`,
        { operation_id: id, text, yield_ms: 0 });
      input.value = "";
      outputError(c, null);
    } catch (err) {
      c.err.textContent = ` · input: ${message(err)}`;
    }
  };
  return el("form", { class: "stdin", onsubmit: send }, field, el("button", { type: "submit" }, "Send"));
}

/**
 * A card shows the op as it is now.
 * @param {Card} c
 * @param {OpView} op
 */
function update(c, op) {
  c.op = op;
  c.st.replaceChildren(status(op.status));
  const used = op.duration_sec / Math.max(1, op.timeout_sec);
  const track = /** @type {HTMLElement} */ (c.bar.parentElement);
  c.bar.style.width = `${Math.min(100, used * 100).toFixed(1)}%`;
  track.classList.toggle("late", used > 0.8);
  track.setAttribute("aria-valuenow", String(Math.round(used * 100)));
  c.meta.textContent = `age ${age(op.duration_sec)} of ${op.timeout_sec}s`;
}

/**
 * The card's own error line: why its output is not arriving (null: it is).
 * @param {Card} c
 * @param {unknown} err
 */
function outputError(c, err) {
  c.err.textContent = err === null ? "" : ` · output: ${message(err)}`;
}

// A browser keeps at most six HTTP/1.1 connections to one host: only a few
// cards hold a live stream, the others read their new output in short polls.
const MAX_STREAMS = 3;
let streams = 0;

/**
 * Follows a card's output: a stream if one is free, else polls.
 * @param {Card} c
 * @returns {Promise<void>}
 */
async function follow(c) {
  if (streams >= MAX_STREAMS) return poll(c);
  streams++;
  try {
    await stream(c);
  } finally {
    streams--;
  }
}

/**
 * Adds output to a card, keeping the last 64 KiB (and the view at the end
 * if it was there).
 * @param {Card} c
 * @param {string} text
 */
function append(c, text) {
  const end = atEnd(c.out);
  c.out.textContent = (c.out.textContent + text).slice(-65536);
  if (end) c.out.scrollTop = c.out.scrollHeight;
}

/**
 * Reads a card's new output every 1.5 s until its op resolves.
 * @param {Card} c
 * @returns {Promise<void>}
 */
async function poll(c) {
  const decoder = new TextDecoder();
  while (!c.done) {
    if (!document.hidden) {
      try {
        const bytes = await logFrom(c.op.operation_id, c.offset, c.ctl.signal);
        c.offset += bytes.length;
        if (bytes.length) append(c, decoder.decode(bytes, { stream: true }));
        outputError(c, null);
      } catch (e) {
        if (c.ctl.signal.aborted) return;
        outputError(c, e);
      }
    }
    await sleep(1500);
  }
}

/**
 * Streams a card's output (SSE) until its op is done; a failed stream is
 * shown on the card, which then polls.
 * @param {Card} c
 * @returns {Promise<void>}
 */
async function stream(c) {
  const onEvent = (/** @type {string} */ event, /** @type {string} */ data) => {
    if (event === "output") {
      /** @type {import("./views.js").ConsoleOutput} */
      const v = JSON.parse(data);
      append(c, v.text);
      c.offset = v.offset;
    } else if (event === "done") {
      /** @type {import("./views.js").ConsoleDone} */
      const v = JSON.parse(data);
      leave(c, v.status);
      return false;
    }
    return true;
  };
  try {
    const path = `/v1/operations/${c.op.operation_id}/console?offset=${c.offset}`;
    await sse(path, onEvent, c.ctl.signal, () => outputError(c, null));
  } catch (e) {
    if (c.ctl.signal.aborted) return;
    outputError(c, e);
    setTimeout(() => !c.done && poll(c), 2000);
  }
}

/**
 * The card's op resolved: it shows the final status, fades and leaves.
 * @param {Card} c
 * @param {string} [finalStatus]
 */
function leave(c, finalStatus) {
  if (c.done) return;
  c.done = true;
  c.ctl.abort();
  c.st.replaceChildren(status(finalStatus || "completed"));
  c.li.classList.add("leaving");
  setTimeout(() => {
    c.li.remove();
    cards.delete(c.op.operation_id);
    renderLiveCount();
  }, 1200);
}

function renderLiveCount() {
  const n = [...cards.values()].filter((c) => !c.done).length + hidden;
  $("live-count").textContent = n ? `(${n}${hidden ? `; ${hidden} not shown` : ""})` : "";
  $("live-empty").hidden = cards.size > 0;
}

// Cards shown at once; the rest are counted (a browser cannot follow
// thousands of outputs, nor a person read them).
const MAX_CARDS = 24;

/** The live background ops: new ones get a card, resolved ones leave. */
export const refreshLive = task("Live operations", async () => {
  const ops = (await liveOps()).filter((op) => op.background && isLive(op));
  const seen = new Set(ops.map((op) => op.operation_id));
  for (const op of ops) {
    const c = cards.get(op.operation_id);
    if (c) {
      if (!c.done) update(c, op);
    } else if (cards.size < MAX_CARDS) {
      const fresh = card(op);
      cards.set(op.operation_id, fresh);
      $("live-ops").append(fresh.li);
      update(fresh, op);
    }
  }
  hidden = Math.max(0, ops.length - [...cards.values()].filter((c) => !c.done).length);
  renderLiveCount();
  // a card whose op is no longer live: it resolved (its final status says how)
  const gone = [...cards.values()].filter((c) => !c.done && !seen.has(c.op.operation_id));
  await Promise.all(gone.map(async (c) => {
    /** @type {OpView} */
    const op = await api("GET", `/v1/operations/${c.op.operation_id}`);
    if (!isLive(op)) leave(c, op.status);
  }));
});
