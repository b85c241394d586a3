// The onceflow console: reads the worker's JSON views and renders them as DOM nodes.
// Text from documents is only ever set with textContent, never parsed as HTML.
"use strict";

const TOKEN_KEY = "onceflow-admin-token";
const $ = (selector) => document.querySelector(selector);

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell ?? "";
    tr.appendChild(td);
  }
  return tr;
}

// Record times in UTC, and said to be: the page may be read in any time zone.
function when(ts) {
  if (ts === null || ts === undefined) return "";
  const date = new Date(ts * 1000);
  return isNaN(date.getTime()) ? String(ts) : date.toISOString().replace("T", " ").replace("Z", " UTC");
}

// Seconds as a trigger file writes them (1d, 10m, 45s), to the two largest units.
function duration(seconds) {
  let left = Math.max(0, Math.round(seconds));
  const parts = [];
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
    if (left >= size) { parts.push(`${Math.floor(left / size)}${unit}`); left %= size; }
  }
  return parts.length ? parts.slice(0, 2).join(" ") : "0s";
}

function expires(deadline) {
  if (deadline === null || deadline === undefined) return "never";
  const left = deadline - Date.now() / 1000;
  return isFinite(left) ? `${when(deadline)} (in ${duration(left)})` : String(deadline);
}

function say(message, failed) {
  const status = $("#status");
  status.textContent = message;
  status.className = failed ? "error" : "";
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

function showTokenState() {
  $("#token-state").textContent = token() ? "token set for this tab" : "no token";
}

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const why = body && (body.error || body.reason) ? (body.error || body.reason) : response.statusText;
    throw new Error(`${path}: ${response.status} ${why}`);
  }
  return body;
}

async function post(path, body) {
  if (!token()) { say("Enter the admin token first.", true); return null; }
  const response = await fetch(path, {
    method: "POST",
    headers: { Authorization: "Bearer " + token(), Accept: "application/json",
               "Content-Type": "application/json" },
    body: body === undefined ? "" : JSON.stringify(body),
  });
  let answer = null;
  try { answer = await response.json(); } catch (e) { answer = null; }
  if (!response.ok) {
    const why = answer && (answer.error || answer.reason) ? (answer.error || answer.reason) : response.statusText;
    say(`${path}: ${response.status} ${why}`, true);
    return null;
  }
  return answer;
}

let knownTriggers = [];

function fillSelect(select, names) {
  if (select.options.length === names.length) return;
  const chosen = select.value;
  select.replaceChildren(...names.map((name) => { const o = el("option", name); o.value = name; return o; }));
  if (names.includes(chosen)) select.value = chosen;
}

function renderTriggers(triggers) {
  const body = $("#triggers tbody");
  const rows = [];
  for (const name of Object.keys(triggers).sort()) {
    const t = triggers[name];
    const d = t.definition;
    const counts = el("span", null, "counts");
    const outcomes = Object.keys(t.counts).sort();
    if (!outcomes.length) counts.appendChild(el("span", "none yet", "muted"));
    for (const outcome of outcomes) counts.appendChild(el("span", `${outcome} ${t.counts[outcome]}`));
    const state = t.suspended
      ? el("span", "suspended" + (t.reason ? ` (${t.reason})` : ""), "suspended")
      : el("span", "running", "running");
    const button = el("button", t.suspended ? "Resume" : "Suspend", t.suspended ? "resume" : "suspend");
    button.type = "button";
    button.addEventListener("click", () => command(name, t.suspended ? "resume" : "suspend"));
    const tr = row([name, d.types.length > 1 ? d.condition : "simple", d.types.join(", "),
                    d.types.length > 1 ? d.join_timeout : "", d.history_ttl, counts,
                    t.open_joins, t.held, state, button]);
    tr.dataset.trigger = name;
    tr.cells[8].className = "state";
    rows.push(tr);
  }
  body.replaceChildren(...rows);
  knownTriggers = Object.keys(triggers).sort();
  fillSelect($("#history-trigger"), knownTriggers);
  fillSelect($("#docs-trigger"), knownTriggers);
}

