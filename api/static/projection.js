// Projected scaling on the experiment page: GET /experiments/{id}/projection (the experiment's cluster network),
// drawn dashed after the last measured point of each series on the throughput and efficiency charts (with the
// shaded 80% prediction interval around it), with
// the network, the stacks charged and the model's error at measured points listed under the fits. A cluster that describes no
// network (and whose device implies none) gives a note instead of lines.
// Chart containers get data-projected (projected points drawn) for tests and users.
"use strict";

(function () {
  const PANELS = { throughput: ["tokens_per_sec", "measured_tokens_per_sec", 1], efficiency: ["efficiency", "measured_efficiency", 100] };
  // The 80% prediction interval of each projected point (attr + "_low" / "_high"), drawn as a shaded band.
  const BAND_ALPHA = "22";
  const PROJECTED_DASH = [6, 5];
  const state = { id: null, body: null, error: null };

  function noteEl() {
    let el = document.getElementById("projection-note");
    const fits = document.getElementById("fits");
    if (!el && fits) {
      el = document.createElement("div");
      el.id = "projection-note";
      el.className = "note";
      fits.insertAdjacentElement("afterend", el);
    }
    return el;
  }

  // Per series: the last measured point, then every projected point beyond it (the dashed continuation).
  function datasets(body, kind) {
    const [attr, measuredAttr, scale] = PANELS[kind];
    const precisions = [...new Set(body.series.map((s) => s.key.precision))];
    return body.series.map((s) => {
      const measured = s.points.filter((p) => p[measuredAttr] !== null && p[measuredAttr] !== undefined);
      const last = measured.length ? measured[measured.length - 1] : null;
      const beyond = s.points.filter((p) => !last || p.num_devices > last.num_devices);
      if (!beyond.length) return null;
      const data = (last ? [{ x: last.num_devices, y: last[measuredAttr] * scale, anchor: true }] : [])
        .concat(beyond.map((p) => ({ x: p.num_devices, y: p[attr] * scale })));
      const color = SB.colorOf(s.key.precision, precisions.indexOf(s.key.precision));
      const line = { label: `${s.key.precision} · ${s.key.layout} (projected)`, data, borderColor: color,
        backgroundColor: "#fff", borderDash: PROJECTED_DASH, borderWidth: 1.6, pointRadius: (c) => (c.raw && c.raw.anchor ? 0 : 3),
        pointStyle: "circle", _projected: true, _nProjected: beyond.length };
      // band: low edge, then high edge filled down to it ("-1"); the anchor point has no width
      const edge = (suffix) => (last ? [{ x: last.num_devices, y: last[measuredAttr] * scale }] : [])
        .concat(beyond.filter((p) => p[`${attr}${suffix}`] !== null && p[`${attr}${suffix}`] !== undefined)
          .map((p) => ({ x: p.num_devices, y: p[`${attr}${suffix}`] * scale })));
      const band = (suffix, fill) => ({ label: `${s.key.precision} · ${s.key.layout} (80% interval)`, data: edge(suffix),
        borderColor: "transparent", backgroundColor: `${color}${BAND_ALPHA}`, pointRadius: 0, fill, _projected: true,
        _band: true, _nProjected: 0 });
      return [band("_low", false), band("_high", "-1"), line];
    }).filter(Boolean).flat();
  }

  function draw() {
    const body = state.body;
    for (const kind of Object.keys(PANELS)) {
      const el = document.getElementById(`chart-${kind}`);
      const canvas = el && el.querySelector("canvas");
      const chart = canvas && Chart.getChart(canvas);
      if (!chart) continue;
      chart.data.datasets = chart.data.datasets.filter((d) => !d._projected);
      const labels = chart.options.plugins && chart.options.plugins.legend && chart.options.plugins.legend.labels;
      if (labels && !(labels.filter && labels.filter._noBands)) {  // the bands stay out of the legend
        const inner = labels.filter;
        labels.filter = (item, data) => !data.datasets[item.datasetIndex]._band && (!inner || inner(item, data));
        labels.filter._noBands = true;
      }
      const extra = body ? datasets(body, kind) : [];
      chart.data.datasets.push(...extra);
      const xs = chart.data.datasets.flatMap((d) => (d._ref ? [] : d.data.map((p) => p.x)));
      if (xs.length) {
        const ns = [...new Set(xs)].sort((a, b) => a - b);
        chart.options.scales.x = SB.gpuAxis(ns);
        // reference lines (E = 100%) across the whole x range shown, projected N included
        chart.data.datasets.filter((d) => d._ref).forEach((d) => { d.data = SB.refLine(ns, d.data[0].y, d.label).data; });
      }
      chart.update("none");
      el.dataset.projected = String(extra.reduce((n, d) => n + d._nProjected, 0));
      el.dataset.projectedBands = String(extra.filter((d) => d._band).length / 2);
    }
    const el = noteEl();
    if (!el) return;
    if (state.error) { el.innerHTML = `<div><b>Projection</b>: none (${esc(state.error)})</div>`; return; }
    if (!body) { el.innerHTML = ""; return; }
    const n = body.network, net = n.network;
    const errors = body.series.flatMap((s) => s.points.filter((p) => p.error !== null && p.num_devices !== s.baseline_num_devices)
      .map((p) => `${esc(s.key.precision)} · ${esc(s.key.layout)} N=${p.num_devices}: E ${SB.fmt(100 * p.efficiency, 1)}% vs measured ${SB.fmt(100 * p.measured_efficiency, 1)}%`));
    // the stacks charged and the series charged the runner's stack for want of one
    const stacks = body.stacks || [];
    const noted = (prefix) => [...new Set(body.series.flatMap((s) => s.notes.filter((t) => t.startsWith(prefix))))];
    const undescribed = noted("measured on ");
    // a layout family the published points were covered less often in than the interval promises
    const intervals = noted("80% interval: ");  // core.projection.model.INTERVAL_NOTE_PREFIX
    // calibrated (the default) where the series has measured points beyond N0
    const fitted = body.series.some((s) => s.calibration && s.calibration.fitted);
    el.innerHTML = `<div><b>Projection</b> (dashed) on <b>${esc(n.cluster)}</b>: ${esc(n.source)} · intra-node ${SB.fmt(net.intra_node_gb_per_s, 0)} GB/s,
      inter-node ${SB.fmt(n.inter_node_gb_per_s, 0)} GB/s per GPU, efficiency ${net.intra_node_efficiency}/${net.inter_node_efficiency},
      ${n.gpus_per_node} GPUs per node${fitted ? " · fitted to the measured points beyond N0" : ""} · <a href="/experiments/${state.id}/projection?format=csv">CSV</a>
      ${errors.length ? ` · model vs measured: ${errors.join("; ")}` : ""}</div>
      <div id="projection-stacks">${stacks.map(esc).join(" · ")}${undescribed.length ? ` · <i>${undescribed.map(esc).join("; ")}</i>` : ""}</div>
      <div id="projection-interval">${intervals.map(esc).join(" · ")}</div>`;
  }

  // Called by the experiment page after each scaling render (redrawn charts lose the projected lines).
  let cpuClusters = null;  // names of configured CPU clusters: nothing to project onto (the API would answer 422)
  // experiment id -> the API's reason for refusing its projection (a 4xx other than 429, e.g. a cluster with no
  // network, as imported ones): asked once per page load, the reason shown under the fits from then on
  const refused = new Map();

  async function update(id, cluster) {
    if (state.id !== id) { state.id = id; state.body = null; state.error = null; }
    if (cpuClusters === null) {
      try {
        const { data } = await poll("/clusters");
        cpuClusters = new Set(data.filter((c) => c.vendor === "cpu").map((c) => c.name));
      } catch (err) { cpuClusters = new Set(); }
    }
    if (cpuClusters.has(cluster)) { state.body = null; state.error = "a CPU cluster: no GPU network to project onto"; draw(); return; }
    if (refused.has(id)) { state.body = null; state.error = refused.get(id); draw(); return; }
    try {
      const { data } = await poll(`/experiments/${id}/projection`);
      state.body = data; state.error = null;
    } catch (err) {
      state.body = null; state.error = err.message;
      if (permanentProblem(err)) refused.set(id, err.message);
    }
    draw();
  }

  window.SBProjection = { update, datasets };
})();
