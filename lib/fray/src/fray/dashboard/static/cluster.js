// The cluster's live page: polls /api/state about once a second (not while the tab is hidden: common.js); each
// answer is the whole picture (fray/dashboard/cluster.py: JobRow, AttemptRow, LivePage).
"use strict";

const MAX_LANES = 40;
const STATES = ["RUNNING", "PENDING", "SUCCEEDED", "FAILED", "STOPPED"];

let S = { jobs: [], nodes: [], counts: {}, total: 0, now: 0, backend: "", where: {}, links: {}, note: "" };

// ------------------------------------------------------------------ formatting
function duration(ms) {
  if (!isFinite(ms) || ms < 0) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
  if (ms < 3600000) return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
  return `${Math.floor(ms / 3600000)} h ${Math.round((ms % 3600000) / 60000)} min`;
}
function when(ms) {
  if (ms === null || ms === undefined) return "–";
  const d = new Date(ms), today = new Date(S.now || Date.now());
  const time = d.toLocaleTimeString([], { hour12: false });
  return d.toDateString() === today.toDateString() ? time : `${d.toLocaleDateString()} ${time}`;
}
function quantities(q) {
  return Object.entries(q || {}).map(([k, v]) => k === "memory" ? `memory ${(v / 2 ** 30).toFixed(1)} GiB` : `${k} ${Number(v.toFixed(2))}`).join(", ") || "–";
}
const label = (j) => j.name ? `${j.name}` : j.entrypoint || j.id;

// ------------------------------------------------------------------ rendering
function renderHeader() {
  document.getElementById("backend").textContent = S.backend;
  document.getElementById("where").textContent = Object.entries(S.where).map(([k, v]) => `${k} ${v}`).join(" · ");
  renderEngineLinks(S.links, S.note);
}

function renderCounts() {
  document.getElementById("c-total").textContent = count(S.total);
  for (const state of STATES) {
    const n = S.counts[state] || 0;
    const cell = document.getElementById(`c-${state}`);
    cell.textContent = count(n);
    cell.classList.toggle("some", n > 0);
  }
  document.getElementById("c-nodes").textContent = count(S.nodes.length);
}

function livePage(j) {
  const cell = el("td", "live");
  if (j.state !== "RUNNING") { cell.textContent = "–"; cell.classList.add("muted"); return cell; }
  if (j.live && j.live.here) {
    const a = el("a", "live-link", "open live page");
    a.href = j.live.url; a.target = "_blank"; a.rel = "noopener noreferrer";
    cell.append(a);
  } else if (j.live) {
    const port = j.live.url.split(":")[2].split("/")[0];
    cell.append(el("span", "hint", `on ${j.live.host}: `), el("code", "mono", `ssh -L ${port}:127.0.0.1:${port} ${j.live.host}`));
  } else {
    cell.append(el("span", "hint", "none announced: "), el("code", "mono", `fray dashboard ${j.id}`));
  }
  return cell;
}

function renderJobs() {
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren(...S.jobs.map((j) => {
    const tr = el("tr");
    tr.dataset.job = j.id;
    const who = el("td");
    who.append(el("div", "mono job-id", j.id));
    if (j.name) who.append(el("div", "kind", j.name));
    // a job submitted with after=: what it waits for (or waited for, where it ended without running)
    if (j.waits_for.length) who.append(el("div", "kind waits", `${j.state === "PENDING" ? "waits for" : "waited for"} ${j.waits_for.join(", ")}`));
    const st = el("td"); st.append(el("span", `state st-${j.state}`, j.state.toLowerCase()));
    // the program by its name (/long/venv/bin/python -> python); the whole command is in the tip
    const short = j.entrypoint.replace(/^\S*\/(\S+)/, "$1");
    const entry = td(short.length > 60 ? `${short.slice(0, 59)}…` : short, "mono entry");
    entry.title = j.entrypoint;
    const end = j.ended ?? (j.started !== null ? S.now : null);
    const took = j.started !== null ? duration(end - j.started) : "–";
    const text = j.error || j.message || "";
    const msg = td(text.length > 120 ? `${text.slice(0, 119)}…` : text, `message${j.error || j.state === "FAILED" ? " error-text" : ""}`);
    msg.title = text;
    tr.append(who, st, entry, td(when(j.submitted), "mono"), td(when(j.started), "mono"), td(took, "num"),
      td(count(j.attempts.length), "num attempts"), td(j.exit_code === null ? "–" : String(j.exit_code), "num exit-code"),
      msg, livePage(j));
    return tr;
  }));
  document.getElementById("jobs-count").textContent = S.total > S.jobs.length ? `(newest ${count(S.jobs.length)} of ${count(S.total)})` : S.total ? `(${count(S.total)})` : "";
  show("jobs-empty", S.jobs.length === 0);
}

