/* Times in the reader's time zone: every <time datetime="..."> is shown with the browser's zone (Intl), and
 * keeps the clock it comes from ("portal time" or "cluster time", data-clock) in its tooltip. Without this
 * file the server's UTC text stays. New content (htmx swaps, followed log lines) is formatted as it arrives. */
(function () {
  "use strict";

  var zone = (Intl.DateTimeFormat().resolvedOptions() || {}).timeZone || "UTC";
  var withDate = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit",
    hour12: false, timeZoneName: "short"
  });

  function format(el) {
    if (el.hasAttribute("data-local")) return;
    var value = el.getAttribute("datetime");
    if (!value) return;
    var when = new Date(value);
    if (isNaN(when.getTime())) return;
    el.textContent = withDate.format(when);
    el.setAttribute("data-local", zone);
    var clock = el.getAttribute("data-clock");
    el.title = (clock ? clock + " time" : "") + (clock ? ", " : "") + "shown in " + zone + "; " + value;
  }

  function formatAll(root) {
    if (root.matches && root.matches("time[datetime]")) format(root);
    if (root.querySelectorAll) root.querySelectorAll("time[datetime]").forEach(format);
  }

  function start() {
    formatAll(document);
    new MutationObserver(function (changes) {
      changes.forEach(function (change) {
        change.addedNodes.forEach(function (node) { if (node.nodeType === 1) formatAll(node); });
      });
    }).observe(document.body, { childList: true, subtree: true });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
