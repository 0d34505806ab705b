// The live page: polls /api/state?since=CURSOR about once a second (not while the tab is hidden: common.js) and
// merges what changed. Row layouts are fray/dashboard/model.py's.
"use strict";

const MAX_SPANS = 2000;
const MAX_ERRORS = 500;
const MAX_LANES = 60;

const S = {
  cursor: 0, t0: 0, now: 0, backend: "", dropped: 0, totals: {}, links: {}, note: "",
  fns: new Map(), actors: new Map(), transfers: new Map(), lanes: new Map(), processes: [],
  spans: [], errors: [], running: [], range: 0,
};

// ------------------------------------------------------------------ formatting
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0)} ${units[i]}`;
}
function duration(ms) {
  if (!isFinite(ms)) return "–";
  if (ms < 1) return `${Math.round(ms * 1000)} µs`;
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 2 : ms < 100 ? 1 : 0)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  const m = Math.floor(ms / 60000);
  return `${m} min ${Math.round((ms % 60000) / 1000)} s`;
}
const clock = (relMs) => new Date(S.t0 + relMs).toLocaleTimeString([], { hour12: false });

const colour = (fnIndex) => `c${fnIndex % 10}`;

// ------------------------------------------------------------------ merging an answer
function merge(a) {
  if (a.full) {
    for (const m of [S.fns, S.actors, S.transfers, S.lanes]) m.clear();
    S.spans = []; S.errors = [];
  }
  S.cursor = a.cursor; S.t0 = a.t0; S.now = a.now; S.backend = a.backend; S.dropped = a.dropped;
  S.totals = a.totals; S.links = a.links || {}; S.note = a.note || "";
  // times come in us after the first event (integers: cheap to make and to send); the page works in ms
  S.running = a.running.map((r) => [r[0], r[1], r[2] / 1000]);
  for (const s of a.spans) { s[3] /= 1000; s[4] /= 1000; }
  for (const e of a.errors) e[1] /= 1000;
  for (const f of a.functions) S.fns.set(f[0], f);
  for (const r of a.actors) S.actors.set(r[0], r);
  for (const r of a.transfers) S.transfers.set(r[0], r);
  for (const r of a.lanes) S.lanes.set(r[0], r);
  if (a.processes) S.processes = a.processes;
  S.spans = S.spans.concat(a.spans).slice(-MAX_SPANS);
  S.errors = S.errors.concat(a.errors).slice(-MAX_ERRORS);
}

// ------------------------------------------------------------------ rendering
function renderTotals() {
  const t = S.totals;
  document.getElementById("backend").textContent = S.backend;
  document.getElementById("t-done").textContent = count(t.done);
  const running = document.getElementById("t-running");
  running.textContent = count(t.running);
  running.classList.toggle("some", t.running > 0);
  document.getElementById("t-queued").textContent = count(t.queued);
  const failed = document.getElementById("t-failed");
  failed.textContent = count(t.failed);
  failed.classList.toggle("some", t.failed > 0);
  document.getElementById("t-actors").textContent = `${count(t.alive)} / ${count(t.actors)}`;
  document.getElementById("t-bytes").textContent = bytes(t.bytes);
  document.getElementById("t-processes").textContent = count(S.processes.length);
  document.getElementById("t-events").textContent = count(t.events);
  const notice = document.getElementById("notice");
  notice.hidden = !S.dropped;
  if (S.dropped) {
    notice.textContent = `${count(S.dropped)} events were dropped before they could be read (a process's ` +
      "ring was full): counts below miss them. FRAY_EVENTS_CAPACITY sets the ring's size.";
  }
}

function renderFunctions() {
  const body = document.querySelector("#functions tbody");
  const rows = [...S.fns.values()].sort((a, b) => a[0] - b[0]);
  body.replaceChildren(...rows.map(([index, name, kind, queued, running, done, failed, cancelled, retries, busy]) => {
    const tr = el("tr", colour(index));
    tr.dataset.fn = name;
    const cell = el("td");
    const label = el("span", "fn-name");
    label.append(el("span", "swatch"), el("span", "mono", name), el("span", "kind", kind === "call" ? "actor" : "task"));
    cell.append(label);
    const total = queued + running + done + failed + cancelled;
    const bar = el("div", "bar");
    bar.title = `${done} done, ${running} running, ${queued} queued, ${failed} failed` +
      (cancelled ? `, ${cancelled} cancelled` : "") + (retries ? `, ${retries} retried` : "");
    for (const [cls, n] of [["done", done], ["failed", failed], ["running", running], ["queued", queued]]) {
      if (!n) continue;
      const seg = el("span", cls);
      seg.style.width = `${(100 * n) / total}%`;
      bar.append(seg);
    }
    const barCell = el("td"); barCell.append(bar);
    const ended = done + failed;
    tr.append(cell, barCell, td(count(done), "num done"), td(count(running), "num running"),
      td(count(queued), "num queued"), td(count(failed), `num failed${failed ? " some" : ""}`),
      td(ended ? duration(busy / ended) : "–", "num"));
    return tr;
  }));
  show("functions-empty", rows.length === 0);
}

