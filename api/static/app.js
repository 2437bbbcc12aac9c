// scalebench dashboard: hash routes, ETag polling (a 304 changes nothing), plain DOM + Chart.js.
//   #/                      experiments (status, progress)
//   #/experiments/ID        runs (live status) and the scaling, MFU, memory and loss charts
//   #/compare?ids=A,B       several experiments side by side, X ratios to the first
"use strict";

const PAGE_PARAMS = new URLSearchParams(location.search);
const POLL_MS = Number(PAGE_PARAMS.get("poll_ms")) || 3000;
const LIST_PAGE_SIZE = Math.min(200, Number(PAGE_PARAMS.get("page_size")) || 200);  // GET /experiments allows 1..200
const app = document.getElementById("app");
const stats = window.SB_STATS = { requests: 0, notModified: 0, renders: 0 };
const etags = new Map(), bodies = new Map();
let generation = 0;

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// An error answer of the API (application/problem+json: detail, errors[{field, message}]), with its status.
class ApiProblem extends Error {
  constructor(status, body, url) {
    super((body && body.detail) || `${status} on ${url}`);
    this.status = status; this.problem = body || {}; this.url = url;
  }
}

// A 4xx other than 429 (an unknown id, a refused query) answers the same however often it is asked.
function permanentProblem(err) { return err instanceof ApiProblem && err.status >= 400 && err.status < 500 && err.status !== 429; }

// GET with If-None-Match; {changed, data}. A 304 returns the body kept from the last 200; an error, ApiProblem.
async function poll(url) {
  const headers = { Accept: "application/json" };
  if (etags.has(url)) headers["If-None-Match"] = etags.get(url);
  stats.requests++;
  const r = await fetch(url, { headers, cache: "no-store" });
  if (r.status === 304) { stats.notModified++; return { changed: false, data: bodies.get(url) }; }
  const data = await r.json().catch(() => null);
  if (!r.ok || data === null) throw new ApiProblem(r.status, data, url);
  if (r.headers.get("ETag")) etags.set(url, r.headers.get("ETag"));
  bodies.set(url, data);
  return { changed: true, data };
}

// The problem in the page: its status, detail and field errors (where(err) gives the element to fill).
function showProblem(el, err) {
  const p = err.problem || {};
  const fields = (p.errors || []).filter((e) => e.message && !String(p.detail || "").includes(e.message));
  el.innerHTML = `<div class="empty problem" id="problem" data-status="${err.status}"><b>${err.status}${p.title ? ` ${esc(p.title)}` : ""}</b>:
    ${esc(err.message)}${fields.map((e) => `<div>${esc(e.field)}: ${esc(e.message)}</div>`).join("")}
    <div class="note">The page stopped asking: the answer would not change. Reload to ask again.</div></div>`;
}

// Poll tick every POLL_MS until the route changes. A permanent problem (permanentProblem) stops the polling and
// is shown where(err) says (default: the whole page); other errors (network, 5xx, 429) are retried.
function loop(tick, where) {
  const gen = ++generation;
  const live = document.getElementById("live");
  const run = async () => {
    if (gen !== generation) return;
    try { await tick(); live.classList.remove("stale"); live.textContent = `live · every ${POLL_MS / 1000} s`; }
    catch (err) {
      if (gen !== generation) return;
      live.classList.add("stale");
      if (permanentProblem(err)) {
        live.textContent = `stopped: ${err.status} from the API`;
        showProblem(where ? where(err) : app, err);
        return;
      }
      live.textContent = `API error: ${err.message}`;
    }
    if (gen === generation) setTimeout(run, POLL_MS);
  };
  run();
}

const badge = (s) => `<span class="badge s-${esc(s)}" data-status="${esc(s)}">${esc(s)}</span>`;
const progress = (f) => `<span class="progress" title="${Math.round(100 * f)}% of runs ended"><span style="width:${100 * f}%"></span></span>`;

// ------------------------------------------------------------------------------------ experiments list

