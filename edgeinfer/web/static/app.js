// edgeinfer's pages: plain JS, no library, nothing fetched from outside the device.
// Everything that comes from the device (names, labels, event fields) goes into the DOM as
// text (textContent / attributes), never as HTML: labels come from models and configs.
"use strict";

const REFRESH_MS = 2000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function $(id) { return document.getElementById(id); }

function showError(message) {
  const box = $("error");
  if (!box) return;
  box.textContent = message || "";
  box.hidden = !message;
}

function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [key, ...rest] = part.trim().split("=");
    if (key === name) return decodeURIComponent(rest.join("="));
  }
  return null;
}

async function request(method, path, body) {
  const headers = { "Accept": "application/json" };
  const init = { method, headers, credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const csrf = cookie("edgeinfer_csrf");
  if (method !== "GET" && csrf) headers["X-Edgeinfer-CSRF"] = csrf;
  const response = await fetch(path, init);
  if (response.status === 401) {
    location.assign("/login");
    throw new Error("not logged in");
  }
  let data = null;
  try { data = await response.json(); } catch (_) { data = null; }
  if (!response.ok) {
    const why = data && data.error ? data.error : response.statusText;
    throw new Error(`${method} ${path}: ${response.status} ${why}`);
  }
  return data;
}

const api = (path) => request("GET", path);

function every(ms, job) {
  let timer = null;
  const tick = async () => {
    try { await job(); showError(""); } catch (err) { showError(err.message); }
    timer = setTimeout(tick, ms);
  };
  tick();
  return () => clearTimeout(timer);
}

function fmt(value, digits = 1) {
  if (value === null || value === undefined || value === "") return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  return String(value);
}

function when(ts) {
  return typeof ts === "number" ? new Date(ts * 1000).toLocaleTimeString() : fmt(ts);
}

function eventTime(e) {
  // start/end are wall clock seconds; t is the scene clock (the source's own time)
  for (const v of [e.end, e.start]) if (typeof v === "number" && v > 1e9) return when(v);
  return typeof e.t === "number" ? `at ${e.t.toFixed(1)} s` : "";
}

function listOf(data, key) {
  if (Array.isArray(data)) return data;
  return data && Array.isArray(data[key]) ? data[key] : [];
}

function rows(pairs) {
  const dl = el("dl", { class: "kv" });
  for (const [key, value] of pairs) dl.append(el("dt", {}, key), el("dd", {}, value));
  return dl;
}

function setupLogout() {
  const button = $("logout");
  if (!button || !cookie("edgeinfer_csrf")) return;
  button.hidden = false;
  button.addEventListener("click", async () => {
    await fetch("/logout", { method: "POST", credentials: "same-origin",
      headers: { "X-Edgeinfer-CSRF": cookie("edgeinfer_csrf") || "" } });
    location.assign("/login");
  });
}

// ---- device page -------------------------------------------------------------------------

function counters(analytics) {
  const counts = analytics && analytics.counts;
  if (!counts) return null;
  const list = el("ul", { class: "counts" });
  for (const [name, z] of Object.entries(counts.zones || {})) {
    list.append(el("li", {}, el("b", {}, `zone ${name}`),
      ` occupancy ${fmt(z.occupancy)} · entered ${fmt(z.entered)} · exited ${fmt(z.exited)}` +
      ` · loiter ${fmt(z.loiter)}`));
  }
  for (const [name, l] of Object.entries(counts.lines || {})) {
    list.append(el("li", {}, el("b", {}, `line ${name}`), ` in ${fmt(l.in)} · out ${fmt(l.out)}`));
  }
  return list;
}

function latencyText(latency) {
  const e2e = latency && latency.end_to_end;
  const infer = latency && latency.infer;
  if (!e2e) return "–";
  return `end to end p50 ${fmt(e2e.p50)} ms, p99 ${fmt(e2e.p99)} ms` +
    (infer ? ` · inference p50 ${fmt(infer.p50)} ms` : "");
}

function dropsText(dropped) {
  if (!dropped) return "–";
  return Object.entries(dropped).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ");
}

// A pipeline's state (edgeinfer/health.py): only "running" is healthy; these mean it does not
// do its job and show red, with the reason.
const BAD_STATES = new Set(["no_source", "reconnecting", "failed"]);

function healthOf(info, stats) {
  const h = info.health || stats.health || {};
  return { state: h.state || stats.state || info.state || "?", reason: h.reason || "",
    retries: h.retries || 0, next_retry_at: h.next_retry_at };
}

function stateWords(state) { return String(state).replace(/_/g, " "); }

function healthText(h) {
  const parts = [h.reason];
  if (h.retries) parts.push(`${h.retries} ${h.retries === 1 ? "retry" : "retries"}`);
  if (typeof h.next_retry_at === "number") {
    parts.push(`next in ${Math.max(0, Math.round(h.next_retry_at - Date.now() / 1000))} s`);
  }
  return parts.filter(Boolean).join(" · ");
}

function modelText(model) {
  // "name version", or the name alone: no dangling "–" when the version is unknown
  const parts = [model.name, model.version].filter((v) => v !== null && v !== undefined && v !== "");
  return parts.length ? parts.join(" ") : "–";
}

function stateBadge(state, attrs) {
  return el("span", { class: `badge ${state}`, "data-state": state, ...attrs }, stateWords(state));
}

function pipelineCard(info, stats, backend) {
  const name = info.name;
  const model = info.model || stats.model || {};
  const health = healthOf(info, stats);
  const state = health.state;
  const choice = (backend && backend.choice) || (stats.backend && stats.backend.choice) ||
    info.backend || stats.provider;
  const backendText = typeof choice === "object" ? JSON.stringify(choice) : fmt(choice);
  const bad = BAD_STATES.has(state);
  const card = el("article", { class: bad ? "card bad" : "card", "data-pipeline": name },
    el("h2", {}, el("a", { href: `/live/${encodeURIComponent(name)}` }, name), " ",
      stateBadge(state, { "data-field": "state" })));
  if (health.reason || (state !== "running" && health.retries)) {  // running: broken frames left out
    card.append(el("p", { class: bad ? "reason error" : "reason muted", "data-field": "reason",
      role: bad ? "alert" : null }, healthText(health)));
  }
  card.append(
    rows([
      ["Task", fmt(info.task && typeof info.task === "object" ? info.task.type : info.task)],
      ["Model", modelText(model)],
      ["Backend", el("span", { "data-field": "backend" }, backendText)],
      ["Why", fmt(backend && backend.decision)],
      ["Frames/s", el("span", { "data-field": "fps" }, fmt(stats.fps ?? info.fps, 2))],
      ["Latency", latencyText(stats.latency_ms)],
      ["Dropped", dropsText(stats.dropped)],
      ["Events", el("span", { "data-field": "events" }, fmt(stats.events))],
    ]));
  if (stats.last_error && !bad) card.append(el("p", { class: "error" }, stats.last_error));
  const list = counters(stats.analytics);
  if (list) card.append(list);
  card.append(el("p", {}, el("a", { href: `/live/${encodeURIComponent(name)}` }, "Live view ›")));
  return card;
}

function deviceSummary(status) {
  const stats = status.stats || {};
  const outbox = stats.outbox;
  const ota = stats.ota;
  return rows([
    ["Device", fmt(status.device)],
    ["Version", fmt(status.version)],
    ["Uptime", `${fmt(stats.uptime_s, 0)} s`],
    ["Memory", stats.memory && stats.memory.processes > 1
      ? `${fmt(stats.memory.pss_mb)} MB in ${stats.memory.processes} processes`
      : `${fmt(stats.memory_mb)} MB`],
    ["Outbox", outbox ? `${fmt(outbox.depth)} queued` : "no MQTT"],
    ["OTA", ota ? fmt(ota.state || (ota.busy ? "busy" : "idle")) : "off"],
    ["Not running", notRunning(status)],
  ]);
}

function notRunning(status) {
  // every pipeline whose state is not "running" (a camera that cannot be read, paused, failed
  // to start), not only those that failed to start
  const states = { ...Object.fromEntries(Object.keys(status.failed || {}).map((n) => [n, "failed"])) };
  for (const [name, h] of Object.entries(status.health || {})) states[name] = h.state;
  const names = Object.entries(states).filter(([, state]) => state !== "running");
  if (!names.length) return "none";
  const list = el("span", { "data-field": "not-running" });
  names.forEach(([name, state], i) => {
    list.append(i ? ", " : "", `${name} `, stateBadge(state));
  });
  return list;
}

async function refreshDevice() {
  const [status, pipelines] = await Promise.all([api("/v1/status"), api("/v1/pipelines")]);
  $("device").textContent = status.device || "";
  $("summary").replaceChildren(deviceSummary(status));
  const stats = (status.stats && status.stats.pipelines) || {};
  const backends = status.backends || {};
  const cards = listOf(pipelines, "pipelines").map(
    (p) => pipelineCard(p, stats[p.name] || {}, backends[p.name]));
  $("pipelines").replaceChildren(...cards);
  $("updated").textContent = `Last update ${new Date().toLocaleTimeString()}.`;
}

// ---- events (shared by the live and events pages) ----------------------------------------

function eventTitle(e) {
  const where = e.zone ? `zone ${e.zone}` : e.line ? `line ${e.line}` : "";
  const who = [e.label, e.track_id !== undefined && e.track_id !== null ? `#${e.track_id}` : ""]
    .filter(Boolean).join(" ");
  return [e.type, e.direction, where, who].filter(Boolean).join(" · ");
}

function eventItem(e, withClip) {
  const item = el("li", { class: "event", "data-event": e.event_id },
    el("div", { class: "meta" },
      el("b", {}, eventTitle(e)),
      el("span", { class: "muted" }, ` ${e.pipeline || ""} ${eventTime(e)}`),
      e.dwell_s !== null && e.dwell_s !== undefined ? el("span", {}, ` dwell ${fmt(e.dwell_s)} s`) : null));
  if (e.snapshot_url) {
    item.append(el("img", { src: e.snapshot_url, alt: `Snapshot of ${eventTitle(e)}`,
      class: "thumb" }));
  } else if (e.snapshot_missing) {
    item.append(el("span", { class: "snapshot-missing error" }, `No snapshot: ${e.snapshot_missing}`));
  } else if (e.snapshot_pending) {
    item.append(el("span", { class: "snapshot-pending muted" }, "Snapshot being written…"));
  }
  if (withClip && e.clip_url) {
    item.append(el("video", { src: e.clip_url, controls: true, preload: "metadata",
      muted: true, playsInline: true, class: "clip" }));
  }
  return item;
}

function updateEvents(list, events, withClip) {
  // Keep the nodes of events already shown: a playing clip must not restart every 2 s.
  const shown = new Map([...list.children].map((n) => [n.dataset.event, n]));
  const nodes = events.map((e) => {
    const old = shown.get(String(e.event_id));
    const fresh = !old || (e.clip_url && !old.querySelector("video") && withClip) ||
      (e.snapshot_url && !old.querySelector("img")) ||
      (e.snapshot_missing && !old.querySelector(".snapshot-missing"));
    return fresh ? eventItem(e, withClip) : old;
  });
  if (!nodes.length) nodes.push(el("li", { class: "muted" }, "No events yet."));
  list.replaceChildren(...nodes);
}

// ---- live page ---------------------------------------------------------------------------

function pipelineName() {
  const parts = location.pathname.split("/").filter(Boolean);
  return decodeURIComponent(parts[parts.length - 1] || "");
}

function histogramSeries(data) {
  // {"end_to_end": {"bins_ms": [...], "counts": [...]}, "infer": {...}} or a list of series
  const series = [];
  const source = Array.isArray(data) ? data : Object.entries(data || {}).map(([k, v]) => ({ name: k, ...v }));
  for (const s of source) {
    if (!s || typeof s !== "object") continue;
    const edges = s.bins_ms || s.bins || s.edges_ms || s.edges || (data && data.bins_ms);
    if (Array.isArray(s.counts) && Array.isArray(edges)) series.push({ name: s.name, edges, counts: s.counts });
  }
  const main = series.filter((s) => s.name === "end_to_end" || s.name === "infer");
  return main.length ? main : series;
}

const SERIES_WORDS = { end_to_end: "end to end", infer: "inference", pre: "preprocessing",
  post: "postprocessing", wait: "waiting for the shared model" };

function drawHistogram(canvas, series) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 22;
  ctx.clearRect(0, 0, w, h);
  const colours = ["#2b7de9", "#e9812b", "#3a3"];
  const bins = Math.max(1, ...series.map((s) => s.counts.length));
  const top = Math.max(1, ...series.flatMap((s) => s.counts));
  const slot = (w - pad) / bins;
  series.forEach((s, k) => {
    ctx.fillStyle = colours[k % colours.length];
    const bar = slot / series.length;
    s.counts.forEach((c, i) => {
      const bh = (h - 2 * pad) * c / top;
      ctx.fillRect(pad + i * slot + k * bar, h - pad - bh, Math.max(1, bar - 1), bh);
    });
  });
  ctx.fillStyle = "#666";
  ctx.font = "11px sans-serif";
  const edges = series.length ? series[0].edges : [];
  for (let i = 0; i < edges.length; i += Math.max(1, Math.ceil(edges.length / 8))) {
    ctx.fillText(String(edges[i]), pad + i * slot, h - 6);
  }
  ctx.fillText(`${top}`, 2, pad);
  return series.map((s, k) => `${SERIES_WORDS[s.name] || stateWords(s.name)} ` +
    `(${["blue", "orange", "green"][k % 3]})`).join(", ");
}