function renderChart() {
  const box = document.getElementById("chart");
  const jobs = S.jobs.filter((j) => j.submitted !== null || j.attempts.length).slice(0, MAX_LANES).reverse();  // oldest on top
  show("chart-empty", jobs.length === 0);
  if (!jobs.length) { box.replaceChildren(); return; }
  const now = S.now;
  let x0 = Infinity, x1 = -Infinity;
  for (const j of jobs) {
    for (const t of [j.submitted, j.started, j.ended]) if (t !== null) { x0 = Math.min(x0, t); x1 = Math.max(x1, t); }
    if (!j.ended) x1 = Math.max(x1, now);
  }
  if (x1 - x0 < 100) x1 = x0 + 100;  // (a running job is drawn to the right edge: now)
  const width = Math.max(400, box.clientWidth), left = 200, right = 10, top = 20, laneH = 20, gap = 4;
  const height = top + jobs.length * (laneH + gap) + 2;
  const scale = (width - left - right) / (x1 - x0);
  const x = (t) => left + (t - x0) * scale;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, height: String(height), role: "img" });
  const title = svg("title", {}); title.textContent = "jobs over time"; root.append(title);
  const span = x1 - x0, steps = [10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 15000, 30000, 60000, 120000, 300000, 600000, 900000,
    1800000, 3600000, 7200000, 21600000, 43200000, 86400000];
  const step = steps.find((s) => span / s <= 8) || 86400000;
  for (let t = Math.ceil(x0 / step) * step; t <= x1; t += step) {
    root.append(svg("line", { x1: x(t), x2: x(t), y1: top - 4, y2: height }, "tick"));
    if (x(t) + 60 > width) continue;
    const lbl = svg("text", { x: x(t) + 3, y: top - 7 }, "tick-label");
    const d = new Date(t);
    lbl.textContent = d.toLocaleTimeString([], { hour12: false }) + (step < 1000 ? `.${String(d.getMilliseconds()).padStart(3, "0").slice(0, step < 100 ? 2 : 1)}` : "");
    root.append(lbl);
  }
  jobs.forEach((j, i) => {
    const y = top + i * (laneH + gap);
    root.append(svg("rect", { x: left, y, width: width - left - right, height: laneH, rx: 2 }, "lane-bg"));
    const text = svg("text", { x: left - 8, y: y + laneH - 6, "text-anchor": "end" }, "lane-label");
    // a lane is named by the job's id (a named job's id holds its name); its tip adds the entrypoint
    text.textContent = j.id.length > 34 ? `${j.id.slice(0, 33)}…` : j.id;
    const tip = svg("title", {}); tip.textContent = `${j.id}: ${j.entrypoint}`; text.append(tip);
    root.append(text);
    const firstStart = j.attempts.length ? j.attempts[0].start : null;
    if (j.submitted !== null) {  // waiting: from submission to its first start (or now)
      const until = firstStart ?? (j.state === "PENDING" ? now : j.ended ?? now);
      if (until > j.submitted) {
        const w = svg("rect", { x: x(j.submitted), y: y + laneH / 2 - 1.5, width: Math.max(1, x(until) - x(j.submitted)), height: 3 }, "wait");
        const t = svg("title", {}); t.textContent = `${j.id} waited ${duration(until - j.submitted)}`; w.append(t);
        root.append(w);
      }
    }
    for (const a of j.attempts) {
      if (a.start === null) continue;
      const open = a.end === null;
      const b = open ? now : a.end;
      const xa = x(a.start), wide = x(b) - xa;
      const r = svg("rect", { x: xa, y: y + 3, width: Math.max(3, wide > 4 ? wide - 1 : wide), height: laneH - 6, rx: 2 },
        `attempt st-${open ? "RUNNING" : a.status}${open ? " open" : ""}`);
      const tip = svg("title", {});
      const how = open ? "running" : a.status.toLowerCase() + (a.exit_code !== null ? ` (exit ${a.exit_code})` : "");
      tip.textContent = `${label(j)} attempt ${a.number}: ${how}, ${duration(b - a.start)}${a.message ? ` · ${a.message}` : ""}`;
      r.append(tip);
      root.append(r);
    }
  });
  box.replaceChildren(root);
  const hidden = S.jobs.length - jobs.length;
  const note = document.getElementById("chart-note");
  note.hidden = hidden <= 0;
  note.textContent = hidden > 0 ? `The newest ${MAX_LANES} jobs are drawn; ${count(hidden)} older ones are in the table and the timeline.` : "";
}

function renderNodes() {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren(...S.nodes.map((n) => {
    const tr = el("tr");
    tr.append(td(n.node, "mono"), td(quantities(n.total)), td(quantities(n.free)));
    return tr;
  }));
  show("nodes-empty", S.nodes.length === 0);
}

function render() { renderHeader(); renderCounts(); renderChart(); renderJobs(); renderNodes(); }

document.addEventListener("DOMContentLoaded", () => {
  window.addEventListener("resize", () => renderChart());
  const unreadable = 503;  // the server could not read the cluster: it says so, and the page asks again
  startPolling({
    url: () => "api/state?since=0",
    take: (answer) => { S = answer; },
    render,
    signIn: "not signed in: open the URL that `fray dashboard` printed",
    lost: (e) => e.message === `HTTP ${unreadable}` ? "the cluster could not be read: trying again" :
      "disconnected: the page's server may have stopped",
  });
});