// Newest first, LIST_PAGE_SIZE a page; "more" follows next_cursor. Every shown page is polled, each from the
// next_cursor the page before it answers now (a new experiment shifts the pages; none falls between them).
function listPage() {
  app.innerHTML = `<h1>Experiments</h1><p class="muted">Newest first. Status and progress update live.</p>
    <div class="tablewrap" style="max-height:none"><table id="experiments"><thead><tr><th class="num">id</th><th>name</th>
    <th>cluster</th><th>source</th><th>status</th><th>progress</th><th class="num">runs</th><th>created (UTC)</th>
    </tr></thead><tbody></tbody></table></div>
    <div class="controls"><button id="more" hidden>more</button><span id="list-count" class="note"></span></div>
    <div id="list-problem"></div>`;
  let pages = 1, shown = "";
  const load = async () => {
    const items = [];
    let changed = false, next = null, url = `/experiments?limit=${LIST_PAGE_SIZE}`;
    for (let i = 0; i < pages && url; i++) {
      const page = await poll(url);
      changed = changed || page.changed;
      items.push(...page.data.items);
      next = page.data.next_cursor;
      url = next ? `/experiments?limit=${LIST_PAGE_SIZE}&cursor=${encodeURIComponent(next)}` : null;
    }
    const key = `${pages}|${items.map((e) => e.id).join(",")}`;
    if (!changed && key === shown) return;
    shown = key;
    stats.renders++;
    const seen = new Set();
    const rows = items.filter((e) => !seen.has(e.id) && seen.add(e.id)).map((e) => `<tr data-id="${e.id}"><td class="num">${e.id}</td>
      <td class="name"><a href="#/experiments/${e.id}">${esc(e.name)}</a></td><td>${esc(e.cluster)}</td><td>${esc(e.source)}</td>
      <td>${badge(e.status)}</td><td>${progress(e.progress)} ${Math.round(100 * e.progress)}%</td>
      <td class="num">${e.num_runs}</td><td>${esc(e.created_at.slice(0, 19).replace("T", " "))}</td></tr>`);
    document.querySelector("#experiments tbody").innerHTML = rows.join("") ||
      `<tr><td colspan="8" class="muted">No experiments yet: POST /experiments or /experiments/import.</td></tr>`;
    document.getElementById("more").hidden = !next;
    document.getElementById("list-count").textContent = rows.length ? `${rows.length} shown${next ? ", more older ones" : ""}` : "";
  };
  const gen = generation + 1;  // loop() below takes this generation: a click after the route changed does nothing
  const more = document.getElementById("more");
  more.onclick = async () => {
    if (gen !== generation) return;
    pages++; more.disabled = true;
    try { await load(); }
    catch (err) { if (permanentProblem(err)) showProblem(document.getElementById("list-problem"), err); }
    finally { more.disabled = false; }
  };
  loop(load, () => document.getElementById("list-problem"));
}

// ------------------------------------------------------------------------------------ one experiment

const CHARTS = [
  ["throughput", "Throughput X(N)", "global tokens/s, log scale; dotted: ideal linear scaling from N0"],
  ["efficiency", "Scaling efficiency E(N)", "X(N) / (X(N0)·N/N0), %; dashed: 100%"],
  ["breakdown", "Where the step time goes", "ms per step by category (profiled steps); one bar per precision · layout at each N"],
  ["speedup", "fp8 speedup S(N)", "X_fp8 / X_bf16 at the same engine, layout and N; dashed: 1×"],
  ["engine", "Engine ratio R(N)", "X_engine / X_scalebench at the same precision, layout and N; dashed: 1×"],
  ["mfu", "MFU", "% of the device's dense bf16 peak (fp8 runs too)"],
  ["memory", "Peak memory", "GiB allocated, max over ranks"],
  ["loss", "Loss: fp8 vs bf16", "training loss per step; several seeds: their mean and a band from min to max"],
];

