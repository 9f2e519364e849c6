// opkernel's live panel: plain DOM, no build step, no dependency. The token
// lives in this tab's sessionStorage and goes only in Authorization headers;
// live streams (SSE) are read through fetch, never with a token in a URL.
"use strict";

const KEY = "opkernel.token";
const LIVE = new Set(["starting", "running"]);
const $ = (id) => document.getElementById(id);
const state = { who: null, runs: [], run: null, cards: new Map(), trace: null };

function el(tag, attrs = {}, ...children) {
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

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await r.json().catch(() => null);
  if (r.status === 401 && state.who) signOut("The token was refused.");
  if (!r.ok) throw new Error((data && data.error && data.error.message) || `HTTP ${r.status}`);
  return data;
}

// Server-sent events through fetch (so the token stays in a header).
async function sse(path, onEvent, signal) {
  const r = await fetch(path, { headers: { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` }, signal });
  if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
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
        event = ""; data = [];
      } else if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
  }
}

function age(sec) {
  sec = Math.max(0, Math.round(sec));
  const h = Math.floor(sec / 3600), m = Math.floor((sec % 3600) / 60), s = sec % 60;
  return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(s).padStart(2, "0")}s` : `${s}s`;
}

function cmdline(argv) {
  return (argv || []).map((a) => (/^[\w./=:,@%+-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`)).join(" ");
}

function status(s) {
  return el("span", { class: `status ${s}` }, s.replace("_", " "));
}

// ---- sign in / out -------------------------------------------------------

async function signIn(token) {
  sessionStorage.setItem(KEY, token);
  try {
    state.who = await api("GET", "/v1/whoami");
  } catch (e) {
    sessionStorage.removeItem(KEY);
    throw e;
  }
  $("who").textContent = state.who.principal === "operator" ? "operator" : `run ${state.who.run_id}`;
  $("signout").hidden = false;
  $("signin-view").hidden = true;
  $("app").hidden = false;
  document.body.classList.toggle("is-operator", state.who.principal === "operator");
  for (const s of document.querySelectorAll(".operator-only")) s.hidden = state.who.principal !== "operator";
  start();
}

function signOut(message) {
  if (message) console.warn(message);
  sessionStorage.removeItem(KEY);
  location.reload();
}

// ---- live background operations -----------------------------------------

async function liveOps() {
  if (state.who.principal === "operator") {
    return (await api("GET", "/v1/ops?live=true&limit=1000")).operations;
  }
  // a run token: its run and its descendants, run by run
  const all = [];
  for (const run of state.runs) {
    all.push(...(await api("GET", `/v1/ops?live=true&run=${encodeURIComponent(run.run_id)}&limit=500`)).operations);
  }
  return all;
}

function card(op) {
  const out = el("pre", { "aria-live": "off", tabindex: "0", "aria-label": `output of ${op.operation_id}` });
  const bar = el("span");
  const meta = el("span", { class: "meta" });
  const st = el("span");
  const li = el("li", { class: "card", "data-op": op.operation_id },
    el("div", { class: "head" }, st, el("code", { class: "cmd", title: cmdline(op.command) }, cmdline(op.command))),
    el("div", { class: "meta mono" }, `${op.operation_id} · run ${op.run_id} · `, meta),
    el("div", { class: "bar", role: "progressbar", "aria-label": "time used of the timeout" }, bar),
    out);
  const ctl = new AbortController();
  const c = { li, out, bar, meta, st, op, ctl, done: false, offset: 0 };
  follow(c);
  return c;
}

function update(c, op) {
  c.op = op;
  c.st.replaceChildren(status(op.status));
  const used = op.duration_sec / Math.max(1, op.timeout_sec);
  c.bar.style.width = `${Math.min(100, used * 100).toFixed(1)}%`;
  c.bar.parentElement.classList.toggle("late", used > 0.8);
  c.bar.parentElement.setAttribute("aria-valuenow", String(Math.round(used * 100)));
  c.meta.textContent = `age ${age(op.duration_sec)} of ${op.timeout_sec}s`;
}

// A browser keeps at most six HTTP/1.1 connections to one host: only a few
// cards hold a live stream, the others read their new output in short polls.
const MAX_STREAMS = 3;
let streams = 0;

async function follow(c) {
  if (streams >= MAX_STREAMS) return poll(c);
  streams++;
  try {
    await stream(c);
  } finally {
    streams--;
  }
}

function append(c, text) {
  const atEnd = c.out.scrollTop + c.out.clientHeight >= c.out.scrollHeight - 4;
  c.out.textContent = (c.out.textContent + text).slice(-65536);
  if (atEnd) c.out.scrollTop = c.out.scrollHeight;
}

async function poll(c) {
  const decoder = new TextDecoder();
  while (!c.done) {
    if (!document.hidden) {
      try {
        const r = await fetch(`/v1/operations/${c.op.operation_id}/log?offset=${c.offset}`, {
          headers: { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` }, signal: c.ctl.signal,
        });
        if (r.ok) {
          const bytes = new Uint8Array(await r.arrayBuffer());
          c.offset += bytes.length;
          if (bytes.length) append(c, decoder.decode(bytes, { stream: true }));
        }
      } catch (e) {
        if (c.ctl.signal.aborted) return;
      }
    }
    await new Promise((ok) => setTimeout(ok, 1500));
  }
}

