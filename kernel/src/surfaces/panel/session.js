// @ts-check
// Who is signed in: the token's principal, the runs it sees, and sign in
// and out (the page holds no data of its own).

import { api, forgetToken, onRefused, setToken } from "./api.js";
import { $ } from "./dom.js";

/** Why the tab was last signed out, shown on the sign-in form after the reload. */
const NOTE = "opkernel.signed-out";

/**
 * @typedef {object} Session
 * @property {import("./views.js").Whoami | null} who
 * @property {import("./views.js").RunSummary[]} runs the runs the token sees, as last listed
 */

/** @type {Session} */
export const session = { who: null, runs: [] };

/** @returns {boolean} whether the operator is signed in */
export function isOperator() {
  return session.who !== null && session.who.principal === "operator";
}

/**
 * Signs in with a token (kept in this tab only) and shows the panel.
 * @param {string} token
 * @returns {Promise<void>}
 * @throws {import("./api.js").ApiError} the token was refused
 */
export async function signIn(token) {
  setToken(token);
  try {
    session.who = await api("GET", "/v1/whoami");
  } catch (e) {
    forgetToken();
    throw e;
  }
  onRefused(() => signOut("The token was refused."));
  const operator = isOperator();
  $("who").textContent = operator ? "operator" : `run ${session.who && session.who.run_id}`;
  $("signout").hidden = false;
  $("signin-view").hidden = true;
  $("app").hidden = false;
  document.body.classList.toggle("is-operator", operator);
  for (const s of document.querySelectorAll(".operator-only")) /** @type {HTMLElement} */ (s).hidden = !operator;
}

/**
 * Forgets the token and starts over; `why`, if given, shows on the sign-in form.
 * @param {string} [why]
 */
export function signOut(why) {
  forgetToken();
  if (why) sessionStorage.setItem(NOTE, why);
  location.reload();
}

/** @returns {string | null} why the tab was signed out, once */
export function signedOutNote() {
  const why = sessionStorage.getItem(NOTE);
  sessionStorage.removeItem(NOTE);
  return why;
}