function experimentPage(id) {
  app.innerHTML = `<div id="head"><h1>Experiment ${id}</h1></div><div id="page-problem"></div>
    <div class="grid">${CHARTS.map(([k, t, s]) => `<div class="card"><h3>${t}</h3><div class="sub">${s}</div>
      ${k === "loss" ? `<div class="controls"><label id="loss-n-label" hidden>N = <select id="loss-n"></select></label></div>` : ""}
      <div class="chart" id="chart-${k}" data-points="0"></div></div>`).join("")}</div>
    <h2>Fits and notes</h2><div id="fits" class="note"></div>
    <h2>Runs</h2><div class="tablewrap"><table id="runs"><thead><tr><th class="num">run</th><th>engine</th><th>precision</th><th>layout</th>
    <th class="num">N</th><th class="num">seed</th><th class="num">repeat</th><th>status</th><th>worker</th><th>started (UTC)</th><th>finished (UTC)</th>
    <th>error</th></tr></thead><tbody></tbody></table></div>`;
  let lossN = null;
  const lossSelect = document.getElementById("loss-n");
  lossSelect.addEventListener("change", () => { lossN = Number(lossSelect.value); drawLosses(bodies.get(`/experiments/${id}/losses?repeats=first`), lossN); });
  loop(async () => {
    const exp = await poll(`/experiments/${id}`);
    if (!exp.changed) return;  // nothing moved: no other request, no re-render
    stats.renders++;
    renderHead(exp.data);
    const [runs, scaling, losses, breakdown] = await Promise.all([poll(`/experiments/${id}/runs?limit=1000`),
      poll(`/experiments/${id}/scaling`), poll(`/experiments/${id}/losses?repeats=first`), poll(`/experiments/${id}/breakdown`)]);
    if (runs.changed) renderRuns(runs.data.items);
    if (breakdown.changed) SBBreakdown.render(document.getElementById("chart-breakdown"), breakdown.data);
    if (scaling.changed) { renderScaling(scaling.data); lossVerdicts = scaling.data.speedups || []; }
    if (losses.changed) lossN = fillLossSelect(lossSelect, losses.data, lossN);
    if (losses.changed || scaling.changed) drawLosses(bodies.get(`/experiments/${id}/losses?repeats=first`) || losses.data, lossN);
    if (window.SBProjection) await SBProjection.update(id, exp.data.cluster);  // projection.js: dashed projected points (last: one more request)
  }, (err) => {
    // the experiment itself is refused (unknown id): nothing of the page can be shown; a part of it: say so above
    if (err.url === `/experiments/${id}`) app.innerHTML = `<h1>Experiment ${id}</h1><div id="page-problem"></div>`;
    return document.getElementById("page-problem");
  });
}

function renderHead(e) {
  const s = e.spec || {};
  document.getElementById("head").innerHTML = `<h1>${esc(e.name)} <span class="muted">#${e.id}</span> ${badge(e.status)}</h1>
    <div class="meta"><span>cluster <b>${esc(e.cluster)}</b></span><span>model <b>${esc(s.model)}${s.num_layers ? ` (${s.num_layers} layers)` : ""}</b></span>
    <span>scaling <b>${esc(s.scaling)}</b></span><span>seq_len <b>${esc(s.seq_len)}</b></span><span>source <b>${esc(e.source)}</b></span>
    <span id="exp-progress">${progress(e.progress)} <b>${Object.entries(e.counts).filter(([, n]) => n).map(([k, n]) => `${n} ${k}`).join(", ")}</b></span>
    <span><a href="/experiments/${e.id}/scaling?format=csv">CSV</a> · <a href="/experiments/${e.id}/scaling.png">PNG</a> ·
    <a href="#/compare?ids=${e.id}">compare…</a></span></div>`;
}

