// @ts-check
// Element helpers and the small formatters every section uses.

/**
 * The element with this id.
 * @param {string} id
 * @returns {HTMLElement}
 */
export const $ = (id) => /** @type {HTMLElement} */ (document.getElementById(id));

/**
 * An element: `class`, `on<event>` handlers and attributes (null and
 * undefined are left out), then its children (nodes, or text).
 * @param {string} tag
 * @param {Object<string, *>} [attrs]
 * @param {...*} children
 * @returns {HTMLElement}
 */
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

/**
 * A status badge.
 * @param {string} s
 * @returns {HTMLElement}
 */
export function status(s) {
  return el("span", { class: `status ${s}` }, s.replace("_", " "));
}

/**
 * A muted list row saying the list is empty.
 * @param {string} text
 * @returns {HTMLElement}
 */
export function emptyRow(text) {
  return el("li", { class: "muted" }, text);
}

/**
 * A duration, short: `42s`, `3m05s`, `2h07m`.
 * @param {number} sec
 * @returns {string}
 */
export function age(sec) {
  sec = Math.max(0, Math.round(sec));
  const h = Math.floor(sec / 3600), m = Math.floor((sec % 3600) / 60), s = sec % 60;
  return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(s).padStart(2, "0")}s` : `${s}s`;
}

/**
 * An argv as a shell would read it back.
 * @param {string[] | undefined} argv
 * @returns {string}
 */
export function cmdline(argv) {
  const quote = (/** @type {string} */ a) => (/^[\w./=:,@%+-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`);
  return (argv || []).map(quote).join(" ");
}

/**
 * Whether a scrolled box shows its end (so new lines keep it there).
 * @param {HTMLElement} box
 * @returns {boolean}
 */
export function atEnd(box) {
  return box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
}

/**
 * A promise resolved after `ms` milliseconds.
 * @param {number} ms
 * @returns {Promise<void>}
 */
export function sleep(ms) {
  return new Promise((ok) => setTimeout(ok, ms));
}