function laneLabels() {
  // "driver · MainThread"; lanes whose label repeats in a process are numbered
  const seen = new Map(), labels = new Map();
  for (const [id, proc, , label] of [...S.lanes.values()].sort((a, b) => a[0] - b[0])) {
    const p = S.processes[proc];
    const key = `${proc}/${label}`;
    const n = (seen.get(key) || 0) + 1;
    seen.set(key, n);
    const where = p ? (S.processes.length > 1 ? `${p[3]} ${p[2]}` : p[3]) : `process ${proc}`;
    labels.set(id, { text: `${where} · ${label}`, key, n, proc });
  }
  for (const v of labels.values()) if (seen.get(v.key) > 1) v.text += ` ${v.n}`;
  return labels;
}

function renderStream() {
  const box = document.getElementById("stream");
  const spans = S.spans, running = S.running;
  show("stream-empty", spans.length === 0 && running.length === 0);
  if (!spans.length && !running.length) { box.replaceChildren(); return; }
  const nowRel = S.now - S.t0;
  let x1 = running.length ? nowRel : 0, x0 = Infinity;
  for (const s of spans) { x1 = Math.max(x1, s[4]); x0 = Math.min(x0, s[3]); }
  for (const r of running) x0 = Math.min(x0, r[2]);
  if (S.range) x0 = Math.max(x0, x1 - S.range);
  if (x1 - x0 < 1) x1 = x0 + 1;
  const active = new Map();  // lane -> last time it was busy
  const visible = (a, b) => b >= x0 && a <= x1;
  for (const s of spans) if (visible(s[3], s[4])) active.set(s[1], Math.max(active.get(s[1]) || 0, s[4]));
  for (const r of running) active.set(r[0], x1);
  const labels = laneLabels();
  let lanes = [...active.keys()];
  const hiddenLanes = Math.max(0, lanes.length - MAX_LANES);
  if (hiddenLanes) lanes = lanes.sort((a, b) => active.get(b) - active.get(a)).slice(0, MAX_LANES);
  lanes.sort((a, b) => {
    const la = labels.get(a), lb = labels.get(b);
    return (la ? la.proc : 0) - (lb ? lb.proc : 0) || (la ? la.text : "").localeCompare(lb ? lb.text : "", undefined, { numeric: true });
  });
  const row = new Map(lanes.map((id, i) => [id, i]));
  const width = Math.max(400, box.clientWidth), left = 190, right = 8, top = 18, laneH = 18, gap = 3;
  const height = top + lanes.length * (laneH + gap) + 2;
  const scale = (width - left - right) / (x1 - x0);
  const x = (t) => left + (t - x0) * scale;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, height: String(height), role: "img" });
  root.append(svg("title", {}));
  root.firstChild.textContent = "task stream";
  // time ticks
  const span = x1 - x0, steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 15000, 30000, 60000,
    120000, 300000, 600000, 1800000, 3600000];
  const step = steps.find((s) => span / s <= 8) || 3600000;
  for (let t = Math.ceil(x0 / step) * step; t <= x1; t += step) {
    root.append(svg("line", { x1: x(t), x2: x(t), y1: top - 4, y2: height }, "tick"));
    if (x(t) + 48 > width) continue;  // a label that would be cut off
    const lbl = svg("text", { x: x(t) + 3, y: top - 6 }, "tick-label");
    lbl.textContent = `+${duration(t)}`;
    root.append(lbl);
  }
  lanes.forEach((id, i) => {
    const y = top + i * (laneH + gap);
    root.append(svg("rect", { x: left, y, width: width - left - right, height: laneH, rx: 2 }, "lane-bg"));
    const text = svg("text", { x: left - 8, y: y + laneH - 5, "text-anchor": "end" }, "lane-label");
    const lbl = labels.get(id);
    const full = lbl ? lbl.text : `lane ${id}`;
    text.textContent = full.length > 30 ? `${full.slice(0, 29)}…` : full;
    const tip = svg("title", {}); tip.textContent = full; text.append(tip);
    root.append(text);
  });
  const bar = (laneId, fnIndex, a, b, status, open) => {
    const i = row.get(laneId);
    if (i === undefined || !visible(a, b)) return;
    const xa = x(Math.max(a, x0)), wide = x(Math.min(b, x1)) - xa;
    const w = wide > 4 ? wide - 1 : Math.max(3, wide);  // a hairline between back-to-back bars; short ones seen
    const cls = `span ${colour(fnIndex)}${status === "ok" ? "" : ` ${status === "cancelled" ? "cancelled" : "failed"}`}${open ? " open" : ""}`;
    const r = svg("rect", { x: xa, y: top + i * (laneH + gap) + 2, width: w, height: laneH - 4, rx: 2 }, cls);
    const fn = S.fns.get(fnIndex);
    const tip = svg("title", {});
    tip.textContent = `${fn ? fn[1] : "?"} · ${open ? "running for " : ""}${duration(b - a)}${status === "ok" ? "" : ` · ${status}`}`;
    r.append(tip);
    root.append(r);
  };
  for (const s of spans) bar(s[1], s[2], s[3], s[4], s[5], false);
  for (const r of running) bar(r[0], r[1], r[2], nowRel, "ok", true);
  box.replaceChildren(root);
  const note = document.getElementById("stream-note");
  note.hidden = !hiddenLanes;
  note.textContent = hiddenLanes ? `${hiddenLanes} quieter lanes not drawn (the ${MAX_LANES} most recently busy are).` : "";
}