function renderRuns(items) {
  document.querySelector("#runs tbody").innerHTML = items.map((r) => `<tr id="run-${r.id}" data-status="${esc(r.status)}">
    <td class="num"><a href="/runs/${r.id}">${r.id}</a></td><td>${esc(r.engine || "scalebench")}</td><td>${esc(r.precision)}</td><td>${esc(r.layout)}</td>
    <td class="num">${r.num_devices}</td><td class="num">${r.seed ?? 0}</td><td class="num">${r.repeat}</td><td>${badge(r.status)}</td><td>${esc(r.worker || "")}</td>
    <td>${esc((r.started_at || "").slice(0, 19).replace("T", " "))}</td><td>${esc((r.finished_at || "").slice(0, 19).replace("T", " "))}</td>
    <td class="err">${r.error_kind ? `${esc(r.error_kind)}: ${esc((r.error_message || "").slice(0, 160))}` : ""}</td></tr>`).join("");
}

function styleFor(series, prefix) {
  const layouts = [...new Set(series.map((s) => s.key.layout))].sort();
  const multiModel = new Set(series.map((s) => `${s.key.model}/${s.key.num_layers}`)).size > 1;
  const multiCluster = new Set(series.map((s) => s.key.cluster)).size > 1;
  const multiEngine = new Set(series.map((s) => s.key.engine || "scalebench")).size > 1;
  const precisions = [...new Set(series.map((s) => s.key.precision))];
  return { label: (s) => SB.seriesLabel(s.key, { model: multiModel, cluster: multiCluster, engine: multiEngine, prefix: prefix && prefix(s) }),
    color: (s) => SB.colorOf(s.key.precision, precisions.indexOf(s.key.precision)),
    dash: (s) => SB.LAYOUT_DASHES[layouts.indexOf(s.key.layout) % SB.LAYOUT_DASHES.length] };
}

function scalingPanel(el, series, counts, style, kind) {
  const spec = { throughput: ["tokens_per_sec", 1, "tokens/s", "global throughput X(N) (tokens/s)"],
    efficiency: ["efficiency", 100, "%", "scaling efficiency E(N) (%)"],
    speedup: ["fp8_speedup", 1, "×", "fp8 speedup over bf16 S(N) (×)"],
    engine: ["engine_ratio", 1, "×", "engine ratio X_engine / X_scalebench (×)"],
    mfu: ["mfu_vs_bf16_peak", 100, "%", "MFU vs dense bf16 peak (%)"],
    memory: ["peak_memory_allocated_gib", 1, "GiB", "peak memory allocated (GiB)"] }[kind];
  const [attr, scale, unit, title] = spec;
  const data = SB.seriesDatasets(series, attr, scale, style);
  if (!counts.length || (!data.length && !series.some((s) => s.points.some((p) => p.status === "failed")))) {
    const why = { speedup: "no fp8/bf16 pair measured at the same layout and N",
      engine: "one engine only: add engines (torchtitan, command:<name>) to compare stacks", mfu: "no MFU: the device is not in the peak table (or no run succeeded)" }[kind];
    return SB.emptyChart(el, why || "no measured point yet");
  }
  const ys = data.flatMap((d) => d.data.map((p) => p.y));
  const log = kind === "throughput";
  const lowest = ys.length ? Math.min(...ys) : 1;
  const failedAt = log ? lowest / 1.8 : 0;
  const datasets = [...data];
  if (kind === "throughput") datasets.push(...SB.idealDatasets(series, style));
  if (kind === "efficiency") datasets.push(SB.refLine(counts, 100, "ideal (100%)"));
  if (kind === "speedup") datasets.push(SB.refLine(counts, 1, "no speedup (1×)"), ...effectiveDatasets(series, style));
  if (kind === "engine") datasets.push(SB.refLine(counts, 1, "as fast as scalebench (1×)"));
  if (kind !== "speedup" && kind !== "engine") { const f = SB.failedDataset(series, failedAt, style); if (f) datasets.push(f); }
  const y = log ? { type: "logarithmic", min: failedAt / 1.3, title: { display: true, text: title }, ticks: { callback: SB.logTick } }
    : { type: "linear", beginAtZero: kind !== "speedup" && kind !== "engine", title: { display: true, text: title } };
  // E(N): the axis zooms to the points and the projection's bands (a 0-110% axis leaves the 1-4 pp that matter
  // between 8 and 1,024 GPUs a few pixels)
  if (kind === "efficiency") y.beginAtZero = false;
  SB.drawChart(el, "line", { datasets }, SB.chartOptions(SB.gpuAxis(counts), y, unit));
}