function renderJoins(joins, triggers) {
  const rows = joins.map((j) => {
    const waiting = j.waiting.length
      ? j.waiting.map((m) => `${m.type}: ${m.identity}`).join("; ")
      : (j.window_of ? `window after ${j.window_of}` : "");
    const tr = row([j.trigger, j.activation, waiting, expires(j.deadline),
                    j.partition]);
    tr.dataset.activation = j.activation;
    return tr;
  });
  if (!rows.length) rows.push(row([el("span", "no open joins", "muted")]));
  $("#joins tbody").replaceChildren(...rows);
}

// A <details> element keeps its open state across the redraws every few seconds.
const openDetails = new Set();

function details(summary, content) {
  const box = el("details");
  box.appendChild(el("summary", summary));
  box.appendChild(content);
  return box;
}

function opened(id, box) {
  box.dataset.id = id;
  box.open = openDetails.has(id);
  box.addEventListener("toggle", () => {
    if (box.open) openDetails.add(id); else openDetails.delete(id);
  });
  return box;
}

function renderLag(lag) {
  $("#lag-group").textContent = `Consumer group ${lag.group}: records published and not yet ` +
    "committed, summed over the partitions of each topic.";
  const rows = lag.topics.map((t) => {
    const table = el("table");
    table.appendChild(row(["partition", "committed", "end", "lag", "worker"]));
    for (const p of t.partitions) table.appendChild(row([p.partition, p.committed, p.end, p.lag, p.worker]));
    const readBy = t.route ? "every trigger (routed documents, ticks, controls)" : t.triggers.join(", ");
    const name = t.topic === t.name ? t.topic : `${t.topic} (${t.name})`;
    const known = t.lag === null ? "not known yet" :
      `${t.lag}` + (t.unknown ? ` (${t.unknown} partition(s) not known yet)` : "");
    const tr = row([name, readBy, known,
                    opened(`lag ${t.name}`, details(`${t.partitions.length} partition(s)`, table))]);
    tr.dataset.topic = t.topic;
    tr.cells[2].className = "lag";
    return tr;
  });
  $("#lag tbody").replaceChildren(...rows);
}

function renderWorkers(data) {
  const box = $("#workers");
  const parts = [];
  for (const w of data.workers) {
    const block = el("div");
    block.className = "worker";
    block.dataset.url = w.url;
    const title = el("h3", `${w.url}${w.url === data.worker ? " (this worker)" : ""}: ` +
                     (w.ready ? "ready" : "not ready"));
    block.appendChild(title);
    if (!w.ready && w.reasons.length) block.appendChild(el("p", w.reasons.join("; "), "muted"));
    const table = el("table");
    const head = row(["topic", "partition", "committed", "end", "lag"]);
    table.appendChild(head);
    for (const p of w.partitions) table.appendChild(row([p.topic, p.partition, p.committed, p.end, p.lag]));
    // Every partition the worker consumes, table changelogs included: on demand only.
    block.appendChild(opened(`worker ${w.url}`, details(
      `${w.partitions.length} partition(s) assigned, table changelogs included`, table)));
    parts.push(block);
  }
  for (const url of data.unreachable || []) parts.push(el("p", `${url} does not answer`, "suspended"));
  box.replaceChildren(...parts);
}

async function refresh() {
  try {
    const data = await getJSON("/overview");
    $("#worker").textContent = `${data.workers.length} worker(s); this page from ${data.worker}`;
    renderTriggers(data.triggers);
    renderJoins(data.joins, data.triggers);
    renderLag(data.lag);
    renderWorkers(data);
  } catch (error) {
    say(String(error.message || error), true);
  }
}

