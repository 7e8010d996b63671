// Forecast page: truth against forecast per window, from the JSON the view embeds.
(function () {
  "use strict";
  function read(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }
  function chart(parent, title, traces, xtitle) {
    const div = document.createElement("div");
    div.className = "chart";
    parent.appendChild(div);
    Plotly.newPlot(div, traces, {
      title: { text: title }, margin: { t: 40, l: 60, r: 10, b: 40 },
      xaxis: { title: { text: xtitle } }, yaxis: { title: { text: "tokens" } },
    }, { displayModeBar: false, responsive: true });
  }
  const report = read("ape-report");
  if (report) {
    const parent = document.getElementById("ape-charts");
    for (const s of report.series) {
      const title = `${s.trace} ${s.series}: mean APE ${(100 * s.mean_ape_gapless).toFixed(1)} %` +
        ` (naive ${(100 * s.naive_mean_ape).toFixed(1)} %, PreServe 4-8 %)`;
      chart(parent, title, [
        { x: s.index, y: s.truth, name: "actual", mode: "lines" },
        { x: s.index, y: s.forecast, name: `forecast (lead ${report.lead})`, mode: "lines" },
      ], `window (${s.window_s} s)`);
    }
  }
  const live = read("live-forecasts");
  if (live) {
    const parent = document.getElementById("live-charts");
    for (const f of live) {
      const n = f.actual.prompt.length;
      const x = Array.from({ length: n }, (_, i) => f.actual.first + i);
      const ahead = [f.next_window, f.next_window + 1];
      chart(parent, `${f.scope}: forecast of the current and the next window`, [
        { x: x, y: f.actual.prompt, name: "prompt", mode: "lines" },
        { x: x, y: f.actual.decode, name: "decode", mode: "lines" },
        { x: ahead, y: f.forecast.prompt, name: "prompt forecast", mode: "markers" },
        { x: ahead, y: f.forecast.decode, name: "decode forecast", mode: "markers" },
      ], `window (${f.window_s} s since the epoch)`);
    }
  }
})();
