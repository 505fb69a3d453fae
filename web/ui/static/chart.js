// The charts page: repairs opened per day, one series per reason, and
// breaker trips per day, one series per scope, drawn with uPlot (vendored,
// static/vendor/uplot) from the page's JSON data island (the value
// GET /api/v1/stats serves).
(function () {
  var data = document.getElementById("chart-data");
  if (!data || typeof uPlot === "undefined") return;
  var st = JSON.parse(data.textContent);
  var xs = st.days.map(function (d) { return Date.parse(d + "T00:00:00Z") / 1000; });
  var colors = ["#cf222e", "#0969da", "#1a7f37", "#9a6700", "#8250df", "#bc4c00", "#1b7c83", "#6e7781"];

  function draw(id, rows, label, unit, empty, bars) {
    var el = document.getElementById(id);
    if (!el) return;
    if (!rows || !rows.length) { el.textContent = empty; return; }
    var series = [{}], cols = [xs];
    rows.forEach(function (r, i) {
      var s = { label: label(r), stroke: colors[i % colors.length], width: 2, points: { show: true } };
      if (bars) {
        s.fill = colors[i % colors.length] + "99";
        s.paths = uPlot.paths.bars({ size: [0.6, 40] });
        s.points = { show: false };
      }
      series.push(s);
      cols.push(r.perDay);
    });
    // Half a day of margin each side, so the first and last day's bars
    // are whole; counts are whole numbers.
    new uPlot({ width: Math.max(el.clientWidth, 320), height: 240, series: series,
      axes: [{}, { label: unit, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }],
      scales: { x: { time: true, range: function (u, lo, hi) { return [lo - 43200, hi + 43200]; } },
        y: { range: function (u, lo, hi) { return [0, Math.max(hi, 1)]; } } } }, cols, el);
  }

  draw("chart-repairs", st.reasons, function (r) { return r.reason; }, "repairs", "No repairs in the range.", false);
  draw("chart-trips", st.breakerTrips, function (r) { return r.scope; }, "trips", "No breaker tripped in the range.", true);
})();