async function refreshJournal() {
  try {
    const data = await getJSON("/journal/tail");
    const rows = data.records.slice(-100).reverse().map((r) => {
      const tr = row([when(r.ts), r.trigger ?? "(ingress)", r.outcome, r.identity, r.activation,
                      r.topic == null ? "" : `${r.topic}/${r.partition}@${r.offset}`, r.reason]);
      tr.dataset.identity = r.identity ?? "";
      tr.dataset.outcome = r.outcome;
      tr.cells[6].className = "reason";
      return tr;
    });
    $("#journal tbody").replaceChildren(...rows);
  } catch (error) {
    say(String(error.message || error), true);
  }
}

async function command(name, action) {
  const answer = await post(`/triggers/${encodeURIComponent(name)}/${action}`);
  if (answer) {
    say(`${action === "suspend" ? "Suspended" : "Resumed"} ${name} on ${answer.partitions} partition(s) as ${answer.by}.`);
    setTimeout(refresh, 500);
  }
}

async function lookUp(event) {
  event.preventDefault();
  const trigger = $("#history-trigger").value;
  const identity = $("#history-identity").value;
  const activation = $("#history-activation").value;
  let path = `/history/${encodeURIComponent(trigger)}/${encodeURIComponent(identity)}`;
  if (activation) path += `?activation=${encodeURIComponent(activation)}`;
  const out = $("#history-result");
  try {
    const data = await getJSON(path);
    out.textContent = data.entry && data.entry.unreadable
      ? `${identity}: ${data.entry.unreadable} (partition ${data.partition})`
      : data.entry
      ? `${identity}: ${data.entry.completed ? (data.entry.failed ? "completed (failed)" : "completed") : "processing"}` +
        ` since ${when(data.entry.started)}; kept for ${data.history_ttl_text || data.history_ttl + " s"}` +
        ` (partition ${data.partition})`
      : `${identity}: no history entry (partition ${data.partition})`;
  } catch (error) {
    out.textContent = String(error.message || error);
  }
}

let shownDocuments = [];

async function loadDocuments(event) {
  if (event) event.preventDefault();
  const trigger = $("#docs-trigger").value;
  const outcome = $("#docs-outcome").value;
  try {
    const data = await getJSON(`/documents/${encodeURIComponent(trigger)}?outcome=${encodeURIComponent(outcome)}`);
    shownDocuments = data.documents;
    const rows = data.documents.map((d) => {
      const button = el("button", "Resubmit", "resubmit");
      button.type = "button";
      button.addEventListener("click", () => askResubmit([d.identity]));
      const failure = d.value && typeof d.value === "object" && d.value.error;
      const reason = d.reason || (failure ? `${failure.type}: ${failure.message}` : "");
      const tr = row([d.identity, d.activation, when(d.ts), reason,
                      JSON.stringify(d.value), button]);
      tr.dataset.identity = d.identity ?? "";
      tr.cells[3].className = "reason";
      tr.cells[4].className = "doc";
      return tr;
    });
    if (!rows.length) rows.push(row([el("span", `no ${outcome} documents on ${data.topic}`, "muted")]));
    $("#docs tbody").replaceChildren(...rows);
  } catch (error) {
    say(String(error.message || error), true);
  }
}

// The dead-letter topic: shown when asked for (each read costs the broker a fetch).
async function loadDeadLetters(event) {
  if (event) event.preventDefault();
  try {
    const data = await getJSON(`/dead-letters?limit=${encodeURIComponent($("#dead-limit").value)}`);
    $("#dead-topic").textContent = `newest ${data.records.length} on ${data.topic}, newest first`;
    const rows = data.records.slice().reverse().map((d) => {
      const o = d.original;
      const where = o ? `${o.topic}/${o.partition}@${o.offset}` : "(not a copy onceflow wrote)";
      const size = `${d.value_bytes} bytes`;
      const preview = d.preview === null ? el("span", "null", "muted") : el("span", d.preview);
      const value = el("span");
      value.append(preview, el("span", ` (${size})`, "muted"));
      const tr = row([when(d.ts), d.reason ?? "", `${where} (dead-letter ${d.partition}@${d.offset})`,
                      d.key ?? "", value]);
      tr.dataset.offset = `${d.partition}@${d.offset}`;
      tr.cells[1].className = "reason";
      tr.cells[4].className = "doc";
      return tr;
    });
    if (!rows.length) rows.push(row([el("span", `no records on ${data.topic}`, "muted")]));
    $("#dead tbody").replaceChildren(...rows);
  } catch (error) {
    say(String(error.message || error), true);
  }
}

