// Cost page: cumulative savings against all on-demand over the cost window.
(function () {
  "use strict";
  const s = JSON.parse(document.getElementById("savings-series").textContent);
  Plotly.newPlot("savings-chart", [{ x: s.t, y: s.saved, type: "scatter", mode: "lines", fill: "tozeroy", name: "$ saved" }], {
    paper_bgcolor: "#182029", plot_bgcolor: "#182029", font: { color: "#e6e9ec" }, height: 300,
    margin: { l: 60, r: 10, t: 10, b: 40 }, xaxis: { type: "date", gridcolor: "#263040" },
    yaxis: { title: { text: "$ saved (cumulative)" }, gridcolor: "#263040" },
  }, { displaylogo: false, responsive: true });
})();
