// The Hyphae dashboard: plain JavaScript, no build step.
//
// The API key lives in sessionStorage (this tab only) and travels in an Authorization
// header, never in a URL: the live stream is read with fetch() and a ReadableStream
// because EventSource cannot send headers. Everything from the node (cell content
// above all) is put on the page as text, never as HTML.
"use strict";

const KEY_ITEM = "hyphae.apiKey";
const ADMIN_ITEM = "hyphae.adminToken";
const $ = (selector) => document.querySelector(selector);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

const short = (id) => (id ? String(id).slice(0, 12) : "");
const when = (ms) => (ms ? new Date(ms).toLocaleTimeString() : "");

function ago(ms, now) {
  if (!ms) return "never";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  return s < 60 ? `${s}s ago` : s < 3600 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
}

// -- the key and REST --------------------------------------------------------------

const state = {
  key: sessionStorage.getItem(KEY_ITEM), admin: sessionStorage.getItem(ADMIN_ITEM),
  stream: null, mesh: null, inboxCount: 0, recentCursor: null,
};

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: { Authorization: `Bearer ${state.key}`, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
    cache: "no-store",
  });
  const data = response.status === 204 ? null : await response.json();
  if (!response.ok) {
    const error = new Error((data && data.error && data.error.message) || `HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

function showLogin(message) {
  if (state.stream) state.stream.abort();
  state.stream = null;
  state.inboxCount = 0;
  for (const list of ["#inbox", "#flow-log", "#recent", "#search-results", "#scenes", "#scene-detail", "#beacons"]) $(list).replaceChildren();
  $("#dashboard").hidden = true;
  $("#sign-out").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
  $("#key").focus();
}

async function signIn(key, admin) {
  state.key = key;
  state.admin = admin || null;
  try {
    const me = await api("GET", "/v1/whoami");
    sessionStorage.setItem(KEY_ITEM, key);
    if (state.admin) sessionStorage.setItem(ADMIN_ITEM, state.admin);
    else sessionStorage.removeItem(ADMIN_ITEM);
    $("#inbox-title").textContent = state.admin ? "Every agent's inbox on this node" : `Inbox of ${me.name}`;
    $("#agent").textContent = `agent ${me.name}`;
    $("#node").textContent = `node ${short(me.node_id)}`;
    $("#login").hidden = true;
    $("#dashboard").hidden = false;
    $("#sign-out").hidden = false;
    $("#inbox").replaceChildren();
    state.inboxCount = 0;
    addInbox([]);
    if (state.stream) state.stream.abort();
    openStream();
    loadTab("recent");
  } catch (error) {
    sessionStorage.removeItem(KEY_ITEM);
    sessionStorage.removeItem(ADMIN_ITEM);
    showLogin(error.status === 401 ? "That key is not valid (unknown or revoked)." : error.message);
  }
}

// -- the live stream ---------------------------------------------------------------

function setLive(on) {
  const badge = $("#live");
  badge.textContent = on ? "live" : "offline";
  badge.className = `badge ${on ? "on" : "off"}`;
}

async function openStream() {
  const controller = new AbortController();
  state.stream = controller;
  let delay = 500;
  while (state.stream === controller) {
    try {
      const response = await fetch("/v1/events", {
        headers: {
          Authorization: `Bearer ${state.key}`, Accept: "text/event-stream",
          ...(state.admin ? { "X-Hyphae-Admin": state.admin } : {}),
        },
        signal: controller.signal,
        cache: "no-store",
      });
      if (response.status === 401) {
        const body = await response.json().catch(() => ({}));
        sessionStorage.removeItem(ADMIN_ITEM);
        return showLogin((body.error && body.error.message) || "The key no longer works (revoked?).");
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      setLive(true);
      delay = 500;
      await readEvents(response.body, handleEvent);
    } catch (error) {
      if (controller.signal.aborted) return;
    }
    setLive(false);
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

// Server-sent events from a byte stream: blocks separated by a blank line, fields
// "event:" and "data:", comment lines starting with ":".
async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(name, JSON.parse(data.join("\n")));
    }
  }
}

function handleEvent(name, data) {
  if (name === "mesh") renderMesh(data);
  else if (name === "inbox") addInbox(data.diffs);
  else if (name === "counters") renderCounters(data);
  else if (name === "hello") $("#node").textContent = `node ${short(data.node_id)}`;
  else if (name === "error") showLogin(data.message);
}

// -- peers and gossip ----------------------------------------------------------------

function renderMesh(mesh) {
  const previous = state.mesh;
  state.mesh = mesh;
  const body = $("#peers tbody");
  body.replaceChildren();
  if (!mesh.enabled) {
    $("#team").textContent = "(this node is in no team: hyphae team create | join)";
    $("#no-peers").hidden = false;
    return;
  }
  $("#team").textContent = `team ${mesh.team_id}, mesh ${mesh.address}`;
  for (const peer of mesh.peers) {
    body.append(el("tr", { "data-node-id": peer.node_id, "data-state": peer.state },
      el("td", {}, el("span", { class: `state ${peer.state}`, text: peer.state })),
      el("td", { class: "mono", title: peer.node_id, text: short(peer.node_id) }),
      el("td", { class: "mono", text: peer.address }),
      el("td", { text: ago(peer.heard_at, mesh.now) }),
      el("td", { class: "num", text: peer.data_batches_sent }),
      el("td", { class: "num", text: peer.cells_received }),
      el("td", { class: "num", text: peer.outbox_depth }),
      el("td", { class: "num", text: peer.inflight_batches }),
      el("td", { class: "num", text: peer.frames_sent })));
  }
  $("#no-peers").hidden = mesh.peers.length > 0;

  const sum = (counts) => Object.values(counts || {}).reduce((a, b) => a + b, 0);
  const totals = [
    ["diffs sent", mesh.data_diffs_sent],
    ["diffs received", sum(mesh.diffs_received)],
    ["cells received", mesh.cells_received],
    ["frames sent", sum(mesh.frames_sent)],
    ["frames received", mesh.frames_received],
    ["beacons known", mesh.beacons_known],
    ["dropped", sum(mesh.drops)],
  ];
  $("#flow-totals").replaceChildren(...totals.map(([label, value]) =>
    el("div", { "data-total": label }, el("b", { text: value }), el("span", { text: label }))));

  const drops = Object.entries(mesh.drops).sort();
  $("#drops tbody").replaceChildren(...drops.map(([reason, count]) =>
    el("tr", { "data-reason": reason }, el("td", { text: reason }), el("td", { class: "num", text: count }))));
  $("#no-drops").hidden = drops.length > 0;

  if (previous && previous.enabled) logFlow(previous, mesh);
}

function logFlow(before, after) {
  const old = new Map(before.peers.map((p) => [p.node_id, p]));
  const lines = [];
  for (const peer of after.peers) {
    const was = old.get(peer.node_id);
    if (!was) { lines.push(`${short(peer.node_id)} joined at ${peer.address}`); continue; }
    if (was.state !== peer.state) lines.push(`${short(peer.node_id)} is now ${peer.state}`);
    const sent = peer.data_batches_sent - was.data_batches_sent;
    const received = peer.cells_received - was.cells_received;
    if (sent > 0) lines.push(`→ ${short(peer.node_id)}: ${sent} batch${sent > 1 ? "es" : ""} of diffs`);
    if (received > 0) lines.push(`← ${short(peer.node_id)}: ${received} cell${received > 1 ? "s" : ""}`);
  }
  for (const [reason, count] of Object.entries(after.drops)) {
    const delta = count - (before.drops[reason] || 0);
    if (delta > 0) lines.push(`dropped ${delta} (${reason})`);
  }
  const log = $("#flow-log");
  for (const line of lines) log.prepend(el("li", { text: `${new Date(after.now).toLocaleTimeString()}  ${line}` }));
  while (log.children.length > 100) log.lastChild.remove();
}

// -- the inbox -----------------------------------------------------------------------

function cellItem(cell, extra) {
  return el("li", { "data-node-id": cell.node_id },
    el("div", { class: "item-head" },
      el("span", { class: "type", text: cell.cell_type }),
      el("span", { text: `salience ${cell.salience}` }),
      el("span", { class: "mono", title: cell.origin_node, text: `from node ${short(cell.origin_node)}` }),
      el("span", { class: "mono", title: cell.source_agent, text: `agent ${short(cell.source_agent)}` }),
      ...extra),
    el("div", { class: "item-body", text: cell.forgotten ? "(forgotten)" : cell.content }));
}

function addInbox(diffs) {
  const list = $("#inbox");
  for (const diff of diffs) {
    if (list.querySelector(`li[data-inbox-id="${diff.inbox_id}"]`)) continue;
    const item = cellItem(diff, [
      ...(diff.agent ? [el("span", { class: "agent", text: `for ${diff.agent}` })] : []),
      el("span", { text: `similarity ${diff.similarity.toFixed(2)}` }),
      el("span", { text: `${diff.hops} hop${diff.hops === 1 ? "" : "s"}` }),
      el("span", { text: `arrived ${when(diff.received_at)}` }),
    ]);
    item.dataset.inboxId = diff.inbox_id;
    item.classList.add("fresh");
    list.prepend(item);
    state.inboxCount += 1;
  }
  $("#inbox-empty").hidden = state.inboxCount > 0;
  $("#inbox-count").textContent = state.inboxCount ? `(${state.inboxCount})` : "";
}

// -- browsing ------------------------------------------------------------------------

function renderCounters(values) {
  $("#counters tbody").replaceChildren(...Object.entries(values).sort().map(([name, value]) =>
    el("tr", {}, el("td", { class: "mono", text: name }),
      el("td", { class: "num", text: Number.isInteger(value) ? value : value.toFixed(4) }))));
}

async function browse(action) {
  $("#browse-error").textContent = "";
  try {
    await action();
  } catch (error) {
    $("#browse-error").textContent = error.message;
  }
}

async function loadRecent(more) {
  const query = more && state.recentCursor ? `&cursor=${encodeURIComponent(state.recentCursor)}` : "";
  const result = await api("GET", `/v1/cells?limit=25${query}`);
  const items = result.cells.map((cell) => cellItem({ ...cell, forgotten: Boolean(cell.forgotten_at) }, [
    el("span", { text: cell.layer }),
    el("span", { text: cell.provenance.local ? "stored here" : `${cell.provenance.hops} hop${cell.provenance.hops === 1 ? "" : "s"}` }),
    el("span", { text: when(cell.created_at) }),
  ]));
  if (more) $("#recent").append(...items);
  else $("#recent").replaceChildren(...items);
  if (!more && !items.length) $("#recent").append(el("li", { class: "muted", text: "No cells yet." }));
  state.recentCursor = result.next_cursor;
  $("#recent-more").hidden = !result.next_cursor;
}

function loadTab(name) {
  for (const button of document.querySelectorAll(".tabs button")) button.classList.toggle("active", button.dataset.tab === name);
  for (const tab of document.querySelectorAll(".tab")) tab.hidden = tab.id !== `tab-${name}`;
  if (name === "recent") browse(() => loadRecent(false));
  if (name === "scenes") browse(loadScenes);
  if (name === "beacons") browse(loadBeacons);
}

async function search(event) {
  event.preventDefault();
  await browse(async () => {
    const result = await api("POST", "/v1/search", { query: $("#search-query").value, layer: $("#search-layer").value, k: 20 });
    $("#search-results").replaceChildren(...result.results.map((cell) =>
      cellItem(cell, [el("span", { text: `distance ${cell.distance.toFixed(3)}` }), el("span", { text: cell.layer })])));
    if (!result.results.length) $("#search-results").append(el("li", { class: "muted", text: "Nothing close." }));
  });
}

async function loadScenes() {
  const result = await api("GET", "/v1/scenes?limit=100");
  $("#scenes").replaceChildren(...result.scenes.map((scene) =>
    el("li", { "data-scene-id": scene.scene_id },
      el("a", { class: "scene", text: scene.title || scene.scene_id, onclick: () => browse(() => showScene(scene.scene_id)) }),
      el("div", { class: "item-head" },
        el("span", { text: `project ${scene.project}` }),
        el("span", { text: `started ${when(scene.created_at)}` }),
        el("span", { text: scene.ended_at ? `ended ${when(scene.ended_at)}` : "open" }),
        el("span", { text: scene.consolidated_at ? "consolidated" : "" })))));
  if (!result.scenes.length) $("#scenes").append(el("li", { class: "muted", text: "No scenes yet." }));
}

async function showScene(sceneId) {
  const scene = await api("GET", `/v1/scenes/${encodeURIComponent(sceneId)}`);
  const ids = scene.cell_ids || [];
  const cells = await Promise.all(ids.slice(0, 50).map((id) => api("GET", `/v1/cells/${encodeURIComponent(id)}`).catch(() => null)));
  $("#scene-detail").replaceChildren(
    el("h3", { text: `${scene.title || scene.scene_id}: ${ids.length} cell${ids.length === 1 ? "" : "s"}` }),
    el("ol", { class: "items" }, ...cells.filter(Boolean).map((cell) => cellItem(cell, [el("span", { text: cell.layer })]))));
}

async function loadBeacons() {
  const result = await api("GET", "/v1/beacons");
  $("#beacons").replaceChildren(...result.beacons.map((beacon) =>
    el("li", { "data-beacon-id": beacon.beacon_id },
      el("div", { class: "item-body", text: beacon.query }),
      el("div", { class: "item-head" },
        el("span", { text: `threshold ${beacon.threshold}` }),
        el("span", { text: beacon.cell_types ? beacon.cell_types.join(", ") : "any type" }),
        el("span", { text: beacon.expires_at ? `until ${new Date(beacon.expires_at).toLocaleString()}` : "no expiry" })))));
  if (!result.beacons.length) $("#beacons").append(el("li", { class: "muted", text: "No beacons: place one with place_beacon." }));
}

// -- start ---------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("#login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("#key").value.trim(), $("#admin-token").value.trim());
  });
  $("#sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_ITEM);
    sessionStorage.removeItem(ADMIN_ITEM);
    state.key = state.admin = null;
    showLogin();
  });
  $("#recent-more").addEventListener("click", () => browse(() => loadRecent(true)));
  $("#search-form").addEventListener("submit", search);
  for (const button of document.querySelectorAll(".tabs button")) button.addEventListener("click", () => loadTab(button.dataset.tab));
  if (state.key) signIn(state.key, state.admin); else showLogin();
});
