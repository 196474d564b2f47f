"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

* every ``docs/guide/*.md`` the nav does not list yet joins the Guides section (a new guide appears
  without an edit here);
* the tour is written by ``liepos.tour.page.tour(...)`` (one file) and added to the site as
  ``tour/index.html``, one self-contained page (``$LIEPOS_DOCS_TOUR_DPI`` sets its figures' resolution,
  default 80);
* search works from disk: the built search index is also written as a script
  (``search/search_index.js``), and opened from ``file://`` the search runs in the page (a browser
  refuses a web worker and a JSON request to a ``file://`` page), served it runs in mkdocs' worker.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

GUIDES = "Guides"
DEFAULT_DPI = 80  # the tour inside the docs: lighter figures than `liepos tour`'s 100 dpi


def on_config(config):
    docs = Path(config["docs_dir"])
    listed = set()
    guides = None
    for item in config["nav"]:
        if isinstance(item, dict) and GUIDES in item:
            guides = item[GUIDES]
        for value in (item.values() if isinstance(item, dict) else [item]):
            for sub in value if isinstance(value, list) else [value]:
                listed.update(sub.values() if isinstance(sub, dict) else [sub])
    for path in sorted((docs / "guide").glob("*.md")):
        rel = path.relative_to(docs).as_posix()
        if guides is not None and rel not in listed:
            guides.append({path.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip(): rel})
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    from liepos.tour.page import tour

    dpi = int(os.environ.get("LIEPOS_DOCS_TOUR_DPI", DEFAULT_DPI))
    with tempfile.TemporaryDirectory(prefix="liepos-docs-tour-") as tmp:
        written = tour(Path(tmp) / "tour.html", dpi=dpi, quiet=True)
        if written.failed:
            raise RuntimeError(f"the tour's measured identities over their bounds: {written.failed}")
        html = written.index.read_text(encoding="utf-8")
    files.append(File.generated(config, "tour/index.html", content=html))
    return files


# appended to mkdocs' search/main.js: from file:// (no worker, no XMLHttpRequest) lunr runs in the page
DISK_SEARCH = """
function lieposLoad(src, next) {
  var s = document.createElement("script");
  s.src = joinUrl(base_url, src); s.onload = next;
  document.head.appendChild(s);
}
if (LIEPOS_FROM_DISK) {
  lieposLoad("search/lunr.js", function () { lieposLoad("search/search_index.js", function () {
    var data = window.LIEPOS_SEARCH_INDEX, documents = {};
    if (data.config && data.config.separator) lunr.tokenizer.separator = new RegExp(data.config.separator);
    var index = lunr(function () {
      this.field("title"); this.field("text"); this.ref("location");
      for (var i = 0; i < data.docs.length; i++) { this.add(data.docs[i]); documents[data.docs[i].location] = data.docs[i]; }
    });
    window.search = function (query) {
      return index.search(query).map(function (r) {
        var doc = documents[r.ref]; doc.summary = doc.text.substring(0, 200); return doc;
      });
    };
    min_search_length = data.config.min_search_length - 1;
    initSearch();
  }); });
}
"""


def on_post_build(config):
    """Make the built search work from disk (see the module docstring)."""
    search = Path(config["site_dir"]) / "search"
    if not (search / "main.js").exists():
        return
    index = (search / "search_index.json").read_text(encoding="utf-8")
    (search / "search_index.js").write_text("window.LIEPOS_SEARCH_INDEX = " + index + ";\n", encoding="utf-8")
    main = (search / "main.js").read_text(encoding="utf-8")
    if "LIEPOS_FROM_DISK" in main:
        return
    main = main.replace("if (!window.Worker) {", "if (!window.Worker || LIEPOS_FROM_DISK) {")
    # mkdocs' own loader (a worker, or jQuery's request for worker.js) runs only when served
    main = main.replace("if (!window.Worker || LIEPOS_FROM_DISK) {\n  console.log('Web Worker API not supported');",
                        "if (LIEPOS_FROM_DISK) {\n  // search_index.js and lunr.js: see the end of this file\n"
                        "} else if (!window.Worker) {\n  console.log('Web Worker API not supported');")
    (search / "main.js").write_text("var LIEPOS_FROM_DISK = location.protocol === 'file:';\n" + main + DISK_SEARCH,
                                    encoding="utf-8")
