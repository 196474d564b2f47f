"""``liepos tour``: the seeds' argument walked on live numbers, written as a shareable HTML report.

Every number and picture in the report is computed by liepos when the tour runs
(:mod:`liepos._theory`), drawn by :mod:`liepos.plot`, and saved next to the page::

    OUT/index.html        the report (self-contained with --inline, else figures beside it)
    OUT/figures/*.png     one PNG per figure
    OUT/numbers.json      every figure's data and every measured error with its bound

>>> from liepos.report import SECTION_ORDER
>>> SECTION_ORDER[0], SECTION_ORDER[-1]
('attention', 'alibi')
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import platform
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any

from liepos import _theory as T

__all__ = ["tour", "configure", "run", "SECTION_ORDER", "FIGURES"]

SECTION_ORDER = tuple(T.SECTIONS)
# section -> figures (plot kinds) shown in it
FIGURES: dict[str, tuple[str, ...]] = {
    "attention": ("attention",),
    "group": ("group",),
    "rows": ("trajectories", "fate"),
    "lookup": ("lookup",),
    "clocks": ("clocks",),
    "spectrum": ("spectrum",),
    "scaling": ("scaling",),
    "precision": ("precision",),
    "alibi": ("alibi",),
}


# ---------------------------------------------------------------------- small helpers
def _clean(x: Any) -> Any:
    """JSON-safe copy: non-finite floats become None, tuples lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _e(x: Any) -> str:
    return html.escape(str(x))


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "—"
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits + 1}g}"