// The speedup at equal loss, S(N) / steps_ratio (speedups[].effective_speedup, core.analysis.time_to_loss), drawn
// beside S(N) for each fp8 series: thin dotted line, error bars as the band in the tooltip.
let speedupsByKey = new Map();

function effectiveDatasets(series, style) {
  return series.map((s) => {
    const k = s.key;
    const data = s.points.map((p) => speedupsByKey.get([k.engine || "scalebench", k.model, k.num_layers, k.precision, k.layout, k.scaling, k.cluster, p.num_devices].join("|")))
      .filter((sp) => sp && sp.effective_speedup != null)
      .map((sp) => ({ x: sp.num_devices, y: sp.effective_speedup, band: sp.effective_speedup_band }));
    if (!data.length) return null;
    const color = style.color(s);
    return { label: `${style.label(s)} at equal loss (S / steps ratio)`, data, borderColor: color, backgroundColor: color,
      borderDash: [1, 3], borderWidth: 1.4, pointRadius: 3, pointStyle: "triangle" };
  }).filter(Boolean);
}

function renderScaling(report) {
  speedupsByKey = new Map((report.speedups || []).map((sp) => [[sp.engine || "scalebench", sp.model, sp.num_layers, sp.precision, sp.layout, sp.scaling, sp.cluster, sp.num_devices].join("|"), sp]));
  const style = styleFor(report.series);
  for (const kind of ["throughput", "efficiency", "speedup", "engine", "mfu", "memory"]) {
    const series = kind === "speedup" ? report.series.filter((s) => s.key.precision.startsWith("fp8"))
      : kind === "engine" ? report.series.filter((s) => (s.key.engine || "scalebench") !== "scalebench") : report.series;
    scalingPanel(document.getElementById(`chart-${kind}`), series, report.gpu_counts, style, kind);
  }
  document.getElementById("fits").innerHTML = report.series.map((s) => {
    const a = s.amdahl, u = s.usl;
    const fit = a.fitted ? `Amdahl s=${SB.fmt(a.serial_fraction, 4)} (R²=${SB.fmt(a.r_squared, 3)})` : esc(a.reason);
    // The fits describe the measured range: the API gives their peak and their value at full size only within it.
    // Beyond it the projection (drawn dashed, with its 80% band) is the one prediction; the series' notes say so.
    const usl = u.fitted ? `USL σ=${SB.fmt(u.sigma, 4)} κ=${SB.fmt(u.kappa, 6)}${u.peak_num_devices ? `, curve peaks at N*≈${Math.round(u.peak_num_devices)}` : ""}` : "";
    const at = u.at_full_size;
    const pred = at && at.efficiency != null ? `; USL curve fit at N=${at.num_devices}: E=${SB.fmt(100 * at.efficiency, 1)}%` : "";
    return `<div><b>${esc(style.label(s))}</b> · N0=${s.baseline_num_devices ?? "–"} · ${fit}${usl ? " · " + usl : ""}${pred}${s.notes.length ? ` · <i>${esc(s.notes.join("; "))}</i>` : ""}</div>`;
  }).join("") || "no series yet";
}

function fillLossSelect(select, losses, current) {
  const ns = [...new Set(losses.curves.map((c) => c.num_devices))].sort((a, b) => a - b);
  const pick = ns.includes(current) ? current : ns[ns.length - 1] ?? null;
  select.innerHTML = ns.map((n) => `<option value="${n}" ${n === pick ? "selected" : ""}>${n}</option>`).join("");
  select.closest("label").hidden = !ns.length;  // no curve: no N to choose
  return pick;
}