// A resubmit runs services again: the page asks first, for exactly what was clicked.
let pendingResubmit = null;

function showResult(message, failed) {
  const out = $("#docs-result");
  out.textContent = message;
  out.className = failed ? "error" : "";
}

function askResubmit(identities) {
  const chosen = identities.filter((i) => i);
  const trigger = $("#docs-trigger").value;
  const outcome = $("#docs-outcome").value;
  if (!chosen.length) { showResult("No documents shown to resubmit.", true); return; }
  pendingResubmit = { trigger, outcome, identities: chosen };
  const shown = chosen.length > 5 ? `${chosen.slice(0, 5).join(", ")} and ${chosen.length - 5} more` : chosen.join(", ");
  $("#docs-confirm-text").textContent =
    `Resubmit ${chosen.length} ${outcome} document(s) of ${trigger} (${shown})? ` +
    "They are decided again, and their service may run again.";
  $("#docs-confirm").hidden = false;
  $("#docs-confirm-yes").focus();
}

function cancelResubmit() {
  pendingResubmit = null;
  $("#docs-confirm").hidden = true;
  showResult("Resubmit cancelled: nothing was sent.");
}

async function resubmit() {
  const pending = pendingResubmit;
  pendingResubmit = null;
  $("#docs-confirm").hidden = true;
  if (!pending) return;
  const { trigger, outcome, identities } = pending;
  showResult(`Resubmitting ${identities.length} ${outcome} document(s) of ${trigger}...`);
  const answer = await post(`/triggers/${encodeURIComponent(trigger)}/resubmit`,
                            { outcome, identities });
  if (!answer) {
    showResult(`Resubmit of ${trigger} failed: ${$("#status").textContent || "no answer"}`, true);
    return;
  }
  const message = `Resubmitted ${answer.resubmitted.length} ${outcome} document(s) of ${trigger} as ${answer.by}` +
    (answer.resubmitted.length ? `: ${answer.resubmitted.join(", ")}` : "") +
    (answer.skipped.length ? `; skipped: ${answer.skipped.join("; ")}` : ".");
  say(message);
  showResult(message, answer.skipped.length > 0);
  // Each resubmitted document is told as "IDENTITY (topic/partition@offset)".
  for (const tr of document.querySelectorAll("#docs tbody tr")) {
    const identity = tr.dataset.identity;
    if (identity && answer.resubmitted.some((where) => where.startsWith(`${identity} (`))) {
      const cell = tr.cells[tr.cells.length - 1];
      cell.replaceChildren(el("span", "resubmitted", "running"));
    }
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("#token").value);
    $("#token").value = "";
    showTokenState();
  });
  $("#token-forget").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); showTokenState(); });
  $("#history-form").addEventListener("submit", lookUp);
  $("#docs-form").addEventListener("submit", loadDocuments);
  $("#dead-form").addEventListener("submit", loadDeadLetters);
  $("#docs-resubmit-all").addEventListener("click", () => askResubmit(shownDocuments.map((d) => d.identity)));
  $("#docs-confirm-yes").addEventListener("click", resubmit);
  $("#docs-confirm-no").addEventListener("click", cancelResubmit);
  showTokenState();
  refresh();
  refreshJournal();
  loadDeadLetters();
  setInterval(refresh, 3000);
  setInterval(refreshJournal, 2000);
});
