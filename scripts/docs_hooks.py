"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

* every ``docs/guide/*.md`` the nav does not list yet joins the Guides section (a new guide appears
  without an edit here);
* the tour is written by ``liepos.tour.page.tour(...)`` (one file) and added to the site as
  ``tour/index.html``, one self-contained page (``$LIEPOS_DOCS_TOUR_DPI`` sets its figures' resolution,
  default 80).
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
