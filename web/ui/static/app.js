// fleetrepair dashboard: the few lines htmx does not do declaratively.
//
// Live pages (<main id="live" data-events=...>) follow the live stream,
// GET /api/v1/events (Server-Sent Events, EventSource reconnects by itself
// with Last-Event-ID). An event that concerns the page re-reads it: htmx
// fetches the page and swaps its main part (hx-trigger="fr:event"), within
// a second of the change on any controller replica. The page also re-reads
// itself slowly for what time alone changes (agent silence, expiries).
//
// A re-read waits while the on-call is typing a reason or has one half
// written (or has unticked a repair of a bulk approval), so it never wipes
// what they typed; it happens once they are done.
(function () {
  function busy(live) {
    return live.querySelector("form :focus") || live.querySelector("input[type=checkbox]:not(:checked)") ||
      Array.prototype.some.call(live.querySelectorAll("input[type=text]"), function (e) { return e.value !== ""; });
  }

  document.addEventListener("htmx:beforeRequest", function (evt) {
    var live = document.getElementById("live");
    if (!live || evt.detail.elt !== live) return;
    if (busy(live)) { evt.preventDefault(); stale = true; }
  });

  // concerns reports whether event e (type, data of GET /api/v1/events)
  // changes what the page shows.
  function concerns(live, type, e) {
    var d = e.data || {}, ds = live.dataset;
    switch (ds.page) {
      case "fleet": return true;
      case "approvals": case "breakers": return type === "repair" || type === "breaker";
      case "repair":
        if (type === "repair") return String(d.repairId) === ds.liveRepair;
        return type !== "breaker" && e.cluster === ds.liveCluster && e.node === ds.liveNode;
      case "node": return type !== "breaker" && e.cluster === ds.liveCluster && e.node === ds.liveNode;
    }
    return false;
  }

  var timer = null, stale = false, last = 0;
  // refresh re-reads the page once, soon: 100 ms after the first event of
  // a burst, and at most twice a second while events keep coming (a storm
  // of changes costs each open page two re-reads a second, not one each).
  function refresh() {
    if (timer) return;
    var wait = Math.max(100, 500 - (Date.now() - last));
    timer = setTimeout(function () {
      timer = null;
      last = Date.now();
      var live = document.getElementById("live");
      if (!live || !live.getAttribute("hx-get") || typeof htmx === "undefined") return;
      if (busy(live)) { stale = true; return; }
      stale = false;
      htmx.trigger(live, "fr:event");
    }, wait);
  }
  // A re-read skipped while busy happens once the form is left.
  document.addEventListener("focusout", function () { if (stale) setTimeout(refresh, 0); });
  document.addEventListener("change", function () { if (stale) setTimeout(refresh, 0); });

  var es = null;
  function status(text, cls) {
    var s = document.getElementById("stream");
    if (!s) return;
    s.hidden = false; s.textContent = text; s.className = "stream " + cls;
  }
  function connect() {
    var live = document.getElementById("live");
    if (es && (!live || !live.dataset.events)) {
      // Left the live pages (logged out, an error page): stop following.
      es.close(); es = null;
      return;
    }
    if (es || !live || !live.dataset.events || typeof EventSource === "undefined") return;
    var mine = es = new EventSource(live.dataset.events);
    es.onopen = function () { status("live", "stream-on"); };
    es.onerror = function () {
      if (mine.readyState !== EventSource.CLOSED) { status("reconnecting", "stream-off"); return; }
      // Refused (the login ended): the next page opens a new stream.
      status("offline", "stream-off");
      if (es === mine) es = null;
    };
    ["repair", "diagnosis", "breaker", "node"].forEach(function (type) {
      es.addEventListener(type, function (m) {
        var l = document.getElementById("live");
        var e;
        try { e = JSON.parse(m.data); } catch (err) { return; }
        if (l && concerns(l, type, e)) refresh();
      });
    });
    // Too far behind to replay: what the page shows may be stale.
    es.addEventListener("reset", refresh);
  }
  // One stream per document: boosted navigation keeps it (and this
  // script); a page reached first without a stream opens it.
  document.addEventListener("DOMContentLoaded", connect);
  document.addEventListener("htmx:afterSettle", connect);
})();
