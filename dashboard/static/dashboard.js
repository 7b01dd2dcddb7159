// pgworker dashboard: keeps the page's live part current from the server's
// event stream, sizes the progress bars, draws the chart. No inline script:
// the Content-Security-Policy allows only this file and the vendored ones.
(function () {
  "use strict";

  var body = document.body;
  var live = document.getElementById("live");
  var conn = document.getElementById("conn");
  var chart = null;
  var lastHTML = null;
  var hadBanner = !!document.getElementById("banner");

  // The bar segments carry their width in data-w (percent): inline style
  // attributes are forbidden by the page's policy.
  function sizeBars(root) {
    var segs = root.querySelectorAll(".seg[data-w]");
    for (var i = 0; i < segs.length; i++) {
      segs[i].style.width = segs[i].getAttribute("data-w") + "%";
    }
  }

  function setConn(state, text) {
    if (!conn) return;
    conn.className = "conn conn-" + state;
    conn.textContent = text;
  }

  function drawChart(data) {
    var el = document.getElementById("chart");
    if (!el || typeof uPlot === "undefined" || !data) return;
    var rows = [data.x, data.done, data.failed];
    if (chart) {
      chart.setData(rows);
      return;
    }
    var width = Math.max(300, el.clientWidth || 600);
    chart = new uPlot({
      width: width,
      height: 180,
      scales: { x: { time: true }, y: { range: function (u, lo, hi) { return [0, Math.max(1, hi)]; } } },
      series: [
        {},
        { label: "done", stroke: "#2f855a", fill: "rgba(47,133,90,0.15)", width: 2 },
        { label: "failed", stroke: "#c53030", fill: "rgba(197,48,48,0.12)", width: 2 }
      ],
      axes: [{}, { label: "per minute" }]
    }, rows, el);
    window.addEventListener("resize", function () {
      chart.setSize({ width: Math.max(300, el.clientWidth), height: 180 });
    });
  }

  function onSnapshot(msg) {
    var ev;
    try {
      ev = JSON.parse(msg.data);
    } catch (e) {
      return;
    }
    setConn(ev.ok ? "ok" : "down", ev.ok ? "live" : "database down");
    if (body.hasAttribute("data-reload-on-recovery") && hadBanner && ev.ok) {
      // The database answers again: load the page anew, at most every few
      // seconds should the page itself keep failing.
      var last = Number(window.sessionStorage.getItem("pgwReloadedAt") || 0);
      if (Date.now() - last > 5000) {
        window.sessionStorage.setItem("pgwReloadedAt", String(Date.now()));
        window.location.reload();
        return;
      }
    }
    if (ev.html !== lastHTML && !body.hasAttribute("data-reload-on-recovery")) {
      live.innerHTML = ev.html;
      lastHTML = ev.html;
      sizeBars(live);
    }
    live.setAttribute("data-gen", String(ev.gen));
    if (ev.chart) drawChart(ev.chart);
  }

  function connect(page, node) {
    if (typeof EventSource === "undefined") return;
    var url = "/events?page=" + encodeURIComponent(page);
    if (node) url += "&node=" + encodeURIComponent(node);
    var es = new EventSource(url);
    es.addEventListener("snapshot", onSnapshot);
    es.addEventListener("open", function () { setConn("ok", "live"); });
    es.addEventListener("error", function () { setConn("down", "reconnecting"); });
  }

  function selectAll() {
    var all = document.getElementById("select-all");
    if (!all) return;
    all.addEventListener("change", function () {
      var boxes = document.querySelectorAll('.rows input[type="checkbox"][name="id"]');
      for (var i = 0; i < boxes.length; i++) boxes[i].checked = all.checked;
    });
  }

  sizeBars(document);
  selectAll();
  var page = body.getAttribute("data-live");
  if (page) connect(page, body.getAttribute("data-node"));
})();