async function stream(c) {
  try {
    await sse(`/v1/operations/${c.op.operation_id}/console?offset=${c.offset}`, (event, data) => {
      const v = JSON.parse(data);
      if (event === "output") {
        append(c, v.text);
        c.offset = v.offset;
      } else if (event === "done") {
        leave(c, v.status);
        return false;
      }
      return true;
    }, c.ctl.signal);
  } catch (e) {
    if (!c.ctl.signal.aborted) setTimeout(() => !c.done && poll(c), 2000);
  }
}

function leave(c, finalStatus) {
  if (c.done) return;
  c.done = true;
  c.ctl.abort();
  c.st.replaceChildren(status(finalStatus || "completed"));
  c.li.classList.add("leaving");
  setTimeout(() => {
    c.li.remove();
    state.cards.delete(c.op.operation_id);
    renderLiveCount();
  }, 1200);
}

function renderLiveCount() {
  const n = [...state.cards.values()].filter((c) => !c.done).length + (state.hidden || 0);
  $("live-count").textContent = n ? `(${n}${state.hidden ? `; ${state.hidden} not shown` : ""})` : "";
  $("live-empty").hidden = state.cards.size > 0;
}

// Cards shown at once; the rest are counted (a browser cannot follow
// thousands of outputs, nor a person read them).
const MAX_CARDS = 24;

async function refreshLive() {
  const ops = (await liveOps()).filter((op) => op.background && LIVE.has(op.status));
  const seen = new Set(ops.map((op) => op.operation_id));
  for (const op of ops) {
    const c = state.cards.get(op.operation_id);
    if (c) {
      if (!c.done) update(c, op);
    } else if (state.cards.size < MAX_CARDS) {
      const fresh = card(op);
      state.cards.set(op.operation_id, fresh);
      $("live-ops").append(fresh.li);
      update(fresh, op);
    }
  }
  // a card whose op is no longer live: it resolved (its final status says how)
  for (const c of state.cards.values()) {
    if (!c.done && !seen.has(c.op.operation_id)) {
      api("GET", `/v1/operations/${c.op.operation_id}`).then((op) => !LIVE.has(op.status) && leave(c, op.status), () => {});
    }
  }
  state.hidden = Math.max(0, ops.length - [...state.cards.values()].filter((c) => !c.done).length);
  renderLiveCount();
}

// ---- runs, trace, reports, budget ----------------------------------------

async function refreshRuns() {
  state.runs = (await api("GET", "/v1/runs")).runs;
  const ids = new Set(state.runs.map((r) => r.run_id));
  const kids = new Map();
  for (const r of state.runs) {
    const p = r.parent_run_id && ids.has(r.parent_run_id) ? r.parent_run_id : null;
    if (!kids.has(p)) kids.set(p, []);
    kids.get(p).push(r);
  }
  const items = [];
  const walk = (p, d) => (kids.get(p) || []).forEach((r) => { items.push([r, d]); walk(r.run_id, d + 1); });
  walk(null, 0);
  const shown = items.slice(0, 300);
  // the same tree: nothing rebuilt (focus and scroll stay where they are)
  const sig = JSON.stringify(shown.map(([r, d]) => [r.run_id, r.state, r.live_ops, d]));
  if (sig !== state.runsSig) {
    state.runsSig = sig;
    $("runs").replaceChildren(...shown.map(([r, d]) => {
      const li = el("li", {
        tabindex: "0", role: "button", "data-run": r.run_id,
        class: r.run_id === state.run ? "selected" : "",
        onclick: () => selectRun(r.run_id),
        onkeydown: (e) => (e.key === "Enter" || e.key === " ") && (e.preventDefault(), selectRun(r.run_id)),
      }, el("span", { class: "name mono" }, r.run_id), status(r.state),
      el("span", { class: "muted" }, r.live_ops ? `${r.live_ops} live` : ""));
      li.style.paddingLeft = `${0.4 + d * 1.1}rem`;
      return li;
    }));
  }
  if (!state.run && state.runs.length) selectRun(state.who.run_id || state.runs[state.runs.length - 1].run_id);
}

