// @ts-check
// The page's error banner: what a failed request said, one line per
// source, until that source next succeeds (a refresh, an action done
// again) or the operator dismisses it. Nothing is swallowed.

import { $, el } from "./dom.js";

/** @type {Map<string, HTMLElement>} the line shown for each source */
const shown = new Map();

/**
 * The text of an error, whatever was thrown.
 * @param {unknown} err
 * @returns {string}
 */
export function message(err) {
  return err instanceof Error ? err.message : String(err);
}

/**
 * Shows (or updates) the source's line in the banner.
 * @param {string} source what failed, e.g. "Schedules" or "Approve <op>"
 * @param {unknown} err
 */
export function showError(source, err) {
  const text = `${source}: ${message(err)}`;
  const old = shown.get(source);
  // the same error again: left as it is (not announced again)
  if (old && old.dataset.text === text) return;
  const li = el("li", { "data-source": source, "data-text": text },
    el("span", { class: "grow" }, text),
    el("button", { type: "button", "aria-label": `dismiss: ${text}`, onclick: () => clearError(source) }, "Dismiss"));
  if (old) old.replaceWith(li);
  else $("error-list").append(li);
  shown.set(source, li);
  $("errors").hidden = false;
}

/**
 * Takes the source's line away (it succeeded, or was dismissed).
 * @param {string} source
 */
export function clearError(source) {
  const li = shown.get(source);
  if (!li) return;
  li.remove();
  shown.delete(source);
  $("errors").hidden = shown.size === 0;
}

/**
 * A refresh that reports for itself: its failure shows in the banner under
 * `source`, its next success clears that line. The returned function never
 * rejects.
 * @param {string} source
 * @param {() => Promise<void>} f
 * @returns {() => Promise<void>}
 */
export function task(source, f) {
  return async () => {
    try {
      await f();
      clearError(source);
    } catch (e) {
      showError(source, e);
    }
  };
}