// The fp8 loss verdicts of the served scaling report (speedups[].loss_numerics: window, gap, band, verdict):
// the loss chart marks each verdict's window at the chosen N with two vertical lines, the verdict in the legend.
let lossVerdicts = [];

function verdictWindows(curves, n) {
  const ys = curves.flatMap((c) => c.losses).filter((y) => Number.isFinite(y));
  if (!ys.length) return [];
  const lo = Math.min(...ys), hi = Math.max(...ys);
  return lossVerdicts.filter((sp) => sp.num_devices === n && sp.loss_numerics && sp.loss_numerics.window_first_step != null)
    .map((sp, i) => {
      const v = sp.loss_numerics, color = SB.colorOf(sp.precision, i);
      const gap = v.gap == null ? "" : ` ${(100 * v.gap).toFixed(2)}% ±${(100 * v.band).toFixed(2)}%`;
      return { label: `window ${sp.precision} · ${sp.layout}: ${v.verdict}${gap} (${v.source} loss)`,
        data: [{ x: v.window_first_step, y: lo }, { x: v.window_first_step, y: hi }, { x: null, y: null },
               { x: v.window_last_step, y: hi }, { x: v.window_last_step, y: lo }],
        borderColor: color, backgroundColor: color, borderDash: [2, 3], borderWidth: 1, pointRadius: 0, spanGaps: false };
    });
}

// The seeds of one (engine, precision, layout) at N: a line through the mean of the seeds and a shaded band from
// their min to their max at every step all of them logged (each seed's own line when their steps differ).
const SEED_BAND_ALPHA = "33";

function seedDatasets(group, label, color, dash) {
  const counted = { borderColor: color, backgroundColor: color, borderDash: dash, pointRadius: 0, _count: true };
  const seeds = group.map((c) => c.seed ?? 0);
  if (group.length === 1) {
    return [{ label, data: group[0].steps.map((s, j) => ({ x: s, y: group[0].losses[j] })), borderWidth: 1.6, ...counted }];
  }
  const byStep = group.map((c) => new Map(c.steps.map((s, j) => [s, c.losses[j]])));
  const steps = group[0].steps.filter((s) => byStep.every((m) => Number.isFinite(m.get(s))));
  if (steps.length < 2) {  // no common steps: every seed's own line
    return group.map((c, i) => ({ label: `${label} · seed ${seeds[i]}`, data: c.steps.map((s, j) => ({ x: s, y: c.losses[j] })),
      borderWidth: 1, ...counted }));
  }
  const at = (f) => steps.map((s) => ({ x: s, y: f(byStep.map((m) => m.get(s))) }));
  const band = (f, fill) => ({ label: `${label}: seed range`, data: at(f), borderColor: "transparent",
    backgroundColor: `${color}${SEED_BAND_ALPHA}`, pointRadius: 0, fill, _band: true, _seedBand: true });
  const mean = (ys) => ys.reduce((a, b) => a + b, 0) / ys.length;
  return [band((ys) => Math.min(...ys), false), band((ys) => Math.max(...ys), "-1"),
    { label: `${label} (mean of ${group.length} runs: seeds ${[...new Set(seeds)].join(", ")}; band: min–max)`,
      data: at(mean), borderWidth: 1.6, ...counted }];
}

// Time to the same loss (speedups[].time_to_loss.matches): at each checkpoint, the loss bf16 reached (circle at
// the step it got there) and the step fp8 got there (triangle), joined by a line: its length is the steps fp8
// needed more (or fewer). The matched loss is the smoothed held-out or training loss (the legend says which).
function matchedPoints(n) {
  return lossVerdicts.filter((sp) => sp.num_devices === n && sp.time_to_loss && (sp.time_to_loss.matches || []).length)
    .map((sp, i) => {
      const t = sp.time_to_loss, color = SB.colorOf(sp.precision, i);
      const data = t.matches.flatMap((m) => m.fp8_step == null ? [{ x: m.bf16_step, y: m.loss }, { x: null, y: null }]
        : [{ x: m.bf16_step, y: m.loss }, { x: m.fp8_step, y: m.loss }, { x: null, y: null }]);
      const ratio = t.steps_ratio == null ? (t.shortfall == null ? "" : `: short ${(100 * t.shortfall).toFixed(1)}%`)
        : `: steps ratio ${t.steps_ratio.toFixed(3)}${t.effective_speedup == null ? "" : `, ${t.effective_speedup.toFixed(2)}× at equal loss`}`;
      return { label: `same loss ${sp.precision} · ${sp.layout}${ratio} (${t.source} loss, smoothed)`, data,
        borderColor: color, backgroundColor: color, borderWidth: 1, pointRadius: 4, pointStyle: "triangle", spanGaps: false };
    });
}

