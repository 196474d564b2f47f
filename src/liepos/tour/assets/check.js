// marks images that failed to load, for scripts/check_report.py (headless Chromium) and for readers
window.addEventListener("load", function () {
  var imgs = document.images, bad = [];
  for (var i = 0; i < imgs.length; i++) {
    if (!(imgs[i].complete && imgs[i].naturalWidth > 0)) {
      bad.push((imgs[i].getAttribute("src") || "").slice(0, 80));
      imgs[i].insertAdjacentHTML("afterend", "<p class='note'>image failed to load</p>");
    }
  }
  var d = document.createElement("div");
  d.id = "img-check"; d.hidden = true;
  d.setAttribute("data-total", imgs.length);
  d.setAttribute("data-broken", bad.length);
  d.setAttribute("data-broken-src", bad.join(" "));
  document.body.appendChild(d);
});