async function command(verb, name) {
  return request("POST", `/v1/commands/${verb}`, { pipeline: name });
}

function setupLive() {
  const name = pipelineName();
  document.title = `edgeinfer: ${name}`;
  $("title").textContent = name;
  const live = $("live");
  const stream = `/v1/pipelines/${encodeURIComponent(name)}/live.mjpg`;
  // The stream is opened once the pipeline has a frame (see refreshLive): one that has none
  // would hold the page's load forever behind an image that never comes.
  live.addEventListener("error", () => {
    // the stream ends when the server restarts or turns viewers away: try again later
    setTimeout(() => { live.src = `${stream}?t=${Date.now()}`; }, REFRESH_MS);
  });
  const said = $("said");
  for (const verb of ["pause", "resume"]) {
    $(verb).addEventListener("click", async () => {
      try { await command(verb, name); said.textContent = `${verb}d`; refreshLive(); } catch (err) { showError(err.message); }
    });
  }
  $("snapshot").addEventListener("click", async () => {
    try {
      const answer = await command("snapshot", name);
      const result = (answer && answer.result) || {};
      const url = `/v1/pipelines/${encodeURIComponent(name)}/snapshot.jpg?t=${Date.now()}`;
      $("snapshot-img").src = url;
      $("snapshot-when").textContent = `Snapshot at ${new Date().toLocaleTimeString()}` +
        (result.bytes ? `, ${result.bytes} bytes` : "");
      $("snapshot-box").hidden = false;
      said.textContent = "snapshot taken";
    } catch (err) { showError(err.message); }
  });
  const refreshLive = async () => {
    const [pipelines, latency, events] = await Promise.all([
      api("/v1/pipelines"),
      api(`/v1/pipelines/${encodeURIComponent(name)}/latency`),
      api(`/v1/events?pipeline=${encodeURIComponent(name)}&limit=10`),
    ]);
    const info = listOf(pipelines, "pipelines").find((p) => p.name === name);
    if (!info) throw new Error(`no pipeline ${name}`);
    const health = healthOf(info, info.stats || {});
    const state = health.state;
    $("state").textContent = stateWords(state);
    $("state").className = `badge ${state}`;
    $("fps").textContent = `${fmt(info.fps, 2)} frames/s`;
    // No frame to show (the camera cannot be read, or none came yet): say why instead of a
    // black box.
    const noFrame = BAD_STATES.has(state) || state === "starting" || !info.frame;
    const placeholder = $("live-placeholder");
    placeholder.hidden = !noFrame;
    live.hidden = noFrame;
    if (!noFrame && !live.getAttribute("src")) live.src = stream;
    placeholder.replaceChildren(
      el("b", {}, BAD_STATES.has(state) ? `No picture: ${stateWords(state)}` : "No frame yet"),
      el("span", {}, healthText(health) || "waiting for the first frame"));
    $("histogram-legend").textContent = drawHistogram($("histogram"), histogramSeries(latency)) + " · ms";
    updateEvents($("events"), listOf(events, "events"), true);
  };
  every(REFRESH_MS, refreshLive);
}

