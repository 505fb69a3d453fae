// The history page's chart: repairs opened per day, one series per reason,
// drawn with uPlot (vendored, static/vendor/uplot) from the page's JSON data
// island (the value GET /api/v1/stats serves).
(function () {
  var el = document.getElementById("chart-repairs");
  var data = document.getElementById("chart-data");
  if (!el || !data || typeof uPlot === "undefined") return;
  var st = JSON.parse(data.textContent);
  if (!st.reasons.length) { el.textContent = "No repairs in the range."; return; }
  var xs = st.days.map(function (d) { return Date.parse(d + "T00:00:00Z") / 1000; });
  var colors = ["#cf222e", "#0969da", "#1a7f37", "#9a6700", "#8250df", "#bc4c00", "#1b7c83", "#6e7781"];
  var series = [{}], cols = [xs];
  st.reasons.forEach(function (r, i) {
    series.push({ label: r.reason, stroke: colors[i % colors.length], width: 2, points: { show: true } });
    cols.push(r.perDay);
  });
  new uPlot({ width: Math.max(el.clientWidth, 320), height: 260, series: series,
    axes: [{}, { label: "repairs" }], scales: { x: { time: true } } }, cols, el);
})();
