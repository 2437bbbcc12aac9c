// Chart helpers over the vendored Chart.js: scaling panels (log2 GPU axis) and loss curves.
// Every chart container carries data-points (data points drawn, reference lines excluded) and
// data-failed (failed points drawn as red crosses), so tests and users can check what is shown.
"use strict";

const PRECISION_COLORS = { "bf16": "#1f77b4", "fp8-tensorwise": "#ff7f0e", "fp8-rowwise": "#2ca02c",
  "fp8-rowwise-gw-hp": "#9467bd", "fp32": "#7f7f7f" };
const LAYOUT_DASHES = [[], [7, 4], [2, 3], [10, 3, 2, 3]];
const EXTRA_COLORS = ["#17becf", "#8c564b", "#e377c2", "#bcbd22", "#393b79", "#637939"];
const FAILED = "#d62728";

function colorOf(precision, i) { return PRECISION_COLORS[precision] || EXTRA_COLORS[i % EXTRA_COLORS.length]; }

function seriesLabel(key, opts) {
  const parts = [key.precision, key.layout];
  if (opts && opts.model) parts.unshift(`${key.model}/L${key.num_layers}`);
  if (opts && opts.cluster) parts.push(`@${key.cluster}`);
  if (opts && opts.engine) parts.unshift(key.engine || "scalebench");
  if (opts && opts.prefix) parts.unshift(opts.prefix);
  return parts.join(" · ");
}

function fmt(v, digits) {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return v.toFixed(digits === undefined ? 2 : digits);
}

const COMPACT = new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 });
// Log-axis ticks: label 1, 2 and 5 times powers of ten only (the others crowd the axis).
function logTick(v) {
  const mantissa = v / 10 ** Math.floor(Math.log10(v) + 1e-9);
  return [1, 2, 5].some((m) => Math.abs(mantissa - m) < 1e-6) ? COMPACT.format(v) : "";
}

// One line dataset per series for a point attribute; scale converts (e.g. fraction -> %).
function seriesDatasets(series, attr, scale, style) {
  return series.map((s) => {
    const pts = s.points.filter((p) => p[attr] !== null && p[attr] !== undefined)
      .map((p) => ({ x: p.num_devices, y: p[attr] * scale, flags: p.flags }));
    return { label: style.label(s), data: pts, borderColor: style.color(s), backgroundColor: style.color(s),
      borderDash: style.dash(s), pointRadius: 4, pointHoverRadius: 6, borderWidth: 2, tension: 0,
      _count: true };
  }).filter((d) => d.data.length > 0);
}

// Ideal linear lines from each series' baseline: X(N0) * N / N0 (dotted, same color, not counted).
function idealDatasets(series, style) {
  return series.map((s) => {
    const n0 = s.baseline_num_devices;
    const base = s.points.find((p) => p.num_devices === n0 && p.tokens_per_sec);
    if (!n0 || !base) return null;
    const ns = s.points.filter((p) => p.tokens_per_sec).map((p) => p.num_devices);
    return { label: "ideal (linear from N0)", data: ns.map((n) => ({ x: n, y: base.tokens_per_sec * n / n0 })),
      borderColor: style.color(s), borderDash: [2, 4], borderWidth: 1.2, pointRadius: 0, _ideal: true };
  }).filter(Boolean);
}

// Failed points (every repeat failed): red crosses at the bottom of the panel, one dataset for the legend.
function failedDataset(series, yAt, style) {
  const data = [];
  series.forEach((s) => s.points.filter((p) => p.status === "failed").forEach((p) =>
    data.push({ x: p.num_devices, y: yAt, series: style.label(s), failed: p.num_failed })));
  if (!data.length) return null;
  return { label: "failed run (no value)", data, type: "scatter", showLine: false, pointStyle: "crossRot",
    pointRadius: 9, pointHoverRadius: 11, borderColor: FAILED, backgroundColor: FAILED, borderWidth: 3,
    _failed: true };
}

function refLine(counts, y, label) {
  const lo = Math.min(...counts), hi = Math.max(...counts);
  return { label, data: [{ x: lo / 1.3, y }, { x: hi * 1.3, y }], borderColor: "#98a2b3", borderDash: [5, 4],
    borderWidth: 1, pointRadius: 0, _ref: true };
}

function gpuAxis(counts) {
  const lo = Math.min(...counts), hi = Math.max(...counts);
  return { type: "logarithmic", min: lo / 1.3, max: hi * 1.3,
    title: { display: true, text: "GPUs N (log₂ scale)" },
    afterBuildTicks: (axis) => { axis.ticks = counts.map((v) => ({ value: v })); },
    ticks: { callback: (v) => String(v), autoSkip: false, maxRotation: 0 } };
}

function chartOptions(xScale, yScale, tooltipUnit) {
  return {
    animation: false, responsive: true, maintainAspectRatio: false, parsing: true,
    interaction: { mode: "nearest", intersect: false },
    scales: { x: xScale, y: yScale },
    plugins: {
      legend: { position: "bottom", labels: { boxWidth: 18, font: { size: 11 },
        filter: (item, data) => { const d = data.datasets[item.datasetIndex];
          return !d._ideal || data.datasets.findIndex((x) => x._ideal) === item.datasetIndex; } } },
      tooltip: { callbacks: { label: (ctx) => {
        const d = ctx.dataset, r = ctx.raw;
        if (d._failed) return `${r.series}: failed at N=${r.x} (${r.failed} run(s))`;
        return `${d.label}: ${fmt(r.y)} ${tooltipUnit} at N=${r.x}`;
      } } },
    },
  };
}

// Create or update a chart inside a .chart container; returns the Chart.
function drawChart(container, type, data, options) {
  let canvas = container.querySelector("canvas");
  let chart = canvas && Chart.getChart(canvas);
  if (!chart) {
    container.innerHTML = "";
    canvas = document.createElement("canvas");
    container.appendChild(canvas);
    chart = new Chart(canvas, { type, data, options });
  } else {
    chart.data = data;
    chart.options = options;
    chart.update("none");
  }
  const counted = data.datasets.filter((d) => d._count);
  container.dataset.points = String(counted.reduce((n, d) => n + d.data.length, 0));
  container.dataset.series = String(counted.length);
  container.dataset.failed = String(data.datasets.filter((d) => d._failed).reduce((n, d) => n + d.data.length, 0));
  return chart;
}

function emptyChart(container, message) {
  const canvas = container.querySelector("canvas");
  if (canvas && Chart.getChart(canvas)) Chart.getChart(canvas).destroy();
  container.innerHTML = `<div class="empty">${message}</div>`;
  container.dataset.points = "0"; container.dataset.series = "0"; container.dataset.failed = "0";
}

window.SB = { logTick, colorOf, seriesLabel, fmt, seriesDatasets, idealDatasets, failedDataset, refLine, gpuAxis,
  chartOptions, drawChart, emptyChart, LAYOUT_DASHES, FAILED };
