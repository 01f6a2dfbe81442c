// The dashboard page: follows /ui/api/events (server-sent events) and renders each
// snapshot; after repeated stream errors it polls /ui/api/snapshot every 2 s instead.
// body[data-live] says which: "connecting", "sse" or "poll". Everything user-supplied
// (device names, tags, profile strings) is inserted as text, never as markup.

import { drawChart } from "./charts.js";
import { drawGraph, legendText } from "./graph.js";
import { openSession, takeHashToken } from "./login.js";
import { el, formatAgo, formatBytes, formatNumber } from "./util.js";

const POLL_MS = 2000;
const MAX_STREAM_ERRORS = 3;

const state = {
  snapshot: null,
  job: new URLSearchParams(location.search).get("job"), // null: the coordinator's pick
  colorBy: "status",
  clockOffset: 0, // local clock minus coordinator clock, seconds
  source: null,
  pollTimer: null,
  errors: 0,
};

const $ = (id) => document.getElementById(id);

function setLive(mode) {
  document.body.dataset.live = mode;
  $("live-state").textContent = { sse: "live", poll: "polling every 2 s", connecting: "connecting…" }[mode];
}

function query() {
  return state.job ? `?job=${encodeURIComponent(state.job)}` : "";
}

function toLogin() {
  location.replace("/ui");
}

// -- live updates ---------------------------------------------------------------------

function connect() {
  state.source?.close();
  if (state.pollTimer !== null || !("EventSource" in window)) {
    startPolling();
    return;
  }
  setLive("connecting");
  const source = new EventSource(`/ui/api/events${query()}`);
  state.source = source;
  source.onopen = () => {
    state.errors = 0;
    setLive("sse");
  };
  source.addEventListener("snapshot", (event) => render(JSON.parse(event.data)));
  source.onerror = () => {
    state.errors += 1;
    if (source.readyState === EventSource.CLOSED || state.errors >= MAX_STREAM_ERRORS) {
      source.close();
      state.source = null;
      startPolling();
    } else {
      setLive("connecting");
    }
  };
}

async function poll() {
  try {
    const response = await fetch(`/ui/api/snapshot${query()}`, { credentials: "same-origin" });
    if (response.status === 401) return toLogin();
    if (response.status === 404 && state.job) return jobNotFound();
    if (response.ok) render(await response.json());
  } catch {
    // the coordinator is unreachable: keep the last snapshot, try again next tick
  }
}

// A ?job= that names no job (a typo, a deleted store): say so, show the current job live.
function jobNotFound() {
  const notice = $("notice");
  notice.textContent = `job ${state.job} not found; showing the current job instead`;
  notice.hidden = false;
  clearInterval(state.pollTimer);
  state.pollTimer = null;
  state.errors = 0;
  chooseJob(null);
}

function startPolling() {
  setLive("poll");
  if (state.pollTimer === null) state.pollTimer = setInterval(poll, POLL_MS);
  poll();
}

// -- rendering ------------------------------------------------------------------------

function render(snapshot) {
  state.snapshot = snapshot;
  state.clockOffset = Date.now() / 1000 - snapshot.generated_at;
  $("fleet-name").textContent = snapshot.fleet;
  renderJobs(snapshot);
  renderGraph();
  renderCharts(snapshot.job);
  renderFleet(snapshot);
  renderLedger(snapshot.job);
}

function renderJobs(snapshot) {
  const select = $("job-select");
  const job = snapshot.job;
  const options = snapshot.jobs.map((j) =>
    el("option", { value: j.job_id }, `${j.name || j.job_id} (${j.job_id}, ${j.status})`));
  if (job && !snapshot.jobs.some((j) => j.job_id === job.job_id)) {
    options.unshift(el("option", { value: job.job_id }, `${job.name || job.job_id} (${job.job_id})`));
  }
  if (options.length === 0) options.push(el("option", { value: "" }, "no jobs yet"));
  select.replaceChildren(...options);
  select.value = job ? job.job_id : "";
  $("job-status").textContent = job ? job.status : "no job";
  $("job-status").dataset.status = job ? job.status : "";
  $("job-progress").textContent = job ? `round ${job.rounds_done} of ${job.rounds}` : "";
  $("job-facts").textContent = job ? jobFacts(job) : "";
}

// "choco · codec sign · DP per record (σ 1.1, C 1) · secure aggregation t = 4"
function jobFacts(job) {
  const facts = [job.algorithm, `codec ${job.codec}`];
  const privacy = job.privacy || {};
  if (privacy.dp_unit) {
    facts.push(`DP per ${privacy.dp_unit} (σ ${privacy.noise_multiplier}, C ${privacy.clipping_norm})`);
  }
  if (privacy.secure_aggregation) facts.push(`secure aggregation t = ${privacy.secure_aggregation}`);
  return facts.join(" · ");
}

function renderGraph() {
  const snapshot = state.snapshot;
  if (!snapshot) return;
  const topology = snapshot.job ? snapshot.job.topology : null;
  const byId = new Map(snapshot.devices.map((d) => [d.device_id, d]));
  const accuracy = snapshot.job ? snapshot.job.accuracy_by_device : {};
  drawGraph($("graph"), topology, byId, accuracy, state.colorBy);
  $("spectral-gap").textContent = topology ? formatNumber(topology.spectral_gap, 3) : "–";
  $("topology-version").textContent = topology ? String(topology.version) : "–";
  $("topology-kind").textContent = topology ? topology.kind : "–";
  $("graph-legend").textContent = legendText(state.colorBy);
}

