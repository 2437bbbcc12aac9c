// Where the step time goes, per N: stacked bars from GET /experiments/{id}/breakdown, one bar per series
// (precision · layout) at each N, stacked by the parts that add up to a step (ms per step). Beside E(N): a
// falling efficiency lines up with a growing exposed-communication part.
// The container carries data-bars (bars drawn) and data-points (non-empty segments), like the other charts.
"use strict";

const BREAKDOWN_PARTS = [
  ["gemm_bf16_ms", "GEMM bf16", "#1f77b4"], ["gemm_fp8_ms", "GEMM fp8", "#ff7f0e"],
  ["fp8_cast_ms", "fp8 amax/scale/cast", "#e6550d"], ["attention_ms", "attention", "#9467bd"],
  ["elementwise_ms", "norms & other elementwise", "#8c564b"], ["optimizer_ms", "optimizer", "#e377c2"],
  ["exposed_communication_ms", "exposed communication", "#d62728"], ["idle_ms", "idle", "#c7c7c7"],
];

function breakdownDatasets(report, counts) {
  const datasets = [];
  report.series.forEach((s, i) => {
    const series = `${s.precision} · ${s.layout}`;
    const byN = new Map(s.points.map((p) => [p.num_devices, p]));
    for (const [key, label, color] of BREAKDOWN_PARTS) {
      datasets.push({ label, stack: series, _series: series, _key: key, _first: i === 0,
        data: counts.map((n) => (byN.has(n) ? byN.get(n)[key] : null)), _points: counts.map((n) => byN.get(n) || null),
        backgroundColor: color, borderColor: SB.colorOf(s.precision, i), borderWidth: { top: 0, left: 1.5, right: 1.5, bottom: 0 } });
    }
  });
  return datasets;
}

function renderBreakdown(el, report) {
  if (!report || !report.series.length) {
    SB.emptyChart(el, "no step breakdown: runs record one with profile_steps > 0");
    el.dataset.bars = "0";
    return;
  }
  const counts = [...new Set(report.series.flatMap((s) => s.points.map((p) => p.num_devices)))].sort((a, b) => a - b);
  const datasets = breakdownDatasets(report, counts);
  const options = {
    animation: false, responsive: true, maintainAspectRatio: false,
    scales: { x: { stacked: true, title: { display: true, text: "GPUs N (one bar per precision · layout)" } },
      y: { stacked: true, beginAtZero: true, title: { display: true, text: "ms per step" } } },
    plugins: {
      legend: { position: "bottom", labels: { boxWidth: 14, font: { size: 11 },
        filter: (item, data) => data.datasets[item.datasetIndex]._first } },
      tooltip: { callbacks: {
        title: (items) => items.length ? `N=${items[0].label} · ${items[0].dataset._series}` : "",
        label: (ctx) => `${ctx.dataset.label}: ${SB.fmt(ctx.raw, 1)} ms`,
        footer: (items) => {
          const p = items.length && items[0].dataset._points[items[0].dataIndex];
          if (!p) return "";
          const share = p.exposed_communication_share === null ? "–" : `${(100 * p.exposed_communication_share).toFixed(1)}%`;
          return `step ${SB.fmt(p.step_ms, 1)} ms · communication ${SB.fmt(p.communication_ms, 1)} ms ` +
            `(${SB.fmt(p.overlapped_communication_ms, 1)} overlapped) · exposed share ${share}`;
        } } },
    },
  };
  SB.drawChart(el, "bar", { labels: counts.map(String), datasets }, options);
  el.dataset.bars = String(report.series.reduce((n, s) => n + s.points.length, 0));
  el.dataset.points = String(datasets.reduce((n, d) => n + d.data.filter((v) => v !== null && v > 0).length, 0));
  el.dataset.series = String(report.series.length);
}

window.SBBreakdown = { render: renderBreakdown, PARTS: BREAKDOWN_PARTS };