function drawLosses(losses, n) {
  const el = document.getElementById("chart-loss");
  const curves = losses ? losses.curves.filter((c) => c.num_devices === n) : [];
  if (!curves.length) return SB.emptyChart(el, "no loss curve yet");
  const layouts = [...new Set(curves.map((c) => c.layout))].sort();
  const multiEngine = new Set(curves.map((c) => c.engine || "scalebench")).size > 1;
  const groups = new Map();  // (engine, precision, layout) -> its runs: every seed and repeat
  curves.forEach((c) => {
    const key = `${c.engine || "scalebench"}|${c.precision}|${c.layout}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(c);
  });
  const datasets = [...groups.values()].flatMap((group, i) => {
    const c = group[0];
    const label = `${multiEngine ? `${c.engine} · ` : ""}${c.precision} · ${c.layout}`;
    return seedDatasets(group, label, SB.colorOf(c.precision, i), SB.LAYOUT_DASHES[layouts.indexOf(c.layout) % 4]);
  });
  datasets.push(...verdictWindows(curves, n), ...matchedPoints(n));
  const opts = SB.chartOptions({ type: "linear", title: { display: true, text: `step (N=${n} GPUs)` } },
    { type: "linear", title: { display: true, text: "training loss" } }, "");
  const legend = opts.plugins && opts.plugins.legend;
  if (legend) legend.labels = { ...(legend.labels || {}), filter: (item, data) => !data.datasets[item.datasetIndex]._band };
  SB.drawChart(el, "line", { datasets }, opts);
  el.dataset.seedBands = String(datasets.filter((d) => d._seedBand).length / 2);
}

// ------------------------------------------------------------------------------------------ compare

function comparePage(params) {
  const ids = (params.get("ids") || "").split(",").filter(Boolean);
  app.innerHTML = `<h1>Compare experiments</h1><div class="controls"><label>experiment ids <input id="ids" size="24"
    placeholder="e.g. 3,7 (first = reference)" value="${esc(ids.join(","))}"></label><button id="go">compare</button>
    <span class="note">ratios are X(N) of each experiment over the first, per matching precision · layout</span></div>
    <div id="cmp-body"></div>`;
  document.getElementById("go").onclick = () => { location.hash = `#/compare?ids=${document.getElementById("ids").value.replace(/\s/g, "")}`; };
  if (ids.length < 2) { document.getElementById("cmp-body").innerHTML = `<div class="empty">Name two or more experiment ids.</div>`; return; }
  document.getElementById("cmp-body").innerHTML = `<div class="grid">
    <div class="card"><h3>Throughput X(N)</h3><div class="sub">global tokens/s, log scale</div><div class="chart" id="cmp-throughput"></div></div>
    <div class="card"><h3>Scaling efficiency E(N)</h3><div class="sub">% of linear from each experiment's N0</div><div class="chart" id="cmp-efficiency"></div></div>
    <div class="card"><h3>Ratio to #${esc(ids[0])}</h3><div class="sub">X_other(N) / X_reference(N), ×; dashed: parity</div><div class="chart" id="cmp-ratio"></div></div>
    </div><h2>Ratios</h2><div class="tablewrap"><table id="ratios"></table></div>`;
  loop(async () => {
    const { changed, data } = await poll(`/compare?experiments=${ids.join(",")}`);
    if (!changed) return;
    stats.renders++;
    renderCompare(data);
  }, () => document.getElementById("cmp-body"));
}

function renderCompare(data) {
  const all = data.experiments.flatMap((e) => e.report.series.map((s) => ({ ...s, _exp: e })));
  const counts = [...new Set(data.experiments.flatMap((e) => e.report.gpu_counts))].sort((a, b) => a - b);
  const expIndex = new Map(data.experiments.map((e, i) => [e.id, i]));
  const base = styleFor(all);
  const oneCluster = new Set(data.experiments.map((e) => e.cluster)).size === 1;  // then names tell them apart
  const tag = (e) => `#${e.id} ${oneCluster ? e.name.slice(0, 32) : e.cluster}`;
  const style = { label: (s) => `${tag(s._exp)} · ${s.key.precision} · ${s.key.layout}`, color: base.color,
    dash: (s) => SB.LAYOUT_DASHES[expIndex.get(s._exp.id) % SB.LAYOUT_DASHES.length] };
  scalingPanel(document.getElementById("cmp-throughput"), all, counts, style, "throughput");
  scalingPanel(document.getElementById("cmp-efficiency"), all, counts, style, "efficiency");
  const groups = new Map();
  data.ratios.forEach((r) => {
    const k = `#${r.experiment_id} / #${r.reference_experiment_id} · ${r.precision} · ${r.layout}`;
    if (!groups.has(k)) groups.set(k, { r, pts: [] });
    groups.get(k).pts.push({ x: r.num_devices, y: r.ratio });
  });
  const el = document.getElementById("cmp-ratio");
  if (!groups.size) SB.emptyChart(el, "no series measured at a common N");
  else {
    const ds = [...groups.entries()].map(([label, g], i) => ({ label, data: g.pts.sort((a, b) => a.x - b.x),
      borderColor: SB.colorOf(g.r.precision, i), backgroundColor: SB.colorOf(g.r.precision, i), pointRadius: 4,
      borderDash: SB.LAYOUT_DASHES[expIndex.get(g.r.experiment_id) % SB.LAYOUT_DASHES.length], _count: true }));
    ds.push(SB.refLine(counts, 1, "parity (1×)"));
    SB.drawChart(el, "line", { datasets: ds }, SB.chartOptions(SB.gpuAxis(counts),
      { type: "linear", title: { display: true, text: "throughput ratio (×)" } }, "×"));
  }
  document.getElementById("ratios").innerHTML = `<thead><tr><th>experiment / reference</th><th>precision</th><th>layout</th>
    <th class="num">N</th><th class="num">X (tokens/s)</th><th class="num">X ref (tokens/s)</th><th class="num">ratio</th>
    <th class="num">E</th><th class="num">E ref</th></tr></thead><tbody>${data.ratios.map((r) => `<tr>
    <td>#${r.experiment_id} ${esc(r.cluster)} / #${r.reference_experiment_id} ${esc(r.reference_cluster)}</td><td>${esc(r.precision)}</td>
    <td>${esc(r.layout)}</td><td class="num">${r.num_devices}</td><td class="num">${SB.fmt(r.tokens_per_sec)}</td>
    <td class="num">${SB.fmt(r.reference_tokens_per_sec)}</td><td class="num">${r.ratio.toFixed(3)}×</td>
    <td class="num">${r.efficiency === null ? "–" : (100 * r.efficiency).toFixed(1) + "%"}</td>
    <td class="num">${r.reference_efficiency === null ? "–" : (100 * r.reference_efficiency).toFixed(1) + "%"}</td></tr>`).join("")}</tbody>`;
}

// ------------------------------------------------------------------------------------------- routing

function route() {
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const m = path.match(/^\/experiments\/(\d+)$/);
  if (m) experimentPage(Number(m[1]));
  else if (path === "/compare") comparePage(new URLSearchParams(query || ""));
  else listPage();
}
window.addEventListener("hashchange", route);
route();