function renderCharts(job) {
  const curves = job ? job.curves : [];
  const series = (name, key) => ({ name, points: curves.map((c) => [c.round, c[key]]) });
  drawChart($("chart-accuracy"), {
    series: [series("mean", "mean_accuracy"), series("min", "min_accuracy")],
    xLabel: "round", yLabel: "accuracy", yDomain: [0, 1],
  });
  drawChart($("chart-consensus"), {
    series: [series("consensus distance", "consensus_distance")],
    xLabel: "round", yLabel: "mean ‖x_i − x̄‖²", log: true,
    empty: "no consensus distance yet (needs sketch_dim > 0 and two reports)",
  });
  drawChart($("chart-bytes"), {
    series: [series("sent", "bytes_sent"), series("received", "bytes_received")],
    xLabel: "round", yLabel: "bytes", format: formatBytes, fromZero: true, binary: true,
  });
}

function profileSummary(profile) {
  const parts = [];
  if (profile.cores !== undefined) parts.push(`${profile.cores} cores`);
  if (profile.memory_bytes !== undefined) parts.push(formatBytes(profile.memory_bytes));
  if (profile.accelerator) parts.push(String(profile.accelerator));
  return parts.length ? parts.join(" · ") : "–";
}

function agoText(lastSeen) {
  return formatAgo(Date.now() / 1000 - state.clockOffset - lastSeen);
}

function fleetRow(device) {
  const status = device.online ? "online" : "offline";
  const tags = el("td", { class: "tags" }, ...device.tags.map((t) => el("span", { class: "tag" }, t)));
  return el("tr", { "data-device": device.device_id, "data-online": String(device.online) },
    el("td", { title: device.device_id }, device.name),
    el("td", { class: `status ${status}`, title: `from ${device.online_source}` }, status),
    el("td", {}, device.state),
    tags,
    el("td", {}, profileSummary(device.profile || {})),
    el("td", { class: "ago", "data-last-seen": device.last_seen }, agoText(device.last_seen)),
    el("td", { class: "num" }, device.round === null ? "–" : String(device.round)),
    el("td", { class: "num" }, formatBytes(device.bytes_sent)),
    el("td", { class: "num" }, formatNumber(device.epsilon_spent, 3)),
  );
}

// Rows in a stable order: by name ("pi-2" before "pi-10"), then by device id.
const byName = new Intl.Collator(undefined, { numeric: true });

function fleetOrder(a, b) {
  return byName.compare(a.name, b.name) || byName.compare(a.device_id, b.device_id);
}

function renderFleet(snapshot) {
  const devices = [...snapshot.devices].sort(fleetOrder);
  $("fleet").tBodies[0].replaceChildren(...devices.map(fleetRow));
  const online = snapshot.devices.filter((d) => d.online).length;
  const shown = snapshot.devices.length;
  const more = snapshot.devices_total > shown ? ` (first ${shown} of ${snapshot.devices_total})` : "";
  $("fleet-count").textContent = `${online} online / ${snapshot.devices_total}${more}`;
}

function refreshAges() {
  for (const cell of document.querySelectorAll("#fleet td.ago")) {
    cell.textContent = agoText(Number(cell.dataset.lastSeen));
  }
}

// The per-round totals of GET /api/v1/jobs/{id}/ledger (docs/reliability.md).
const LEDGER_COLUMNS = [
  ["round", "round"],
  ["sent", "sent"],
  ["delivered", "delivered"],
  ["applied", "applied"],
  ["duplicates", "duplicates"],
  ["rejected", "rejected"],
  ["retransmitted", "re-sent"],
  ["delivered_late", "late"],
  ["recovered_by_keyframe", "recovered"],
  ["lost", "lost"],
];

function renderLedger(job) {
  const body = $("ledger-body");
  if (!job || !Array.isArray(job.ledger) || job.ledger.length === 0) {
    body.classList.add("muted");
    body.textContent = "delivery ledger: not available yet";
    return;
  }
  body.classList.remove("muted");
  const head = el("tr", {}, ...LEDGER_COLUMNS.map(([, label]) => el("th", { scope: "col", class: "num" }, label)));
  const rows = job.ledger.map((r) =>
    el("tr", {}, ...LEDGER_COLUMNS.map(([key]) => el("td", { class: "num" }, String(Number(r[key]) || 0)))),
  );
  body.replaceChildren(el("table", { id: "ledger-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
}

// -- controls -------------------------------------------------------------------------

function chooseJob(jobId) {
  state.job = jobId || null;
  const url = new URL(location.href);
  if (state.job) url.searchParams.set("job", state.job);
  else url.searchParams.delete("job");
  history.replaceState(null, "", url);
  if (state.pollTimer !== null) poll();
  else connect();
}

async function logOut() {
  await fetch("/ui/logout", { method: "POST", credentials: "same-origin" });
  toLogin();
}

async function logInWithHashToken() {
  const token = takeHashToken(); // /ui#token=...: (re)log in with it first
  if (!token) return false;
  await openSession(token);
  toLogin();
  return true;
}

async function main() {
  // A #token= link pasted into this tab changes only the fragment: no reload, so listen.
  window.addEventListener("hashchange", logInWithHashToken);
  if (await logInWithHashToken()) return;
  $("job-select").addEventListener("change", (event) => chooseJob(event.target.value));
  $("color-by").addEventListener("change", (event) => {
    state.colorBy = event.target.value;
    renderGraph();
  });
  $("logout").addEventListener("click", logOut);
  setInterval(refreshAges, 5000);
  connect();
}

main();