// ---- events page -------------------------------------------------------------------------

function setupEvents() {
  const pick = $("pipeline"), type = $("type");
  const params = new URLSearchParams(location.search);
  const refresh = async () => {
    const query = new URLSearchParams({ limit: "50" });
    if (pick.value) query.set("pipeline", pick.value);
    if (type.value) query.set("type", type.value);
    const [pipelines, events] = await Promise.all([api("/v1/pipelines"), api(`/v1/events?${query}`)]);
    const names = listOf(pipelines, "pipelines").map((p) => p.name);
    const known = new Set([...pick.options].map((o) => o.value));
    for (const n of names) if (!known.has(n)) pick.append(el("option", { value: n }, n));
    updateEvents($("events"), listOf(events, "events"), true);
  };
  pick.value = params.get("pipeline") || "";
  for (const control of [pick, type]) control.addEventListener("change", () => { $("events").replaceChildren(); refresh(); });
  every(REFRESH_MS, refresh);
}

function setupLogin() {
  // Without JS the form posts as it is; with it a refusal shows here instead of raw JSON.
  const form = document.querySelector("form.login");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = new URLSearchParams(new FormData(form));
    const response = await fetch("/login", { method: "POST", body, credentials: "same-origin" });
    if (response.ok) { location.assign("/"); return; }
    let why = response.statusText;
    try { why = (await response.json()).error || why; } catch (_) { /* not JSON */ }
    showError(`Not logged in: ${why}`);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  setupLogout();
  const page = document.body.dataset.page;
  if (page === "device") every(REFRESH_MS, refreshDevice);
  else if (page === "live") setupLive();
  else if (page === "events") setupEvents();
  else if (page === "login") setupLogin();
});
