// fleetrepair dashboard: the few lines htmx does not do declaratively.
// Live pages poll themselves (hx-trigger="every ..." on <main id="live">);
// a poll is skipped while the on-call is typing a reason or has one half
// written (or has unticked a repair of a bulk approval), so a refresh never wipes what they typed.
document.addEventListener("htmx:beforeRequest", function (evt) {
  var live = document.getElementById("live");
  if (!live || evt.detail.elt !== live) return;
  var busy = live.querySelector("form :focus") || live.querySelector("input[type=checkbox]:not(:checked)") ||
    Array.prototype.some.call(live.querySelectorAll("input[type=text]"), function (e) { return e.value !== ""; });
  if (busy) evt.preventDefault();
});
