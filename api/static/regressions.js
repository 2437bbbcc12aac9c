// Regressions page: the list (filters), and for one regression its message, the environment diff (the
// changed keys first: the likely cause), the metric's nightly history with the baseline band, and events.
"use strict";

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const num = (v, d = 4) => (v === null || v === undefined ? "—" : Number(v).toPrecision(d));
const pct = (v) => (v === null || v === undefined ? "—" : `${v > 0 ? "+" : ""}${v.toFixed(1)}`);
const pointLabel = (p) => `${p.model ?? ""}${p.num_layers ? "/L" + p.num_layers : ""} ${p.precision ?? ""} ${p.layout ?? ""} N=${p.num_devices ?? "?"} @${p.cluster ?? ""}`;
let chart = null;

async function api(path, method = "GET") {
  const headers = { Accept: "application/json" };
  const token = $("token").value.trim();
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(path, { method, headers, cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.detail || `${r.status} ${r.statusText}`);
  return body;
}

function query() {
  const q = new URLSearchParams({ limit: "200" });
  for (const [id, key] of [["f-status", "status"], ["f-metric", "metric"], ["f-suite", "suite"]]) {
    if ($(id).value) q.set(key, $(id).value);
  }
  if ($("f-open").checked) q.set("open", "true");
  return q;
}

async function loadList() {
  try {
    const page = await api(`/regressions?${query()}`);
    $("live").classList.remove("stale");
    const sel = Number(location.hash.slice(1));
    const rows = page.items.map((r) => `<tr class="pick${r.id === sel ? " sel" : ""}" data-id="${r.id}">
      <td class="num">${r.id}</td><td><span class="badge s-${esc(r.status)}">${esc(r.status)}</span>${r.acknowledged_at && r.is_open ? " ✓ack" : ""}${r.resolution === "manual" ? " (resolved)" : ""}</td>
      <td>${r.suite_id}</td><td>${esc(r.metric)}</td><td>${esc(pointLabel(r.point))}</td>
      <td class="num">${num(r.value)}</td><td class="num">${num(r.baseline)}</td><td class="num">${pct(r.delta_pct)}</td>
      <td>${esc(r.likely_cause.join(", ") || "—")}</td><td>${esc((r.updated_at || "").slice(0, 16).replace("T", " "))}</td></tr>`);
    $("list").tBodies[0].innerHTML = rows.join("") || `<tr><td colspan="10" class="empty">no regressions match</td></tr>`;
  } catch (e) {
    $("live").classList.add("stale");
    $("list").tBodies[0].innerHTML = `<tr><td colspan="10" class="err">${esc(e.message)}</td></tr>`;
  }
}

function envTable(diff) {
  if (!diff) return `<p class="muted">no environment diff (improvements and recoveries carry none)</p>`;
  const rows = diff.changes.map((c) => `<tr class="${c.changed ? "changed" : ""}"><td>${esc(c.key)}</td>
    <td>${esc(JSON.stringify(c.before))}</td><td>${esc(JSON.stringify(c.after))}</td></tr>`).join("");
  return `<table><thead><tr><th>key</th><th>last good (run ${esc(diff.good_run_id ?? "—")})</th>
    <th>first bad (run ${esc(diff.bad_run_id ?? "—")})</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function drawHistory(canvasParent, hist) {
  if (chart) { chart.destroy(); chart = null; }
  const nights = hist.nights;
  if (!nights.length) { canvasParent.innerHTML = `<p class="empty">no nights recorded</p>`; return; }
  canvasParent.innerHTML = "<canvas></canvas>";
  const labels = nights.map((n) => n.timestamp.slice(0, 10));
  const ds = [
    { label: "band low", data: nights.map((n) => n.band_low), borderWidth: 0, pointRadius: 0, fill: false },
    { label: "baseline band", data: nights.map((n) => n.band_high), borderWidth: 0, pointRadius: 0,
      backgroundColor: "rgba(26,127,55,0.15)", fill: "-1" },
    { label: "baseline", data: nights.map((n) => n.baseline), borderColor: "#1a7f37", borderDash: [6, 4], pointRadius: 0, borderWidth: 1.5 },
    { label: hist.metric, data: nights.map((n) => n.value), borderColor: "#1f77b4", borderWidth: 2,
      pointBackgroundColor: nights.map((n) => (n.flagged ? "#d62728" : "#1f77b4")), pointRadius: nights.map((n) => (n.flagged ? 5 : 3)) },
  ];
  if (nights.some((n) => n.limit !== null)) {
    ds.push({ label: "limit", data: nights.map((n) => n.limit), borderColor: "#d62728", borderDash: [2, 3], pointRadius: 0 });
  }
  chart = new Chart(canvasParent.querySelector("canvas"), { type: "line", data: { labels, datasets: ds },
    options: { animation: false, maintainAspectRatio: false, spanGaps: true,
      plugins: { legend: { labels: { filter: (item) => item.text !== "band low" } } },
      scales: { y: { title: { display: true, text: `${hist.metric} (${hist.higher_is_better ? "higher" : "lower"} is better)` } } } } });
}

async function loadDetail() {
  const id = Number(location.hash.slice(1));
  if (!id) { $("detail").innerHTML = `<p class="note">select a regression to see its history, band and environment diff</p>`; return; }
  try {
    const [r, hist] = await Promise.all([api(`/regressions/${id}`), api(`/regressions/${id}/history`)]);
    const cause = r.likely_cause.length ? `likely cause: <b>${esc(r.likely_cause.join(", "))}</b>` : "no environment change between the last good and the first bad run";
    const events = r.events.map((e) => `<li>${esc(e.at.slice(0, 16).replace("T", " "))} <span class="badge s-${esc(e.state)}">${esc(e.state)}</span>
      experiment <a href="/#/experiments/${e.experiment_id}">${e.experiment_id}</a>, run ${e.run_id ?? "—"}, value ${num(e.value)}</li>`).join("");
    $("detail").innerHTML = `<h2>#${r.id} · ${esc(r.metric)} · ${esc(pointLabel(r.point))} <span class="badge s-${esc(r.status)}">${esc(r.status)}</span></h2>
      <div class="cause">${cause}</div><p class="msg">${esc(r.message)}</p>
      <div class="controls"><button id="ack" ${r.acknowledged_at ? "disabled" : ""}>acknowledge</button>
        <button id="resolve" ${r.resolved_at ? "disabled" : ""}>resolve (accept new level)</button><span id="act-msg" class="note"></span></div>
      <div class="panel"><div class="card"><h3>History</h3><div class="sub">green band: baseline ± max(threshold, 3σ) from the preceding nights; red: flagged nights</div>
        <div class="chart" id="hist"></div></div>
        <div class="card"><h3>Environment: last good vs first bad</h3>${envTable(r.env_diff)}<h3>Events</h3><ul>${events}</ul></div></div>`;
    drawHistory($("hist"), hist);
    $("ack").onclick = () => act(id, "acknowledge");
    $("resolve").onclick = () => act(id, "resolve");
  } catch (e) {
    $("detail").innerHTML = `<p class="err">${esc(e.message)}</p>`;
  }
}

async function act(id, action) {
  try { await api(`/regressions/${id}/${action}`, "POST"); await refresh(); }
  catch (e) { $("act-msg").textContent = `${action} failed: ${e.message}`; }
}

async function refresh() { await Promise.all([loadList(), loadDetail()]); }

$("token").value = localStorage.getItem("scalebench.token") || "";
$("token").addEventListener("change", () => localStorage.setItem("scalebench.token", $("token").value.trim()));
for (const id of ["f-status", "f-metric", "f-suite", "f-open"]) $(id).addEventListener("change", loadList);
$("list").addEventListener("click", (ev) => { const tr = ev.target.closest("tr[data-id]"); if (tr) location.hash = tr.dataset.id; });
window.addEventListener("hashchange", refresh);
refresh();
setInterval(loadList, 30000);
