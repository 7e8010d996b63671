// Charts: 15 minutes of live snapshots per region, and rollup history for a chosen range
// with each policy change marked on the time axis.
(function () {
  "use strict";
  const WINDOW_MS = 15 * 60 * 1000;
  const layout = function (title, extra) {
    return Object.assign({
      title: { text: title, font: { size: 13 } }, paper_bgcolor: "#182029", plot_bgcolor: "#182029",
      font: { color: "#e6e9ec" }, margin: { l: 50, r: 10, t: 36, b: 36 }, height: 260,
      xaxis: { type: "date", gridcolor: "#263040" }, yaxis: { gridcolor: "#263040", rangemode: "tozero" },
      legend: { orientation: "h" },
    }, extra || {});
  };
  const config = { displaylogo: false, responsive: true };
  const live = {};  // region -> {t: [], hit_rate: [], queue: [], rps: [], ttft: []}
  const liveCharts = { hit_rate: "KV hit rate", queue: "Pending (balancer queue + replica waiting)", rps: "Requests/s", ttft: "TTFT p50 (s)" };

  function draw(prefix, key, title, series, field, shapes) {
    const traces = Object.keys(series).sort().map(function (region) {
      // Copies: Plotly.react redraws only data whose arrays are new objects.
      return { x: series[region].t.slice(), y: series[region][field].slice(), name: region, mode: "lines", type: "scatter" };
    });
    Plotly.react(prefix + key, traces, layout(title, { shapes: shapes || [] }), config);
  }

  // On load the socket first sends the last 15 minutes from the balancers' streams,
  // so the live charts start full rather than from the moment the page opened.
  window.meridian.on("history", function (h) {
    Object.keys(h.regions).forEach(function (region) {
      const src = h.regions[region];
      live[region] = {
        t: src.t.map(function (t) { return new Date(t * 1000); }),
        hit_rate: src.hit_rate.slice(), queue: src.queue.slice(), rps: src.rps.slice(), ttft: src.ttft.slice(),
      };
    });
    Object.keys(liveCharts).forEach(function (key) { draw("live-", key, liveCharts[key], live, key); });
  });

  window.meridian.on("snapshot", function (s) {
    const now = new Date(s.ts * 1000);
    s.regions.forEach(function (r) {
      const row = live[r.name] || (live[r.name] = { t: [], hit_rate: [], queue: [], rps: [], ttft: [] });
      row.t.push(now); row.hit_rate.push(r.hit_rate); row.queue.push(r.queue + r.waiting);
      row.rps.push(r.rps); row.ttft.push(r.ttft_p50_s);
      while (row.t.length && now - row.t[0] > WINDOW_MS) Object.keys(row).forEach(function (k) { row[k].shift(); });
    });
    Object.keys(liveCharts).forEach(function (key) { draw("live-", key, liveCharts[key], live, key); });
  });

  function markers(changes) {
    return changes.map(function (c) {
      return { type: "line", xref: "x", yref: "paper", x0: c.at, x1: c.at, y0: 0, y1: 1,
               line: { color: "#d29922", dash: "dash", width: 1 }, name: c.message };
    });
  }

  function loadHistory() {
    const minutes = document.getElementById("range").value;
    fetch(window.MERIDIAN_HISTORY_URL + "?minutes=" + minutes, { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (data) {
        const shapes = markers(data.policy_changes);
        draw("hist-", "hit_rate", "KV hit rate", data.regions, "hit_rate", shapes);
        draw("hist-", "queue", "Pending", data.regions, "queue", shapes);
        draw("hist-", "throughput", "Completion tokens/s", data.regions, "throughput", shapes);
        draw("hist-", "ttft", "TTFT p90 (s)", data.regions, "ttft_p90", shapes);
      });
  }
  document.getElementById("range").addEventListener("change", loadHistory);
  Object.keys(liveCharts).forEach(function (key) { draw("live-", key, liveCharts[key], {}, key); });
  loadHistory();
})();