def _checks_table(errors: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, e in errors.items():
        ok = e.get("ok")
        mark = "—" if ok is None else ("✔ within bound" if ok else "✘ OVER BOUND")
        cls = "na" if ok is None else ("ok" if ok else "bad")
        rows.append(
            f"<tr class='{cls}'><td>{_e(name)}</td><td class='n'>{_num(e['value'])}</td>"
            f"<td class='n'>{_num(e.get('bound'))}</td><td>{mark}{(' — ' + _e(e['note'])) if e.get('note') else ''}</td></tr>"
        )
    return ("<table><thead><tr><th>measured</th><th>error</th><th>bound</th><th></th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _matrix(M: list[list[float]]) -> str:
    body = "".join("<tr>" + "".join(f"<td class='n'>{v:g}</td>" for v in row) + "</tr>" for row in M)
    return f"<table class='matrix'>{body}</table>"


def _note(text: str) -> str:
    return f"<p class='note'>⚠ {_e(text)}</p>"


# ---------------------------------------------------------------------- the words of each section
def _text_attention(d: dict[str, Any]) -> str:
    return f"""
<p>Inside an attention head each token brings a query and a key, and the score between query <i>t</i> and key
<i>s</i> is their dot product. Nothing in <code>q·k</code> says where the tokens sit: shuffle the sentence and the
same numbers land in other cells. Position enters in exactly one place: just before the dot product, the query is
transformed by <code>F(t)</code> and the key by <code>G(s)</code>, each knowing only its own position. Then the causal
mask hides future keys and the softmax turns scores into weights.</p>
<p>Below, one head of width {d['dim']} over {d['seq']} tokens with RoPE. The left panel is content alone, the middle
is the same vectors after liepos encodes them, the right the weights after masking. The encoded scores equal
<code>qᵀA(t−s)k/√d</code> built from the lags alone, and <code>liepos.attention</code> agrees with a hand-written
masked softmax:</p>{_checks_table(d['errors'])}"""


def _text_group(d: dict[str, Any]) -> str:
    rows = d["rows"]
    worst = max(e["value"] for r in rows.values() for e in r.values())
    return f"""
<p>Ask that the query transform and the key transform meet only through the gap, <code>F(t)ᵀG(s) = A(t−s)</code>,
that a zero gap changes nothing, and that A varies continuously. Then carrying a key forward by <i>u</i> and then by
<i>v</i> must equal carrying it by <i>u+v</i>: the matrices A(u) form a one-parameter group, and a classical theorem
says every such group is <code>A(u) = exp(uX)</code> for one generator X. liepos stores X in canonical blocks and
evaluates A(u) in closed form.</p>
<p>Here are the identities, measured for one generator of each row, for RoPE, xPos, a Jordan block, and for a
random dense 5×5 matrix taken apart by <code>Generator.from_matrix</code> and checked against
<code>torch.linalg.matrix_exp</code>. The transforms F and G are read off <code>Encoding.query</code> and
<code>Encoding.key</code> applied to basis vectors; the last column does it at positions near 10⁶, re-centred.
Worst error over all {sum(len(r) for r in rows.values())} checks: <b>{_num(worst)}</b>.</p>
<details><summary>every check, with its bound</summary>{_checks_table({f'{name}: {k}': v for name, r in rows.items() for k, v in r.items()} | {f'random X: {k}': v for k, v in d['random_X']['errors'].items()})}</details>"""


def _text_rows(d: dict[str, Any]) -> str:
    cards = []
    for name, r in d["rows"].items():
        counts = ", ".join(f"{k} = {v}" for k, v in r["classification"]["counts"].items() if v)
        ex_counts = ", ".join(f"{k} = {v}" for k, v in r["example"]["classification"]["counts"].items() if v)
        cl = f"<code>classify(X)</code>: {_e(counts)}<br><small>{_e(r['example']['encoding'])}: {_e(ex_counts)}</small>"
        norm = r["norm"]
        cards.append(
            f"<div class='card' style='border-top: 4px solid {_color(name)}'><h4 style='color:{_color(name)}'>"
            f"{_e(r['label'])}: {_e(r['picture'])}</h4>X = {_matrix(r['X'])}"
            f"<p>{cl}</p><p>|A(u)v| at u = 0, 10, 20: {_num(norm[0])}, {_num(norm[len(norm) // 2])}, {_num(norm[-1])}</p></div>"
        )
    return f"""
<p>Which generators are there? Up to a change of basis (which the network's weights absorb) X splits into blocks,
and each block's eigenvalue λ ± iω decides what it does to a key as the lag grows: the real part is its fate
(fade, hold, explode), the imaginary part its rhythm (how fast it turns), and a block without enough eigenvectors
adds a polynomial in the lag. That gives the seeds' table of six rows. Each panel follows one fixed vector
v = {tuple(d['vector'])} under A(u) for u from 0 to {d['lags'][-1]:g}: the circle of RoPE, the fade of decay, the
spiral of damped RoPE, the slide of ALiBi, the explosion of growth, and NoPE standing still.</p>
<div class='cards'>{''.join(cards)}</div>"""


def _text_lookup(d: dict[str, Any]) -> str:
    return f"""
<p>Lay the pairs out as a table, query time <i>t</i> down, key time <i>s</i> across. Every cell holds the
matrix A(t−s), so every diagonal holds the same matrix: {d['cells']} cells, only {d['distinct_A']} distinct
matrices. The heatmaps show one entry of A(t−s), then real encoded scores for a fixed query and key placed at every
pair of positions, for RoPE and for ALiBi (causal half). Their diagonals are constant to rounding. The last panel
is an absolute encoding (sinusoidal vectors added to q and k): the diagonals break, because the score now depends on
where the tokens are, not only on how far apart.</p>{_checks_table(d['diagonal_spread'])}"""


def _text_clocks(d: dict[str, Any]) -> str:
    we = d["worked_example"]
    rows = "".join(f"<tr><td>{p['t']}</td><td>{p['s']}</td><td>{p['gap']}</td><td class='n'>{p['score']:.12f}</td></tr>" for p in we["pairs"])
    planes = "".join(f"<tr><td>{p['k']}</td><td class='n'>{p['freq']:.5g}</td><td class='n'>{p['turn_every']:.4g}</td></tr>" for p in we["planes"])
    return f"""
<p>RoPE is the circle, many times over: the head is cut into planes, and plane <i>k</i> turns at its own speed
ω<sub>k</sub> = base<sup>−2k/d</sup>. One hand alone would confuse a gap with the gap plus a full turn; a bank of
hands at geometric speeds, from a turn every six tokens to one every tens of thousands, pins the gap down. The base
only stretches how slow the slowest hand gets. With the same unit vector in every plane the score is
Σ<sub>k</sub> cos(ω<sub>k</sub>(t−s)): it starts at the number of planes and wanders down as the gap grows, the
"long-term decay", faster for a small base.</p>
<p>The seeds' worked example (d = 16, base 10000, every plane (1, 0)): liepos encodes the query at <i>t</i> and the
key at <i>s</i> and takes the dot product. Gap 3 gives the seeds' 5.543 wherever the pair sits; gap 7 does not.</p>
<div class='two'><table><thead><tr><th>t</th><th>s</th><th>gap</th><th>score</th></tr></thead><tbody>{rows}</tbody></table>
<table><thead><tr><th>plane k</th><th>ω<sub>k</sub></th><th>full turn every (tokens)</th></tr></thead><tbody>{planes}</tbody></table></div>
{_checks_table(we['errors'])}"""


def _text_spectrum(d: dict[str, Any]) -> str:
    rows = []
    for name, e in d["entries"].items():
        cls = e["classification"]
        counts = ", ".join(f"{k} = {v}" for k, v in cls["counts"].items() if v)
        rows.append(f"<tr><td>{_e(name)}</td><td style='color:{_color(e['row'])}'>{_e(T.ROW_LABELS.get(e['row'], e['row']))}</td>"
                    f"<td>{len(e['points'])}</td><td>{_e(counts)}</td></tr>")
    return f"""
<p>Since only the eigenvalues survive a change of basis, an encoding is a cloud of points λ ± iω. Put the rate λ
(fate) across and the frequency ω (rhythm) up, and the catalogue becomes a map: RoPE is a column on λ = 0, xPos
and RetNet lean into the fading half, decay sits on the ω = 0 axis, NoPE and ALiBi's slide at the origin (the slide
is a size-2 block there), and the right half is growth, which liepos refuses unless asked. Built with head dim
{d['head_dim']} and {d['num_heads']} heads; one point per distinct block.</p>
<table><thead><tr><th>entry</th><th>row</th><th>distinct blocks</th><th><code>classify</code> counts</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"""


def _text_scaling(d: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{_e(k)}</td><td class='n'>{_num(d['after'][k][0])}</td>"
        f"<td class='n'>{_num(d['after'][k][-1])}</td><td class='n'>{_num(d['logit_scale'][k])}</td></tr>"
        for k in d["after"]
    )
    return f"""
<p>Context-extension tricks are not new encodings: they move the imaginary parts of the eigenvalues, slowing some
clocks so that a longer context fits in the turns the model saw in training. Linear interpolation slows every clock
by the factor; NTK-aware scaling keeps the fastest clock and slows the slowest by the factor, geometrically in
between; YaRN and Llama 3 keep the clocks that turn many times within the original context, slow the ones that never
complete a turn, and ramp in between (YaRN also raises the logit temperature). Shown for RoPE d = {d['dim']},
base {d['base']:g}, factor {d['factor']:g}, original context {d['original_max_position_embeddings']}, computed with
<code>liepos.scaling</code>.</p>
<table><thead><tr><th>map</th><th>fastest ω'</th><th>slowest ω'</th><th>logit scale</th></tr></thead><tbody>
<tr><td>before</td><td class='n'>{_num(d['before'][0])}</td><td class='n'>{_num(d['before'][-1])}</td><td class='n'>1</td></tr>{rows}</tbody></table>"""


def _text_precision(d: dict[str, Any]) -> str:
    if not d.get("available", True):
        return _note(d["note"] + " — this section is skipped.")
    return f"""
<p>A rotation by ω·t is only as good as the angle. A float32 pipeline (the frequency in float32, the position cast
to float32, the product and the cosine in float32, as in Hugging Face's rotary embedding) loses the angle as
positions grow: the product carries a relative error of about 10⁻⁷ times an angle of up to 10⁹ radians, and past
2²⁴ the position itself is rounded. liepos forms ω·t exactly in float64 (a Dekker product), reduces it modulo 2π
with a three-part constant, takes the cosine in float64 and only then casts to float32. Against a {40}-digit
mpmath reference with the exact frequency base<sup>−2k/d</sup>, at {len(d['positions'])} positions up to
2³¹ − 1 and four planes of RoPE d = {d['dim']}, base {d['base']:g}: the float32 pipeline reaches an error of
<b>{_num(d['float32_max_error'])}</b>; liepos stays at float32's own rounding.</p>{_checks_table(d['errors'])}"""


def _text_alibi(d: dict[str, Any]) -> str:
    cl = ", ".join(f"{k} = {v}" for k, v in d["classification"]["counts"].items() if v)
    return f"""
<p>ALiBi adds −m·(t−s) to each score and looks like it sits outside the family. It does not. Take the nilpotent
block N = [[0, 1], [0, 0]], whose exponential stops after two terms, exp(uN) = I + uN: the hockey puck, position
plus velocity times time. Give every query two constant slots (1, 0) and every key (0, −m): then
(1, 0)·exp((t−s)N)·(0, −m)ᵀ = −m(t−s), exactly ALiBi's bias, with no (seq × seq) bias matrix ever built.
liepos's <code>alibi({d['num_heads']}, {d['head_dim']})</code> does just that, one slope per head (Press et al.'s
geometric slopes {', '.join(f'{m:g}' for m in d['slopes'][:4])}, …).</p>
<div class='two'><div>N = {_matrix(d['N'])}</div><div>exp(3N) = {_matrix(d['exp_uN_at_u3'])}</div>
<div>query slots (head 0) = {d['query_slots'][0]}<br>key slots (head 0) = {d['key_slots'][0]}</div></div>
<p><code>classify(alibi)</code>: {_e(cl)}. The bias from the slots equals −m<sub>h</sub>(t−s), and
<code>liepos.attention</code> through the slots equals Press et al.'s attention with the explicit additive bias,
softmax(qᵀk/√d − m<sub>h</sub>(t−s)):</p>
{_checks_table(d['errors'])}"""


TEXT = {
    "attention": _text_attention, "group": _text_group, "rows": _text_rows, "lookup": _text_lookup,
    "clocks": _text_clocks, "spectrum": _text_spectrum, "scaling": _text_scaling,
    "precision": _text_precision, "alibi": _text_alibi,
}


def _color(row: str) -> str:
    from liepos.plot import ROW_COLORS

    return ROW_COLORS.get(row, "#333333")


CHECK_SCRIPT = """<script>
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
</script>
"""

CSS = """
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; max-width: 1180px;
       margin: 2em auto; padding: 0 1.2em; color: #222; line-height: 1.5; }
h1 { margin-bottom: 0.1em; } .sub { color: #555; margin-top: 0; }
h2 { border-bottom: 2px solid #ddd; padding-bottom: 0.2em; margin-top: 2.2em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #555; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.88em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.55em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-family: "DejaVu Sans Mono", Menlo, monospace; }
tr.ok td:last-child { color: #1a7f37; } tr.bad td { background: #ffe5e5; } tr.na td:last-child { color: #777; }
table.matrix { display: inline-table; vertical-align: middle; margin: 0.2em; }
table.matrix td { border: none; border-left: 1px solid #999; border-right: 1px solid #999; }
.cards { display: grid; grid-template-columns: repeat(3, 1fr); gap: 0.8em; }
.card { background: #fafafa; padding: 0.5em 0.8em; font-size: 0.9em; } .card h4 { margin: 0.2em 0; }
.two { display: flex; gap: 2em; flex-wrap: wrap; align-items: flex-start; }
.note { color: #8a5300; background: #fff6e0; padding: 0.3em 0.6em; }
nav a { margin-right: 0.8em; } code { background: #f3f3f3; padding: 0 0.2em; }
.summary { background: #f0f7f0; padding: 0.6em 1em; border-left: 4px solid #1a7f37; }
.summary.bad { background: #fff0f0; border-left-color: #b22222; }
"""


# ---------------------------------------------------------------------- the tour
def _progress(total: int, quiet: bool):
    """A tqdm bar on stderr when available, else plain lines."""
    if quiet:
        class _Q:
            def update(self, n=1): ...
            def set_description(self, s): ...
            def close(self): ...
        return _Q()
    try:
        from tqdm import tqdm

        return tqdm(total=total, file=sys.stderr, unit="step", bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]")
    except ImportError:
        class _P:
            n = 0

            def update(self, k=1):
                self.n += k

            def set_description(self, s):
                print(f"[{self.n + 1}/{total}] {s}", file=sys.stderr, flush=True)

            def close(self): ...
        return _P()


def tour(out: str | Path = "liepos-tour", *, inline: bool = False, dpi: int = 100, quiet: bool = False) -> Path:
    """Run every section, draw every figure, write ``index.html``, ``figures/`` and ``numbers.json``.

    Returns the path of ``index.html``.
    """
    from liepos import plot as P

    import liepos

    start = time.perf_counter()
    out = Path(out)
    figdir = out / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    n_fig = sum(len(v) for v in FIGURES.values())
    bar = _progress(len(SECTION_ORDER) + n_fig + 1, quiet)
    data: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for key in SECTION_ORDER:
        title, fn = T.SECTIONS[key]
        bar.set_description(f"computing: {title}")
        t0 = time.perf_counter()
        data[key] = fn()
        timings[key] = time.perf_counter() - t0
        bar.update(1)
    figures: dict[str, dict[str, str]] = {}
    for key in SECTION_ORDER:
        for kind in FIGURES[key]:
            bar.set_description(f"drawing: {kind}")
            t0 = time.perf_counter()
            fig = P.KINDS[kind][1](data[key])
            path = P.save(fig, figdir / f"{kind}.png", dpi=dpi)
            timings[f"figure:{kind}"] = time.perf_counter() - t0
            figures[kind] = {"file": f"figures/{path.name}", "section": key, "title": P.KINDS[kind][2]}
            bar.update(1)
    bar.set_description("writing report")
    errors = T.measured_errors(data)
    checked = {k: v for k, v in errors.items() if v.get("ok") is not None}
    failed = [k for k, v in checked.items() if not v["ok"]]
    elapsed = time.perf_counter() - start
    numbers = {
        "liepos_version": liepos.__version__,
        "python": platform.python_version(),
        "torch": __import__("torch").__version__,
        "seconds": round(elapsed, 3),
        "timings": {k: round(v, 4) for k, v in timings.items()},
        "errors": errors,
        "failed": failed,
        "figures": figures,
        "sections": data,
    }
    (out / "numbers.json").write_text(json.dumps(_clean(numbers), indent=1, ensure_ascii=False, allow_nan=False))
    page = _html(data, figures, checked, failed, elapsed, inline, out)
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    bar.update(1)
    bar.close()
    return index


def _img(src_rel: str, out: Path, inline: bool, alt: str) -> str:
    if inline:
        b64 = base64.b64encode((out / src_rel).read_bytes()).decode("ascii")
        src = f"data:image/png;base64,{b64}"
    else:
        src = src_rel
    return f"<img src='{src}' alt='{_e(alt)}' loading='eager'>"


def _html(data, figures, checked, failed, elapsed, inline, out) -> str:
    import liepos

    nav = " ".join(f"<a href='#{k}'>{_e(T.SECTIONS[k][0])}</a>" for k in SECTION_ORDER)
    sections = []
    for i, key in enumerate(SECTION_ORDER, 1):
        title = T.SECTIONS[key][0]
        figs = "".join(
            f"<figure>{_img(figures[kind]['file'], out, inline, figures[kind]['title'])}"
            f"<figcaption>Figure <code>{kind}</code>: {_e(figures[kind]['title'])}. "
            f"Alone: <code>liepos plot {kind} --out {kind}.png</code></figcaption></figure>"
            for kind in FIGURES[key]
        )
        sections.append(f"<section id='{key}'><h2>{i}. {_e(title)}</h2>{TEXT[key](data[key])}{figs}</section>")
    ok = not failed
    summary = (f"<div class='summary{'' if ok else ' bad'}'><b>{len(checked) - len(failed)} of {len(checked)} measured "
               f"identities within their bounds</b>{'' if ok else ': over bound: ' + _e(', '.join(failed))}. "
               f"Generated in {elapsed:.1f} s by liepos {liepos.__version__}; every number and figure here was "
               f"computed by this run and is in <a href='numbers.json'>numbers.json</a>.</div>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>liepos tour: every relative positional encoding is exp(uX)</title><style>{CSS}</style></head>
<body>
<h1>Turn, fade, slide: the liepos tour</h1>
<p class="sub">Every positional encoding that is linear in the query and key, depends only on the gap, is the
identity at gap zero and varies continuously, is a one-parameter group <code>A(u) = exp(uX)</code>. This report
walks that argument with liepos doing every computation.</p>
{summary}
<nav>{nav}</nav>
{''.join(sections)}
<hr><p class="sub">Reproduce: <code>pip install "liepos[plot]" &amp;&amp; liepos tour</code>.
The theory follows Alok Puranik, <i>Using group theory to explore the space of positional encodings for attention</i>
(Jane Street blog), and the explanations built on it.</p>
{CHECK_SCRIPT}</body></html>
"""


# ---------------------------------------------------------------------- command line
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="liepos-tour", metavar="DIR", help="output folder (default: liepos-tour)")
    parser.add_argument("--open", action="store_true", help="open the report in a web browser when done")
    parser.add_argument("--inline", action="store_true", help="embed the figures in index.html (one shareable file)")
    parser.add_argument("--dpi", type=int, default=100, help="figure resolution (default 100)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        from liepos.plot import _mpl

        _mpl()
    except ImportError as err:
        print(f"liepos tour: {err}", file=sys.stderr)
        return 2
    index = tour(args.out, inline=args.inline, dpi=args.dpi, quiet=args.quiet)
    numbers = json.loads((index.parent / "numbers.json").read_text())
    failed = numbers["failed"]
    print(f"wrote {index} ({len(numbers['figures'])} figures, numbers.json) in {numbers['seconds']:.1f} s")
    if failed:
        print(f"liepos tour: {len(failed)} measured identities over their bounds: {', '.join(failed)}", file=sys.stderr)
    if args.open:
        webbrowser.open(index.resolve().as_uri())
    return 1 if failed else 0
