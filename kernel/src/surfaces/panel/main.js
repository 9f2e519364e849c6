// @ts-check
// opkernel's live panel: plain DOM, ES modules, no build step, no
// dependency. The entry: sign-in, then each section refreshed on its own
// period; a failed refresh shows in the error banner until it succeeds again.

import { getToken } from "./api.js";
import { refreshApprovals } from "./approvals.js";
import { dryRunReaper, refreshContainers } from "./containers.js";
import { $ } from "./dom.js";
import { message } from "./errors.js";
import { refreshLive } from "./live.js";
import { refreshRun, refreshRuns } from "./runs.js";
import { refreshSchedules } from "./schedules.js";
import { prefillRun, startCommand } from "./start.js";
import { session, signedOutNote, signIn, signOut } from "./session.js";

/**
 * Runs `f` now and `ms` after each run ends (a hidden tab asks nothing).
 * @param {number} ms
 * @param {() => Promise<void>} f a refresh that shows its own errors
 */
function every(ms, f) {
  const tick = async () => {
    if (!document.hidden) await f();
    setTimeout(tick, ms);
  };
  tick();
}

let started = false;

function start() {
  if (started) return;
  started = true;
  every(3000, refreshRuns);
  every(1000, refreshLive);
  every(2000, refreshApprovals);
  every(5000, refreshSchedules);
  every(5000, refreshContainers);
  every(3000, refreshRun);
  $("reap").addEventListener("click", dryRunReaper);
  $("start").addEventListener("submit", startCommand);
  prefillRun();
}

/**
 * Signs in and starts the refreshes; a refusal shows on the sign-in form.
 * @param {string} token
 * @returns {Promise<boolean>} whether it signed in
 */
async function enter(token) {
  $("signin-error").textContent = "";
  try {
    await signIn(token);
  } catch (err) {
    $("signin-error").textContent = `Sign-in failed: ${message(err)}`;
    return false;
  }
  start();
  return true;
}

$("signin").addEventListener("submit", async (e) => {
  e.preventDefault();
  if (session.who) return;
  const field = /** @type {HTMLInputElement} */ ($("token"));
  if (await enter(field.value.trim())) field.value = "";
});
$("signout").addEventListener("click", () => signOut());
const saved = getToken();
const why = signedOutNote();
if (saved) enter(saved);
else $("token").focus();
if (why) $("signin-error").textContent = `Signed out: ${why}`;