function renderActors() {
  const body = document.querySelector("#actors tbody");
  const rows = [...S.actors.values()];
  body.replaceChildren(...rows.map(([key, name, state, restarts, calls, reason]) => {
    const tr = el("tr");
    tr.dataset.actor = key;
    const who = el("td"); who.append(el("span", "mono", name || "actor"), el("span", "kind", ` #${key}`));
    const st = el("td"); st.append(el("span", `state ${state}`, state));
    tr.append(who, st, td(count(calls), "num calls"), td(count(restarts), "num restarts"), td(reason, "reason"));
    return tr;
  }));
  show("actors-empty", rows.length === 0);
}

function renderTransfers() {
  const body = document.querySelector("#transfers tbody");
  const rows = [...S.transfers.values()].sort((a, b) => b[2] - a[2]);
  body.replaceChildren(...rows.map(([path, n, nbytes, seconds]) => {
    const tr = el("tr");
    tr.dataset.path = path;
    const b = td(bytes(nbytes), "num bytes");
    b.title = `${count(nbytes)} bytes`;
    b.dataset.bytes = String(nbytes);
    tr.append(td(path, "mono"), td(count(n), "num"), b, td(seconds > 0 ? `${bytes(nbytes / seconds)}/s` : "–", "num"));
    return tr;
  }));
  show("transfers-empty", rows.length === 0);
}

function renderErrors() {
  const body = document.querySelector("#errors tbody");
  const rows = S.errors.slice().reverse();  // newest first
  body.replaceChildren(...rows.map(([, t, fn, kind, error, process]) => {
    const tr = el("tr");
    const when = td(clock(t), "mono");
    when.title = `+${duration(t)} after the first event`;
    const what = el("td"); what.append(el("span", "mono", fn), el("span", "kind", ` ${kind === "call" ? "actor" : kind}`));
    tr.append(when, what, td(error, "error-type"), td(process, "reason"));
    return tr;
  }));
  document.getElementById("errors-count").textContent = S.totals.errors ? `(${count(S.totals.errors)})` : "";
  show("errors-empty", rows.length === 0);
}

function renderProcesses() {
  const body = document.querySelector("#processes tbody");
  body.replaceChildren(...S.processes.map(([, host, pid, label, threads, dropped]) => {
    const tr = el("tr");
    tr.append(td(label), td(host, "mono"), td(String(pid), "num mono"), td(count(threads), "num"),
      td(count(dropped), `num${dropped ? " failed some" : ""}`));
    return tr;
  }));
}

function render() {
  renderTotals(); renderEngineLinks(S.links, S.note); renderFunctions(); renderStream(); renderActors();
  renderTransfers(); renderErrors(); renderProcesses();
}

document.addEventListener("DOMContentLoaded", () => {
  for (const b of document.querySelectorAll("#range button")) {
    b.addEventListener("click", () => {
      S.range = Number(b.dataset.range);
      for (const o of document.querySelectorAll("#range button")) o.classList.toggle("on", o === b);
      renderStream();
    });
  }
  window.addEventListener("resize", () => renderStream());
  startPolling({
    url: () => `api/state?since=${S.cursor}`,
    take: merge,
    render,
    signIn: "not signed in: open the URL that ctx.dashboard() returned",
    lost: () => "disconnected: the job may have ended",
  });
});
