/* Bar charts from JSON the page embeds with Django's json_script:
 *   <canvas data-chart="ID"></canvas>  +  <script id="ID" type="application/json">{spec}</script>
 * spec: {title, labels, datasets: [{label, data, color, colors?, stack?}], stacked, notes, unit}
 * (built by quotas/views.py bar_chart()). Every chart's numbers are also in a table on the page,
 * so nothing is lost without this file or Chart.js (static/vendor/chart.umd.min.js). */
(function () {
  "use strict";

  function render(canvas) {
    if (!window.Chart || canvas.getAttribute("data-rendered")) return;
    var source = document.getElementById(canvas.getAttribute("data-chart"));
    if (!source) return;
    var spec = JSON.parse(source.textContent);
    var notes = spec.notes || [];
    var datasets = spec.datasets.map(function (d) {
      var colour = d.colors || d.color;
      return {
        label: d.label, data: d.data, stack: d.stack || d.label,
        backgroundColor: colour, borderColor: colour, borderWidth: 1, maxBarThickness: 48
      };
    });
    new window.Chart(canvas, {
      type: spec.type || "bar",
      data: { labels: spec.labels, datasets: datasets },
      options: {
        responsive: true,
        maintainAspectRatio: false,
        animation: false,
        scales: {
          x: { stacked: !!spec.stacked },
          y: { stacked: !!spec.stacked, beginAtZero: true, title: { display: !!spec.unit, text: spec.unit || "" } }
        },
        plugins: {
          legend: { position: "bottom" },
          tooltip: {
            callbacks: {
              footer: function (items) { return items.length ? (notes[items[0].dataIndex] || "") : ""; }
            }
          }
        }
      }
    });
    canvas.setAttribute("data-rendered", "true");
  }

  function renderAll() {
    document.querySelectorAll("canvas[data-chart]").forEach(render);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", renderAll);
  } else {
    renderAll();
  }
})();
