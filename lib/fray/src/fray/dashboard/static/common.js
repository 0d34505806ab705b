// What both live pages (app.js: a job's, cluster.js: a cluster's) share: element helpers, the engine's links,
// the status line, and the poll loop (about once a second, not while the tab is hidden, backing off on failure).
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";

const nf = new Intl.NumberFormat();
const count = (n) => nf.format(n);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}
function svg(tag, attrs, cls) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (cls) e.setAttribute("class", cls);
  return e;
}
function td(text, cls) { return el("td", cls, text); }
function show(id, on) { document.getElementById(id).hidden = !on; }

function renderEngineLinks(links, note) {
  // the engine's own pages (Ray's dashboard), or why there is none (a backend's note)
  document.getElementById("links").replaceChildren(...Object.entries(links).map(([name, url]) => {
    const a = el("a", "engine-link", name);
    a.href = url; a.target = "_blank"; a.rel = "noopener noreferrer";
    return a;
  }));
  const line = document.getElementById("engine-note");
  line.hidden = !note;
  line.textContent = note;
}

function setStatus(cls, text) {
  document.getElementById("status").className = `status ${cls}`;
  document.getElementById("status-text").textContent = text;
}

// page: { url(): the state's address now; take(answer); render(); signIn: what to say without a session;
//         lost(error): what to say when an answer did not come }
function startPolling(page) {
  let timer = 0, failures = 0, stopped = false;
  async function poll() {
    timer = 0;
    if (stopped) return;
    try {
      const r = await fetch(page.url(), { cache: "no-store", credentials: "same-origin" });
      if (r.status === 401 || r.status === 403) {
        stopped = true;
        setStatus("lost", page.signIn);
        return;
      }
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      page.take(await r.json());
      page.render();
      failures = 0;
      setStatus("live", `live · updated ${new Date().toLocaleTimeString([], { hour12: false })}`);
    } catch (e) {
      failures++;
      setStatus("lost", page.lost(e));
    }
    schedule(Math.min(POLL_MS * 2 ** failures, 10000));
  }
  function schedule(ms) {
    if (!timer && !document.hidden && !stopped) timer = setTimeout(poll, ms);
  }
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) { clearTimeout(timer); timer = 0; } else schedule(0);
  });
  schedule(0);
}
