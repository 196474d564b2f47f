// The tour's playground: the reader's own X, evaluated here in float64 from the closed forms.
// X is a sum of blocks (rate λ, frequency ω, size n, coupling c); block by block, with m = j − i >= 0,
//   A(u)[i, j] = e^{λu} (cu)^m / m! · R(ωu),   R(θ) = [[cos θ, sin θ], [−sin θ, cos θ]]  (1 for a real block)
// (liepos.tour.playground). Nothing here is looked up from a grid: the JSON in <script id="pg-data"> holds
// only the presets, liepos's A(u) for each preset (the page prints its distance to them) and YaRN's ratios
// from liepos.scaling.yarn. Each curve is an SVG <polyline class="series"> that carries its own mapping
// (data-xmin … data-bottom, data-log) so a test can read the numbers back from the pixels; every number of
// A(u) is in the data-v attribute of its cell, as JavaScript prints the float64 (round-trip exact).
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("pg-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var M = { left: 52, right: 10, top: 10, bottom: 34 };
  var $ = function (id) { return document.getElementById(id); };

  // ------------------------------------------------------------------ X: parse, classify, exp(uX)
  function parseX(text) {  // "(λ, ω, n[, c]) + …" -> blocks, or throws a message naming the bad block
    var pieces = text.split("+"), blocks = [];
    pieces.forEach(function (piece) {
      var s = piece.trim().replace(/^\(/, "").replace(/\)$/, "");
      var nums = s.split(",").map(function (p) { return p.trim() === "" ? NaN : Number(p); });
      var bad = nums.length < 3 || nums.length > 4 || nums.some(function (v) { return !isFinite(v); }) ||
        !Number.isInteger(nums[2]) || nums[2] < 1 || nums[2] > 6;
      if (bad) throw "a block is (rate, frequency, size 1–6[, coupling]), got " + JSON.stringify(piece.trim());
      var c = nums.length === 4 ? nums[3] : 1;
      if (c === 0 && nums[2] > 1) throw "a coupling must be non-zero, got 0 in " + JSON.stringify(piece.trim());
      blocks.push({ rate: nums[0], freq: nums[1], size: nums[2], coupling: c, complex: nums[1] !== 0 });
    });
    var dim = blocks.reduce(function (a, b) { return a + b.size * (b.complex ? 2 : 1); }, 0);
    if (dim > 24) throw "X is " + dim + " × " + dim + ": keep it to 24 dims or fewer here";
    return blocks;
  }
  function rowOf(b) {  // liepos.classification.row_of: the sign of the rate, whether ω ≠ 0, the size
    if (b.rate > 0) return "growth";
    if (b.size >= 2) return "polynomial";
    if (b.freq !== 0) return b.rate === 0 ? "rotation" : "damped_rotation";
    return b.rate === 0 ? "nope" : "decay";
  }
  function dimOf(blocks) { return blocks.reduce(function (a, b) { return a + b.size * (b.complex ? 2 : 1); }, 0); }
  function expX(blocks, u) {  // A(u) = exp(uX), dense (d × d), float64
    var d = dimOf(blocks), A = [], o = 0, i, j;
    for (i = 0; i < d; i++) { A.push(new Array(d).fill(0)); }
    blocks.forEach(function (b) {
      var g = Math.exp(b.rate * u), w = b.complex ? 2 : 1, cu = b.coupling * u, th = b.freq * u;
      var cs = Math.cos(th), sn = Math.sin(th);
      for (i = 0; i < b.size; i++) {
        var coef = g, f = 1;
        for (j = i; j < b.size; j++) {
          var m = j - i;
          if (m > 0) { f *= m; coef = g * Math.pow(cu, m) / f; }
          if (w === 1) { A[o + i][o + j] = coef; continue; }
          var r = o + 2 * i, c = o + 2 * j;
          A[r][c] = coef * cs; A[r][c + 1] = coef * sn; A[r + 1][c] = -coef * sn; A[r + 1][c + 1] = coef * cs;
        }
      }
      o += b.size * w;
    });
    return A;
  }
  function planeStarts(blocks) {  // canonical first dims of the rotation planes
    var out = [], o = 0;
    blocks.forEach(function (b) {
      for (var i = 0; i < b.size; i++) { if (b.complex) { out.push(o); o += 2; } else { o += 1; } }
    });
    return out;
  }
  function storageOrder(blocks, layout) {  // liepos.tables.storage_order: perm[c] = storage index of dim c
    var d = dimOf(blocks), perm = [], c;
    for (c = 0; c < d; c++) perm.push(layout === "half" ? -1 : c);
    if (layout !== "half") return perm;
    var xs = planeStarts(blocks), P = xs.length, nxt = 2 * P;
    xs.forEach(function (c0, k) { perm[c0] = k; perm[c0 + 1] = k + P; });
    for (c = 0; c < d; c++) if (perm[c] < 0) { perm[c] = nxt; nxt += 1; }
    return perm;
  }
  function matvec(A, v) { return A.map(function (row) { return row.reduce(function (s, a, j) { return s + a * v[j]; }, 0); }); }
  function dot(a, b) { return a.reduce(function (s, x, i) { return s + x * b[i]; }, 0); }
  function transpose(A) { return A[0].map(function (_, j) { return A.map(function (row) { return row[j]; }); }); }
  function vec(d, seed) {  // a fixed vector of norm 1 (a small linear congruential generator: the same every load)
    var v = [], x = seed;
    for (var i = 0; i < d; i++) { x = (x * 16807) % 2147483647; v.push(x / 2147483647 - 0.5); }
    var n = Math.sqrt(dot(v, v));
    return v.map(function (a) { return a / n; });
  }
  function norm2(v) { return Math.sqrt(dot(v, v)); }

  // ------------------------------------------------------------------ drawing
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, anchor, extra) {
    var t = el("text", Object.assign({ x: x, y: y, "text-anchor": anchor || "middle", "font-size": 12 }, extra || {}), parent);
    t.textContent = s;
    return t;
  }
  function fmt(v) {
    var a = Math.abs(v);
    return a === 0 ? "0" : (a >= 1e4 || a < 1e-2) ? v.toExponential(1).replace("e+", "e") : String(+v.toPrecision(3));
  }
  function ticks(lo, hi, most) {  // round ticks in [lo, hi], at most `most` of them (labels never collide)
    var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / 4)));
    [2, 2.5, 2, 2, 2.5, 2].some(function (m) { if (span / step <= most) return true; step *= m; return false; });
    var out = [];
    for (var i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) out.push(+(i * step).toPrecision(6));
    return out;
  }
  function canvas(svg) {  // the svg redrawn at the width it is given (a phone gets a narrower, taller plot)
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var W = Math.max(220, Math.round(svg.getBoundingClientRect().width || 300)), H = Math.round(Math.min(260, W * 0.75));
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.setAttribute("height", H);
    return { W: W, H: H };
  }
  function plot(id, series, o) {  // line plots of [{xs, ys, color}] into the <svg id=id>
    var svg = $(id), size = canvas(svg), W = size.W, H = size.H;
    var all = series.map(function (s) { return o.logy ? s.ys.map(function (v) { return Math.log10(Math.max(Math.abs(v), 1e-300)); }) : s.ys; });
    var flatX = [].concat.apply([], series.map(function (s) { return s.xs; })), flatY = [].concat.apply([], all);
    flatY = flatY.filter(isFinite);
    var x0 = o.xr ? o.xr[0] : Math.min.apply(null, flatX), x1 = o.xr ? o.xr[1] : Math.max.apply(null, flatX);
    var y0 = o.yr ? o.yr[0] : Math.min.apply(null, flatY), y1 = o.yr ? o.yr[1] : Math.max.apply(null, flatY);
    if (o.logy) { y0 = Math.floor(y0 - 0.05); y1 = Math.ceil(y1 + 0.05); }
    if (!(y1 - y0 > 1e-9)) { y0 -= 1; y1 += 1; }
    if (!(x1 - x0 > 1e-9)) { x0 -= 1; x1 += 1; }
    var L = M.left, R = W - M.right, T = M.top, B = H - M.bottom;
    if (o.square) {
      var side = Math.min(R - L, B - T);
      L += (R - L - side) / 2; R = L + side; B = T + side;
    }
    function px(x) { return L + (x - x0) / (x1 - x0) * (R - L); }
    function py(y) { return B - (y - y0) / (y1 - y0) * (B - T); }
    if (o.bands) o.bands.forEach(function (b) {
      el("rect", { x: px(b[0]), y: T, width: Math.max(0, px(b[1]) - px(b[0])), height: B - T, fill: b[2], "class": "band",
                   "data-name": b[3] }, svg);
    });
    el("rect", { x: L, y: T, width: R - L, height: B - T, fill: "none", stroke: "#999" }, svg);
    ticks(x0, x1, Math.max(3, Math.floor((R - L) / 55))).forEach(function (v) {
      el("line", { x1: px(v), x2: px(v), y1: B, y2: B + 4, stroke: "#666" }, svg);
      text(svg, px(v), B + 16, fmt(v), "middle", { "class": "tick" });
    });
    var yt = ticks(y0, y1, Math.max(3, Math.floor((B - T) / 30)));
    (o.logy ? yt.filter(Number.isInteger) : yt).forEach(function (v) {
      el("line", { x1: L - 4, x2: L, y1: py(v), y2: py(v), stroke: "#666" }, svg);
      el("line", { x1: L, x2: R, y1: py(v), y2: py(v), stroke: "#eee" }, svg);
      text(svg, L - 6, py(v) + 4, o.logy ? "1e" + v : fmt(v), "end", { "class": "tick" });
    });
    text(svg, (L + R) / 2, H - 4, o.xlabel);
    text(svg, 12, (T + B) / 2, o.ylabel, "middle", { transform: "rotate(-90 12 " + (T + B) / 2 + ")" });
    series.forEach(function (s, k) {
      var pts = s.xs.map(function (x, i) { return px(x).toFixed(2) + "," + py(all[k][i]).toFixed(2); }).join(" ");
      el("polyline", {
        "class": "series", points: pts, fill: "none", stroke: s.color, "stroke-width": 2,
        "data-xmin": x0, "data-xmax": x1, "data-ymin": y0, "data-ymax": y1, "data-log": o.logy ? "y" : "",
        "data-left": L, "data-right": R, "data-top": T, "data-bottom": B
      }, svg);
      if (o.start) el("circle", { cx: px(s.xs[0]), cy: py(all[k][0]), r: 4, fill: "white", stroke: "black" }, svg);
    });
    return svg;
  }
  function heat(id, Z, o) {  // a heatmap of Z (rows × cols), NaN cells left blank; colour from o.color(v)
    var svg = $(id), size = canvas(svg), W = size.W, H = size.H;
    var n = Z.length, m = Z[0].length, side = Math.min(W - 20, H - 20), cw = side / m, ch = side / n;
    var x0 = (W - side) / 2, y0 = 4;
    Z.forEach(function (row, i) {
      row.forEach(function (v, j) {
        if (!isFinite(v)) return;
        el("rect", { x: (x0 + j * cw).toFixed(2), y: (y0 + i * ch).toFixed(2), width: (cw + 0.3).toFixed(2),
                     height: (ch + 0.3).toFixed(2), fill: o.color(v), "class": "cell", "data-v": v }, svg);
      });
    });
    if (o.caption) text(svg, W / 2, H - 3, o.caption);
  }
  function viridis(t) {  // 0 … 1 -> a perceptual ramp (dark blue to yellow)
    t = Math.max(0, Math.min(1, t));
    var stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    var x = t * 4, i = Math.min(3, Math.floor(x)), f = x - i, a = stops[i], b = stops[i + 1];
    return "rgb(" + a.map(function (v, k) { return Math.round(v + f * (b[k] - v)); }).join(",") + ")";
  }
  function diverging(v) {  // −1 … 1 -> blue, white, red
    v = Math.max(-1, Math.min(1, v));
    var r = v > 0 ? 255 : Math.round(255 * (1 + v)), b = v < 0 ? 255 : Math.round(255 * (1 - v));
    var g = Math.round(255 * (1 - Math.abs(v)));
    return "rgb(" + r + "," + g + "," + b + ")";
  }

  // ------------------------------------------------------------------ the panels
  var state = { blocks: null };

  function showRows(blocks) {
    var ul = $("pg-rows");
    ul.innerHTML = "";
    blocks.forEach(function (b, i) {
      var row = rowOf(b), li = document.createElement("li");
      li.setAttribute("data-row", row);
      li.style.borderLeft = "6px solid " + (D.colors[row] || "#333");
      li.textContent = "block " + (i + 1) + ": (" + b.rate + ", " + b.freq + ", " + b.size + ", " + b.coupling + ") → " +
        row + " (" + (D.pictures[row] || "") + ")";
      ul.appendChild(li);
    });
  }
  function showMatrix(A, perm) {  // A(u) in the chosen layout's storage order: S[perm[i]][perm[j]] = A[i][j]
    var d = A.length, S = [], i, j;
    for (i = 0; i < d; i++) S.push(new Array(d));
    for (i = 0; i < d; i++) for (j = 0; j < d; j++) S[perm[i]][perm[j]] = A[i][j];
    var inv = new Array(d);
    perm.forEach(function (s, c) { inv[s] = c; });
    var head = "<tr><th scope='col'>storage ← dim</th>" + inv.map(function (c) { return "<th scope='col'>" + c + "</th>"; }).join("") + "</tr>";
    var body = S.map(function (row, r) {
      return "<tr><th scope='row'>" + inv[r] + "</th>" + row.map(function (v) {
        return "<td class='n' data-v='" + String(v) + "'>" + (v === 0 ? "0" : v.toPrecision(4)) + "</td>";
      }).join("") + "</tr>";
    }).join("");
    $("pg-A").innerHTML = "<caption>A(u) at u = " + state.u + " (" + state.layout + " layout)</caption>" + head + body;
  }
  function showCheck() {  // the page's own A(u) against liepos's, for every preset
    var worst = 0;
    Object.keys(D.presets).forEach(function (name) {
      var A = expX(parseX(D.presets[name].text), D.check_u), B = D.presets[name].A;
      A.forEach(function (row, i) { row.forEach(function (v, j) { worst = Math.max(worst, Math.abs(v - B[i][j]) / Math.max(1, Math.abs(B[i][j]))); }); });
    });
    $("pg-check").textContent = "This page's A(" + D.check_u + ") for the " + Object.keys(D.presets).length +
      " presets against liepos's Generator.exp: largest difference " + worst.toExponential(1) + ".";
    $("pg-check").setAttribute("data-worst", worst);
  }

  function drawGroup() {
    var blocks = state.blocks, d = dimOf(blocks), span = state.lags, n = 161, us = [], i;
    for (i = 0; i < n; i++) us.push(span * i / (n - 1));
    var v = vec(d, 12345), traj = us.map(function (u) { return matvec(expX(blocks, u), v); });
    var xs = traj.map(function (p) { return p[0]; }), ys = traj.map(function (p) { return d > 1 ? p[1] : 0; });
    var lim = Math.max.apply(null, xs.concat(ys).map(Math.abs).filter(isFinite)) * 1.1 || 1;
    plot("pg-traj", [{ xs: xs, ys: ys, color: "#0072B2" }], { square: true, start: true, xr: [-lim, lim], yr: [-lim, lim],
      xlabel: "coordinate 1 of A(u)v", ylabel: "coordinate 2" });
    plot("pg-norm", [{ xs: us, ys: traj.map(norm2), color: "#CC79A7" }], { logy: true, xlabel: "lag u", ylabel: "|A(u)v| (log)" });
    var q = vec(d, 777), k = vec(d, 4242);
    plot("pg-score", [{ xs: us, ys: us.map(function (u) { return dot(q, matvec(expX(blocks, u), k)); }), color: "#009E73" }],
      { xlabel: "lag t − s", ylabel: "score qᵀA(t−s)k" });
  }
  function drawShift() {  // translation invariance: F(t)ᵀG(s) = A(t − s) with F(t) = A(t)ᵀ, G(s) = A(−s)
    var blocks = state.blocks, d = dimOf(blocks), q = vec(d, 777), k = vec(d, 4242);
    var t = +$("pg-t").value, s = +$("pg-s").value, sh = +$("pg-shift").value;
    function score(t, s) { return dot(matvec(transpose(expX(blocks, t)), q), matvec(expX(blocks, -s), k)); }
    var a = score(t, s), b = score(t + sh, s + sh);
    $("pg-t-v").textContent = t; $("pg-s-v").textContent = s; $("pg-shift-v").textContent = sh;
    $("pg-shift-out").innerHTML = "query at " + (t + sh) + ", key at " + (s + sh) + " (gap " + (t - s) + "): score <b>" +
      b.toPrecision(12) + "</b>; unshifted (" + t + ", " + s + "): " + a.toPrecision(12) + "; difference " +
      Math.abs(a - b).toExponential(1) + ".";
    $("pg-shift-out").setAttribute("data-a", a); $("pg-shift-out").setAttribute("data-b", b);
  }
  function drawAttention() {  // softmax over the causal half of qₜᵀA(t−s)kₛ/√d for T tokens
    var blocks = state.blocks, d = dimOf(blocks), T = 16, Z = [], t, s, A = {};
    for (t = 0; t < T; t++) {
      var qt = vec(d, 1000 + t), row = [], mx = -Infinity;
      for (s = 0; s <= t; s++) {
        A[t - s] = A[t - s] || expX(blocks, t - s);
        var z = dot(qt, matvec(A[t - s], vec(d, 5000 + s))) * 3 / Math.sqrt(d);
        row.push(z); mx = Math.max(mx, z);
      }
      var e = row.map(function (z) { return Math.exp(z - mx); }), tot = e.reduce(function (x, y) { return x + y; }, 0);
      Z.push(e.map(function (x) { return x / tot; }).concat(new Array(T - t - 1).fill(NaN)));
    }
    heat("pg-attn", Z, { color: viridis, caption: "weights: query t down, key s across (causal), T = " + T });
  }
  function drawMap() {  // 2-D similarity Σ_k cos(ω_k d_k·(x, y)) / P of two commuting axes
    var mode = $("pg-map-mode").value, P = 16, base = 100, n = 41, Z = [], dirs = [], freqs = [], k, i, j;
    var golden = Math.PI * (3 - Math.sqrt(5));
    for (k = 0; k < P; k++) {
      if (mode === "axial") {  // half the planes along x, half along y, each half a RoPE ladder
        var h = Math.floor(k / 2);
        freqs.push(Math.pow(base, -h / (P / 2))); dirs.push(k % 2 === 0 ? [1, 0] : [0, 1]);
      } else {  // golden gate: every plane its own direction, the golden angle apart
        freqs.push(Math.pow(base, -k / P)); dirs.push([Math.cos(k * golden), Math.sin(k * golden)]);
      }
    }
    for (i = 0; i < n; i++) {
      var row = [];
      for (j = 0; j < n; j++) {
        var x = j - (n - 1) / 2, y = (n - 1) / 2 - i, sum = 0;
        for (k = 0; k < P; k++) sum += Math.cos(freqs[k] * (dirs[k][0] * x + dirs[k][1] * y));
        row.push(sum / P);
      }
      Z.push(row);
    }
    heat("pg-map", Z, { color: diverging, caption: "key at (x, y), query at the centre; |x|, |y| ≤ 20" });
  }
  function drawScaling() {  // YaRN (Hugging Face's _compute_yarn_parameters): kept, ramp, interpolated planes
    var Y = D.yarn, s = +$("pg-factor").value, L0 = +$("pg-orig").value, dim = Y.dim, base = Y.base, half = dim / 2;
    $("pg-factor-v").textContent = s;
    function corr(rot) { return dim * Math.log(L0 / (rot * 2 * Math.PI)) / (2 * Math.log(base)); }
    var lo = Math.max(Math.floor(corr(Y.beta_fast)), 0), hi = Math.min(Math.ceil(corr(Y.beta_slow)), dim - 1);
    if (lo === hi) hi += 0.001;
    var ks = [], ratio = [];
    for (var k = 0; k < half; k++) {
      var ramp = Math.min(1, Math.max(0, (k - lo) / (hi - lo))), extrap = 1 - ramp;
      ks.push(k); ratio.push((1 - extrap) / s + extrap);
    }
    var bands = [[-0.5, lo, "#e4f4ea", "kept"], [lo, hi, "#fdf0d5", "ramp"], [hi, half - 0.5, "#e3eefa", "interpolated"]];
    plot("pg-scale", [{ xs: ks, ys: ratio, color: "#E69F00" }], { logy: true, bands: bands, xr: [-0.5, half - 0.5],
      xlabel: "plane k (fast → slow)", ylabel: "ω'/ω (log)" });
    $("pg-scale").setAttribute("data-ratio", JSON.stringify(ratio));
    var att = s > 1 ? 0.1 * Math.log(s) + 1 : 1;
    $("pg-temp").innerHTML = "Kept: planes 0–" + Math.max(0, Math.ceil(lo) - 1) + "; ramp: " + lo + "–" + Math.floor(hi) +
      "; interpolated (÷" + s + "): from " + Math.ceil(hi) + ". <b>Temperature, apart from the clocks</b>: " +
      "attention factor 0.1·ln s + 1 = " + att.toFixed(4) + ", so every logit is multiplied by its square, " +
      (att * att).toFixed(4) + " (liepos: <code>Encoding.logit_scale</code>).";
    $("pg-temp").setAttribute("data-logit-scale", att * att);
  }

  function update() {
    var box = $("pg-x"), err = $("pg-x-error");
    try {
      state.blocks = parseX(box.value);
    } catch (msg) {
      err.textContent = String(msg); box.setAttribute("aria-invalid", "true");
      return;
    }
    err.textContent = ""; box.removeAttribute("aria-invalid");
    state.u = +$("pg-u").value;
    if (!isFinite(state.u)) state.u = 0;
    state.lags = +$("pg-lags").value;
    $("pg-lags-v").textContent = state.lags;
    state.layout = document.querySelector("input[name='pg-layout']:checked").value;
    showRows(state.blocks);
    var perm = storageOrder(state.blocks, state.layout);
    showMatrix(expX(state.blocks, state.u), perm);
    $("pg-perm").textContent = "storage order of dims: " + perm.map(function (_, s) { return perm.indexOf(s); }).join(", ");
    drawGroup(); drawShift(); drawAttention();
  }

  var select = $("pg-preset");
  Object.keys(D.presets).forEach(function (name) {
    var o = document.createElement("option");
    o.value = name; o.textContent = name;
    select.appendChild(o);
  });
  select.addEventListener("change", function () {
    if (select.value) { $("pg-x").value = D.presets[select.value].text; update(); }
  });
  $("pg-x").addEventListener("input", function () { select.value = ""; update(); });
  ["pg-u", "pg-lags"].forEach(function (id) { $(id).addEventListener("input", update); });
  Array.prototype.forEach.call(document.querySelectorAll("input[name='pg-layout']"), function (r) { r.addEventListener("change", update); });
  ["pg-t", "pg-s", "pg-shift"].forEach(function (id) { $(id).addEventListener("input", drawShift); });
  $("pg-map-mode").addEventListener("change", drawMap);
  ["pg-factor", "pg-orig"].forEach(function (id) { $(id).addEventListener("input", drawScaling); });
  var resized = null;
  window.addEventListener("resize", function () {
    clearTimeout(resized);
    resized = setTimeout(function () { update(); drawMap(); drawScaling(); }, 100);
  });
  select.value = Object.keys(D.presets)[0];
  $("pg-x").value = D.presets[select.value].text;
  update(); drawMap(); drawScaling(); showCheck();
  window.liepos_playground = { parseX: parseX, expX: expX, rowOf: rowOf, storageOrder: storageOrder };
})();
