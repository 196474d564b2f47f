// The tour's playground: select the setting the sliders name and draw what liepos computed for it.
// Every number comes from the JSON in <script id="pg-data"> (liepos.tour.playground); nothing is computed
// here but pixel positions. Each drawn curve is an SVG <polyline class="series"> that carries its own
// mapping (data-xmin … data-bottom, data-log) so a test can read the numbers back from the pixels.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("pg-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var W = 300, H = 220, M = { left: 56, right: 10, top: 10, bottom: 34 };
  var SLIDERS = ["rate", "freq", "size", "coupling", "lags"];

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, anchor, extra) {
    var t = el("text", Object.assign({ x: x, y: y, "text-anchor": anchor || "middle", "font-size": 11 }, extra || {}), parent);
    t.textContent = s;
    return t;
  }
  function fmt(v) {
    var a = Math.abs(v);
    return a === 0 ? "0" : (a >= 1e4 || a < 1e-2) ? v.toExponential(0) : String(+v.toPrecision(3));
  }
  function ticks(lo, hi) {  // about five round ticks in [lo, hi]
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / 4)));
    if ((hi - lo) / step > 10) step *= 2;
    if ((hi - lo) / step > 10) step *= 2.5;
    var out = [];
    for (var i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) out.push(+(i * step).toPrecision(6));
    return out;
  }

  // a line plot of (xs, ys) into the <svg id=id>, optional log-y, optional fixed ranges
  function plot(id, xs, ys, o) {
    var svg = document.getElementById(id);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var Y = o.logy ? ys.map(function (v) { return Math.log10(Math.max(v, 1e-30)); }) : ys;
    var x0 = o.xr ? o.xr[0] : Math.min.apply(null, xs), x1 = o.xr ? o.xr[1] : Math.max.apply(null, xs);
    var y0 = o.yr ? o.yr[0] : Math.min.apply(null, Y), y1 = o.yr ? o.yr[1] : Math.max.apply(null, Y);
    if (o.logy) { y0 = Math.floor(y0 - 0.05); y1 = Math.ceil(y1 + 0.05); }  // whole decades
    if (y1 - y0 < 1e-9) { y0 -= 1; y1 += 1; }
    if (x1 - x0 < 1e-9) { x0 -= 1; x1 += 1; }
    var L = M.left, R = W - M.right, T = M.top, B = H - M.bottom;
    if (o.square) {  // equal scales on both axes, so a circle is drawn round
      var side = Math.min(R - L, B - T);
      L += (R - L - side) / 2; R = L + side; B = T + side;
    }
    function px(x) { return L + (x - x0) / (x1 - x0) * (R - L); }
    function py(y) { return B - (y - y0) / (y1 - y0) * (B - T); }
    el("rect", { x: L, y: T, width: R - L, height: B - T, fill: "none", stroke: "#999" }, svg);
    ticks(x0, x1).forEach(function (v) {
      el("line", { x1: px(v), x2: px(v), y1: B, y2: B + 4, stroke: "#666" }, svg);
      text(svg, px(v), B + 15, fmt(v));
    });
    (o.logy ? ticks(y0, y1).filter(Number.isInteger) : ticks(y0, y1)).forEach(function (v) {
      el("line", { x1: L - 4, x2: L, y1: py(v), y2: py(v), stroke: "#666" }, svg);
      el("line", { x1: L, x2: R, y1: py(v), y2: py(v), stroke: "#eee" }, svg);
      text(svg, L - 6, py(v) + 4, o.logy ? "1e" + v : fmt(v), "end");
    });
    text(svg, (L + R) / 2, H - 4, o.xlabel);
    text(svg, 10, (T + B) / 2, o.ylabel, "middle", { transform: "rotate(-90 10 " + (T + B) / 2 + ")" });
    var pts = xs.map(function (x, i) { return px(x).toFixed(2) + "," + py(Y[i]).toFixed(2); }).join(" ");
    el("polyline", {
      "class": "series", points: pts, fill: "none", stroke: o.color, "stroke-width": 2,
      "data-xmin": x0, "data-xmax": x1, "data-ymin": y0, "data-ymax": y1, "data-log": o.logy ? "y" : "",
      "data-left": L, "data-right": R, "data-top": T, "data-bottom": B
    }, svg);
    if (o.start) el("circle", { cx: px(xs[0]), cy: py(Y[0]), r: 4, fill: "white", stroke: "black" }, svg);
    return svg;
  }

  function spectrum(eig, rowWord) {
    var svg = document.getElementById("pg-spectrum");
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var r = D.grid.rate, w = D.grid.freq;
    var xr = [r[0] * 1.15, r[r.length - 1] * 1.6], yr = [-w[w.length - 1] * 1.2, w[w.length - 1] * 1.2];
    var L = M.left, R = W - M.right, T = M.top, B = H - M.bottom;
    function px(x) { return L + (x - xr[0]) / (xr[1] - xr[0]) * (R - L); }
    function py(y) { return B - (y - yr[0]) / (yr[1] - yr[0]) * (B - T); }
    el("rect", { x: px(0), y: T, width: R - px(0), height: B - T, fill: D.colors.growth, opacity: 0.08 }, svg);
    el("rect", { x: L, y: T, width: R - L, height: B - T, fill: "none", stroke: "#999" }, svg);
    el("line", { x1: px(0), x2: px(0), y1: T, y2: B, stroke: "#333" }, svg);
    el("line", { x1: L, x2: R, y1: py(0), y2: py(0), stroke: "#bbb" }, svg);
    ticks(xr[0], xr[1]).forEach(function (v) { text(svg, px(v), B + 15, fmt(v)); });
    [yr[0], 0, yr[1]].forEach(function (v) { text(svg, L - 6, py(v) + 4, fmt(v), "end"); });
    text(svg, (L + R) / 2, H - 4, "rate λ (fate)");
    text(svg, 10, (T + B) / 2, "frequency ω (rhythm)", "middle", { transform: "rotate(-90 10 " + (T + B) / 2 + ")" });
    eig.forEach(function (e) {
      var c = D.colors[e.row];
      [e.freq, -e.freq].forEach(function (f) {
        el("circle", { "class": "eig", cx: px(e.rate), cy: py(f), r: 4 + 2 * e.size, fill: c, stroke: "black",
                       "data-rate": e.rate, "data-freq": f, "data-row": e.row }, svg);
      });
      var label = text(svg, px(e.rate) + 10, py(e.freq) - 10, D.labels[e.row] + (e.size > 1 ? " (size " + e.size + ")" : ""),
                       "start", { fill: c, "font-weight": "bold" });
      var over = px(e.rate) + 10 + label.getComputedTextLength() - (R - 2);
      if (over > 0) label.setAttribute("x", Math.max(L + 2, px(e.rate) + 10 - over));  // keep it inside the plane
    });
  }

  function table(rows) {
    var t = document.getElementById("pg-table");
    var lim = 1e-12;
    rows.forEach(function (r) { r.forEach(function (v) { lim = Math.max(lim, Math.abs(v)); }); });
    var html = "<tr><th>t \\ s</th>";
    for (var s = 0; s < D.table_size; s++) html += "<th>" + s + "</th>";
    html += "</tr>";
    rows.forEach(function (r, t) {
      html += "<tr><th>" + t + "</th>";
      for (var s = 0; s < D.table_size; s++) {
        if (s > t) { html += "<td class='fut'></td>"; continue; }
        var v = r[s], a = Math.min(1, Math.abs(v) / lim);
        var rgb = v >= 0 ? [255, Math.round(255 - 150 * a), Math.round(255 - 190 * a)] : [Math.round(255 - 190 * a), Math.round(255 - 120 * a), 255];
        html += "<td style='background:rgb(" + rgb.join(",") + ")' title='" + v + "'>" + fmt(v) + "</td>";
      }
      html += "</tr>";
    });
    t.innerHTML = html;
  }

  function value(name) { return D.grid[name][+document.getElementById("pg-" + name).value]; }

  function key() {
    var size = value("size");
    var c = size === 1 ? D.grid.coupling.indexOf(D.canonical_coupling) : +document.getElementById("pg-coupling").value;
    return [+document.getElementById("pg-rate").value, +document.getElementById("pg-freq").value,
            D.grid.size.indexOf(size), c].join("_");
  }

  function draw() {
    SLIDERS.forEach(function (n) { document.getElementById("pg-" + n + "-v").textContent = value(n); });
    document.getElementById("pg-coupling").disabled = value("size") === 1;
    var s = D.settings[key()], lags = value("lags");
    var n = Math.round(lags / D.lag_step) + 1;
    var us = [];
    for (var i = 0; i < n; i++) us.push(i * D.lag_step);
    var rowWord = s.eig.map(function (e) { return e.row; })[0];
    var color = D.colors[rowWord];
    var x = s.x.slice(0, n), y = s.y.slice(0, n);
    var lim = Math.max.apply(null, x.concat(y).map(Math.abs)) * 1.1 || 1;
    plot("pg-traj", x, y, { xr: [-lim, lim], yr: [-lim, lim], color: color, start: true, square: true,
                            xlabel: "coordinate 1 of A(u)v", ylabel: "coordinate 2" });
    plot("pg-norm", us, s.norm.slice(0, n), { logy: true, color: color, xlabel: "lag u (tokens)", ylabel: "‖A(u)‖ (log)" });
    plot("pg-score", us, s.score.slice(0, n), { color: color, xlabel: "lag t − s (tokens)", ylabel: "score vᵀA(t−s)v" });
    spectrum(s.eig, rowWord);
    table(s.table);
    document.getElementById("pg-row").innerHTML = "row: <b style='color:" + color + "'>" + D.labels[rowWord] +
      "</b> (" + D.pictures[rowWord] + ")";
    document.getElementById("pg").setAttribute("data-key", key());
  }

  function preset(name) {
    var p = D.presets[name];
    ["rate", "freq", "size", "coupling"].forEach(function (k) {
      document.getElementById("pg-" + k).value = D.grid[k].indexOf(p[k]);
    });
    draw();
  }

  SLIDERS.forEach(function (n) {
    var s = document.getElementById("pg-" + n);
    s.addEventListener("input", function () { document.getElementById("pg-preset").value = ""; draw(); });
  });
  document.getElementById("pg-preset").addEventListener("change", function (e) { if (e.target.value) preset(e.target.value); });
  preset(document.getElementById("pg-preset").value);
})();