async function selectRun(run) {
  state.run = run;
  $("run-name").textContent = run;
  for (const li of $("runs").children) li.classList.toggle("selected", li.dataset.run === run);
  if (state.trace) state.trace.abort();
  const ctl = new AbortController();
  state.trace = ctl;
  $("trace").replaceChildren();
  state.reportsSig = null;
  refreshRun().catch(() => {});
  let after;
  try {
    const tail = await api("GET", `/v1/runs/${encodeURIComponent(run)}/events?tail=50`);
    if (ctl.signal.aborted) return;
    tail.events.forEach(traceLine);
    after = tail.last_seq;
  } catch (e) {
    return;
  }
  // live from there on, reconnecting (from the last event seen) if the
  // stream drops
  while (!ctl.signal.aborted) {
    try {
      await sse(`/v1/runs/${encodeURIComponent(run)}/events/stream?after=${after}`, (_, data) => {
        const e = JSON.parse(data);
        after = e.seq;
        traceLine(e);
        return true;
      }, ctl.signal);
    } catch (e) {
      // dropped: try again shortly
    }
    await new Promise((ok) => setTimeout(ok, 2000));
  }
}

function traceLine(e) {
  const list = $("trace");
  const atEnd = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
  const at = new Date(e.at).toISOString().slice(11, 23);
  const data = JSON.stringify(e.data);
  list.append(el("li", {}, `${at} `, el("span", { class: "kind" }, e.kind), e.operation_id ? ` ${e.operation_id.slice(0, 8)}` : "", ` ${data.length > 160 ? data.slice(0, 160) + "…" : data}`));
  while (list.children.length > 50) list.firstChild.remove();
  if (atEnd) list.scrollTop = list.scrollHeight;
}

async function refreshRun() {
  if (!state.run) return;
  const run = encodeURIComponent(state.run);
  const [r, reports] = await Promise.all([api("GET", `/v1/runs/${run}`), api("GET", `/v1/runs/${run}/reports?limit=5`)]);
  const budget = el("div", { class: "budget" });
  for (const [k, v] of Object.entries(r.used)) {
    const limit = r.budget[k];
    budget.append(el("span", { class: "muted" }, k), el("span", {}, limit === undefined ? `${v} used` : `${v} of ${limit} (${r.remaining[k]} left)`));
  }
  $("run-detail").replaceChildren(
    el("div", {}, status(r.state), r.parent_run_id ? ` child of ${r.parent_run_id}` : " top-level", r.children.length ? ` · ${r.children.length} children` : ""),
    el("h3", {}, "Budget"), budget);
  const sig = JSON.stringify(reports.reports.map((p) => [p.report_id, p.acked_at]));
  if (sig === state.reportsSig) return;
  state.reportsSig = sig;
  $("reports").replaceChildren(...(reports.reports.length ? reports.reports.map((p) =>
    el("details", { class: "report" }, el("summary", {}, `${p.created_at} · ${p.resolved} results · ${p.acked_at ? "acked" : "not acked yet"}`), el("pre", {}, p.text))) : [el("p", { class: "muted" }, "No report yet.")]));
}

// ---- approvals, schedules, containers, reaper ----------------------------

