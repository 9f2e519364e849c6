// @ts-check
// The API as the panel reads it. The token lives in this tab's
// sessionStorage and goes only in Authorization headers; live streams (SSE)
// are read through fetch, never with a token in a URL. Every failure is an
// ApiError carrying the API's own message, for the page to show.

const KEY = "opkernel.token";

/** @returns {string | null} the token this tab signed in with */
export const getToken = () => sessionStorage.getItem(KEY);

/** @param {string} token */
export const setToken = (token) => sessionStorage.setItem(KEY, token);

export const forgetToken = () => sessionStorage.removeItem(KEY);

/** A refused or failed request: the API's error code and message. */
export class ApiError extends Error {
  /**
   * @param {number} status the HTTP status; 0 when the kernel did not answer
   * @param {string} code the API's error code
   * @param {string} message the API's message
   */
  constructor(status, code, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

/** @type {(() => void) | null} */
let refused = null;

/**
 * What to do when the API refuses the token (401) of a signed-in tab.
 * @param {() => void} f
 */
export function onRefused(f) {
  refused = f;
}

/**
 * The token, and the origin every call of the panel records (SPEC §28:
 * surface `panel`, the browser as its channel).
 * @returns {Record<string, string>}
 */
function auth() {
  return {
    Authorization: `Bearer ${getToken()}`,
    "X-Opkernel-Surface": "panel",
    "X-Opkernel-Channel": `panel ${navigator.userAgent}`.slice(0, 200),
  };
}

/**
 * fetch, with "the kernel did not answer" as an ApiError (an abort stays
 * an abort).
 * @param {string} path
 * @param {RequestInit} init
 * @returns {Promise<Response>}
 */
async function request(path, init) {
  try {
    return await fetch(path, init);
  } catch (e) {
    if (init.signal && init.signal.aborted) throw e;
    throw new ApiError(0, "unreachable", `the kernel did not answer (${e instanceof Error ? e.message : e})`);
  }
}

/**
 * The error a refused response carries (`{"error": {"code", "message"}}`).
 * @param {Response} r
 * @returns {Promise<ApiError>}
 */
async function refusal(r) {
  // a body not in the API's shape (a proxy's page): the status says it
  /** @type {import("./views.js").ErrorBody | null} */
  const body = await r.json().catch(() => null);
  const e = body && body.error;
  return new ApiError(r.status, (e && e.code) || "http", (e && e.message) || `HTTP ${r.status}`);
}

/**
 * A JSON call of the API.
 * @param {string} method
 * @param {string} path
 * @param {object} [body]
 * @returns {Promise<any>} the answer's body (its type is the endpoint's view, see views.js)
 * @throws {ApiError}
 */
export async function api(method, path, body) {
  /** @type {Record<string, string>} */
  const headers = auth();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await request(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 401 && refused) refused();
  if (!r.ok) throw await refusal(r);
  return r.json();
}

/**
 * An op's raw output from a byte offset (`GET /v1/operations/{id}/log`).
 * @param {string} op
 * @param {number} offset
 * @param {AbortSignal} signal
 * @returns {Promise<Uint8Array>}
 * @throws {ApiError}
 */
export async function logFrom(op, offset, signal) {
  const r = await request(`/v1/operations/${op}/log?offset=${offset}`, { headers: auth(), signal });
  if (!r.ok) throw await refusal(r);
  return new Uint8Array(await r.arrayBuffer());
}

/**
 * Server-sent events through fetch (so the token stays in a header), until
 * the stream ends, `onEvent` answers false, or `signal` aborts.
 * @param {string} path
 * @param {(event: string, data: string) => boolean} onEvent
 * @param {AbortSignal} signal
 * @param {() => void} [opened] called once the stream is open
 * @returns {Promise<void>}
 * @throws {ApiError}
 */
export async function sse(path, onEvent, signal, opened) {
  const r = await request(path, { headers: auth(), signal });
  if (!r.ok || !r.body) throw await refusal(r);
  if (opened) opened();
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "", event = "", data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
      if (line === "") {
        if (data.length && onEvent(event || "message", data.join("\n")) === false) return;
        event = "";
        data = [];
      } else if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
  }
}