async function refreshApprovals() {
  const ops = (await api("GET", "/v1/approvals")).operations;
  $("approvals-count").textContent = ops.length ? `(${ops.length})` : "";
  const sig = JSON.stringify(ops.map((op) => [op.operation_id, op.approval && op.approval.escalated_at]));
  if (sig === state.approvalsSig) return;
  state.approvalsSig = sig;
  const operator = state.who.principal === "operator";
  $("approvals").replaceChildren(...(ops.length ? ops.map((op) => {
    const reason = el("input", { type: "text", placeholder: "reason to deny", "aria-label": `reason to deny ${op.operation_id}` });
    return el("li", { "data-op": op.operation_id },
      el("span", { class: "grow" }, el("code", {}, cmdline(op.command)), el("br"), el("span", { class: "muted mono" }, `${op.operation_id} · run ${op.run_id} · waiting ${age(op.duration_sec)}${op.approval && op.approval.escalated_at ? " · escalated" : ""}`)),
      operator ? [
        el("button", { type: "button", class: "approve", onclick: () => decide(op.operation_id, "approve") }, "Approve"),
        reason,
        el("button", { type: "button", class: "deny", onclick: () => decide(op.operation_id, "deny", reason.value) }, "Deny"),
      ] : el("span", { class: "muted" }, "an operator decides"));
  }) : [el("li", { class: "muted" }, "Nothing waits for approval.")]));
}

async function decide(op, verb, reason) {
  try {
    await api("POST", `/v1/operations/${op}/${verb}`, verb === "deny" ? { reason } : {});
  } catch (e) {
    alert(e.message);
  }
  refreshApprovals();
  refreshLive();
}

async function refreshSchedules() {
  const list = (await api("GET", "/v1/schedules")).schedules;
  $("schedules").replaceChildren(...(list.length ? list.map((s) => el("li", {},
    el("span", { class: "grow" }, el("code", {}, cmdline(s.command)), el("br"), el("span", { class: "muted" },
      `${s.cron || (s.every_sec ? `every ${s.every_sec}s` : `at ${s.at}`)} · run ${s.run_id} · next ${s.next_due_at || "-"} · last ${s.last_status || "-"}${s.last_exit_code !== null && s.last_exit_code !== undefined ? ` ${s.last_exit_code}` : ""}`)),
    status(!s.enabled ? "done" : s.paused ? "paused" : s.current_operation_id ? "running" : "waiting"))) : [el("li", { class: "muted" }, "No schedule.")]));
}

async function refreshContainers() {
  if (state.who.principal !== "operator") return;
  const [cs, ops] = await Promise.all([api("GET", "/v1/containers"), api("GET", "/v1/ops?live=true&limit=5000")]);
  const live = new Map();
  for (const op of ops.operations) {
    if (LIVE.has(op.status) && op.container_id) live.set(op.container_id, (live.get(op.container_id) || 0) + 1);
  }
  $("containers").replaceChildren(...(cs.containers.length ? cs.containers.map((c) => el("li", {},
    el("span", { class: "grow mono" }, c.name, el("br"), el("span", { class: "muted" }, `run ${c.run_id || "-"}${c.registered ? "" : " · not registered"}`)),
    status(c.state), el("span", { class: "muted" }, `${live.get(c.container_id) || 0} live ops`))) : [el("li", { class: "muted" }, "No container.")]));
}

async function dryRunReaper() {
  const list = await api("POST", "/v1/reap?dry_run=true");
  $("reaper").replaceChildren(...(list.decisions.length ? list.decisions.map((d) =>
    el("li", {}, status(String(d.action)), el("span", { class: "grow mono" }, d.name), el("span", { class: "muted" }, d.reason))) : [el("li", { class: "muted" }, "No container to decide about.")]));
}

// ---- loop ----------------------------------------------------------------

function every(ms, f) {
  const tick = async () => {
    // a hidden tab asks nothing
    if (!document.hidden) {
      try { await f(); } catch (e) { console.warn(e); }
    }
    setTimeout(tick, ms);
  };
  tick();
}

function start() {
  if (state.started) return;
  state.started = true;
  every(3000, refreshRuns);
  every(1000, refreshLive);
  every(2000, refreshApprovals);
  every(5000, refreshSchedules);
  every(5000, refreshContainers);
  every(3000, refreshRun);
  $("reap").addEventListener("click", () => dryRunReaper().catch((e) => alert(e.message)));
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin").addEventListener("submit", async (e) => {
    e.preventDefault();
    if (state.who) return;
    $("signin-error").textContent = "";
    try {
      await signIn($("token").value.trim());
      $("token").value = "";
    } catch (err) {
      $("signin-error").textContent = `Sign-in failed: ${err.message}`;
    }
  });
  $("signout").addEventListener("click", () => signOut());
  const saved = sessionStorage.getItem(KEY);
  if (saved) signIn(saved).catch(() => {});
  else $("token").focus();
});
