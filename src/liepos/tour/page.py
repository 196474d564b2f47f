"""The tour's page: the theory's argument walked on live numbers, written as one HTML report.

Every number and picture in the report is computed by liepos when the tour runs
(:mod:`liepos.tour.sections`, :mod:`liepos.tour.playground`), drawn by :mod:`liepos.tour.figures`,
and written as::

    liepos-tour.html      by default: the report, one self-contained file (figures inline as SVG, every
                          number in its ``numbers`` script; no reference to any other file)
    OUT/index.html        with folder=True: the report,
    OUT/figures/*.svg     one SVG per figure,
    OUT/numbers.json      every figure's data and every measured error with its bound

The page's style and scripts are package data (``liepos/tour/assets``), read by :func:`asset`.

>>> SECTION_ORDER[0], SECTION_ORDER[-1], "playground" in SECTION_ORDER
('attention', 'playground', True)
>>> asset("page.css").startswith("body")
True
"""

from __future__ import annotations

import base64
import html
import io
import json
import multiprocessing
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from liepos._progress import progress
import liepos.tour.figures as F
import liepos.tour.playground as PG
import liepos.tour.sections as T
from liepos.tour.sections import json_safe

__all__ = ["tour", "Written", "SECTION_ORDER", "FIGURES", "INSTALL", "asset"]

# the tour's sections, then the playground last
SECTION_ORDER = (*T.SECTIONS, "playground")
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
    "playground": (),
}
# how a reader reproduces the page, from a clone of the repository (liepos is not on a package registry):
# the README's set-up command for the main job, word for word (tests/test_readme.py holds them equal)
INSTALL = ("python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements-torch.txt && "
           "pip install -e \".[plot]\" && liepos tour")


def asset(name: str) -> str:
    """The text of a package data file of the page (``liepos/tour/assets/<name>``)."""
    return resources.files("liepos.tour").joinpath("assets", name).read_text(encoding="utf-8")


# ---------------------------------------------------------------------- small helpers
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
            f"<tr class='{cls}'><td>{_e(name).replace('_', '_<wbr>')}</td><td class='n'>{_num(e['value'])}</td>"
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
        ex = r["example"]
        ex_counts = ", ".join(f"{v} {k} block{'s' if v > 1 else ''}" for k, v in ex["classification"]["counts"].items() if v)
        cl = (f"<code>classify(X)</code>: {_e(counts)}<br><small>shipped example: catalogue entry "
              f"<code>{_e(ex['entry'])}</code> at head dim {ex['head_dim']}: {_e(ex_counts)}</small>")
        norm, lags = r["norm"], d["lags"]
        at = [0, len(norm) // 2, len(norm) - 1]
        cards.append(
            f"<div class='card' style='border-top: 4px solid {_color(name)}'><h4 style='color:{_color(name)}'>"
            f"{_e(r['label'])}: {_e(r['picture'])}</h4>X = {_matrix(r['X'])}"
            f"<p>{cl}</p><p>|A(u)v| at u = {', '.join(f'{lags[i]:g}' for i in at)}: "
            f"{', '.join(_num(norm[i]) for i in at)}</p></div>"
        )
    return f"""
<p>Which generators are there? Up to a change of basis (which the network's weights absorb) X splits into blocks,
and each block's eigenvalue λ ± iω decides what it does to a key as the lag grows: the real part is its fate
(fade, hold, explode), the imaginary part its rhythm (how fast it turns), and a block without enough eigenvectors
(a Jordan block of size n ≥ 2) adds a polynomial in the lag. liepos writes a block as (rate λ, frequency ω, size n):
(−0.1, 0, 1) is a 1×1 fading block, (0, 0.5, 1) a 2×2 rotation, (0, 0, 2) ALiBi's 2×2 slide; printed short,
<code>R1</code> is a real block of size 1 and <code>C1</code> a complex (rotating) one. That gives the theory's
table of six rows. Each panel follows one fixed vector
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
<p>The theory's worked example (d = 16, base 10000, every plane (1, 0)): liepos encodes the query at <i>t</i> and the
key at <i>s</i> and takes the dot product. Gap 3 gives the 5.543 the theory prints, wherever the pair sits; gap 7
does not.</p>
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
2²⁴ the position itself is rounded. liepos reduces the angle ω·t modulo 2π without rounding the product
first (<code>liepos.tables.reduced_angle</code>), takes the cosine in float64 and only then casts to float32. Against a {d['digits']}-digit
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
liepos's <code>alibi({d['head_dim']}, num_heads={d['num_heads']})</code> does just that, one slope per head (Press et al.'s
geometric slopes {', '.join(f'{m:g}' for m in d['slopes'][:4])}, …).</p>
<div class='two'><div>N = {_matrix(d['N'])}</div><div>exp(3N) = {_matrix(d['exp_uN_at_u3'])}</div>
<div>query slots (head 0) = {d['query_slots'][0]}<br>key slots (head 0) = {d['key_slots'][0]}</div></div>
<p><code>classify(alibi)</code>: {_e(cl)}. The bias from the slots equals −m<sub>h</sub>(t−s), and
<code>liepos.attention</code> through the slots equals Press et al.'s attention with the explicit additive bias,
softmax(qᵀk/√d − m<sub>h</sub>(t−s)):</p>
{_checks_table(d['errors'])}"""


def _range(name: str, label: str, low: float, high: float, step: float, value: float) -> str:
    return (f"<label for='pg-{name}'>{label}</label><span class='pg-range'><input type='range' id='pg-{name}' "
            f"min='{low:g}' max='{high:g}' step='{step:g}' value='{value:g}'> <output id='pg-{name}-v' "
            f"for='pg-{name}'>{value:g}</output></span>")


def _text_playground(d: dict[str, Any]) -> str:
    data = dict(d, colors=F.ROW_COLORS, labels=T.ROW_LABELS, pictures=T.ROW_PICTURES)
    payload = json.dumps(json_safe(data), separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    y = d["yarn"]
    return f"""
<p>Now write X yourself. X is a sum of blocks, each <code>(rate λ, frequency ω, size n, coupling c)</code>: the
coupling c is the superdiagonal of a Jordan block (leave it out for 1). The page evaluates
<code>A(u) = exp(uX)</code> itself, in float64, from the closed form of each block,
e<sup>λu</sup>(cu)<sup>m</sup>/m!·R(ωu), for whatever you type: nothing is looked up. Below the controls:
the row <code>liepos.classify</code> gives each block, A(u) itself (in the layout you pick), the path of a fixed
vector v, the size |A(u)v| and the score qᵀA(t−s)k against the lag, the theorem at work (shift both positions:
the score stays), and the attention this X gives.</p>
<div id='pg' class='pg'>
<div class='pg-controls'>
<label for='pg-preset'>preset</label><select id='pg-preset'><option value=''>(your own X)</option></select>
<label for='pg-x'>X, as blocks</label><input id='pg-x' type='text' spellcheck='false' autocomplete='off'
 aria-describedby='pg-x-help pg-x-error'>
<span></span><small id='pg-x-help'>e.g. <code>(-0.1, 0.5, 1) + (0, 0, 2, 0.5)</code>: a fading rotation plus
 ALiBi's slide with coupling 0.5</small>
<span></span><span id='pg-x-error' class='pg-error' role='alert'></span>
<label for='pg-u'>u (for A(u))</label><input id='pg-u' type='number' step='0.1' value='1.5'>
{_range('lags', 'lag range of the plots', 5, 80, 1, 40)}
<span>layout</span><span role='radiogroup' aria-label='layout'><label><input type='radio' name='pg-layout'
 value='interleaved' checked> interleaved</label> <label><input type='radio' name='pg-layout' value='half'> half
 (Hugging Face)</label></span>
</div>
<ul id='pg-rows' class='pg-rows' aria-label='the row of each block'></ul>
<div class='pg-wide'><table id='pg-A' class='pg-matrix'></table></div>
<p id='pg-perm' class='sub'></p>
<div class='pg-plots'><svg id='pg-traj' role='img' aria-label='the path of v under A(u)'></svg>
<svg id='pg-norm' role='img' aria-label='the norm of A(u)v against the lag'></svg>
<svg id='pg-score' role='img' aria-label='the score against the lag'></svg></div>
<h3>The theorem at work: only the gap matters</h3>
<div class='pg-controls'>{_range('t', 'query position t', 0, 30, 1, 9)}{_range('s', 'key position s', 0, 30, 1, 4)}
{_range('shift', 'shift both by', -20, 40, 1, 0)}</div>
<p id='pg-shift-out' aria-live='polite'></p>
<h3>The attention this X gives</h3>
<div class='pg-plots'><svg id='pg-attn' role='img' aria-label='attention weights of the chosen X'></svg></div>
<h3>Two commuting axes: a 2-D similarity map</h3>
<p>Two position axes (an image's x and y) need two commuting generators. Axial RoPE gives half the planes to x and
half to y; "golden gate" RoPE turns each plane along its own direction, the golden angle apart, so no axis is
preferred. 16 planes, base 100.</p>
<div class='pg-controls'><label for='pg-map-mode'>directions</label><select id='pg-map-mode'>
<option value='axial'>axial (x and y)</option><option value='golden'>golden gate</option></select></div>
<div class='pg-plots'><svg id='pg-map' role='img' aria-label='2-D similarity map'></svg></div>
<h3>Context extension: YaRN's bands, the temperature apart</h3>
<p>YaRN keeps the planes that turn many times within the original context, divides the slow ones' frequency by the
factor, and ramps in between; separately it raises the logit temperature. RoPE d = {y['dim']}, base {y['base']:g}.
At factor {y['factor']:g} and original context {y['original']}, <code>liepos.scaling.yarn</code> gives the logit scale
{y['logit_scale']:.6f}.</p>
<div class='pg-controls'>{_range('factor', 'factor s', 1, 64, 1, y['factor'])}
<label for='pg-orig'>original context</label><select id='pg-orig'><option>2048</option><option selected>4096</option>
<option>8192</option></select></div>
<div class='pg-plots'><svg id='pg-scale' role='img' aria-label='YaRN frequency ratio per plane'></svg></div>
<p id='pg-temp'></p>
<p id='pg-check' class='sub'></p>
</div>
<script id='pg-data' type='application/json'>{payload}</script>
<script>{asset('playground.js')}</script>"""


TEXT = {
    "attention": _text_attention, "group": _text_group, "rows": _text_rows, "lookup": _text_lookup,
    "clocks": _text_clocks, "spectrum": _text_spectrum, "scaling": _text_scaling,
    "precision": _text_precision, "alibi": _text_alibi, "playground": _text_playground,
}
TITLES = {**{k: title for k, (title, _) in T.SECTIONS.items()}, "playground": "Playground: write X yourself"}

# a short glossary at the foot of the page: the words the tour leans on
GLOSSARY = {
    "generator X": "the matrix whose exponential A(u) = exp(uX) carries a key across a gap u",
    "lag, gap u = t − s": "how far the query (at time t) is from the key (at time s)",
    "block (λ, ω, n)": "a piece of X in canonical form: rate λ, frequency ω, size n (R1: real, size 1; C1: complex, size 1)",
    "rate λ (fate)": "the real part of an eigenvalue: fades (λ < 0), holds (λ = 0) or explodes (λ > 0)",
    "frequency ω (rhythm)": "the imaginary part: how fast a plane turns, in radians per token",
    "Jordan block": "a block of size n ≥ 2, without a full set of eigenvectors: adds a polynomial in the lag",
    "slots": "constant coordinates appended to queries and keys; ALiBi's bias −m(t − s) comes from them",
    "the six rows": "growth, NoPE, decay, rotation (RoPE), damped rotation (xPos, RetNet), polynomial (ALiBi)",
    "re-centred": "positions near 10⁶ computed relative to a nearby origin, so no precision is lost",
}


def _color(row: str) -> str:
    return F.ROW_COLORS.get(row, "#333333")




# ---------------------------------------------------------------------- the tour
DRAWING_PROCESSES = 2  # the figures take most of the tour's time; two processes halve it on two cores


def _svg_bytes(fig, dpi: int) -> bytes:
    """The figure as SVG: text stays text (sharp and selectable at any width); ``dpi`` sets heatmaps' pixels."""
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, dpi=dpi, format="svg", facecolor="white")
    return buf.getvalue()


def _draw(kind: str, data: dict[str, Any], dpi: int) -> bytes:
    """The SVG of figure ``kind`` (run in a worker process)."""
    return _svg_bytes(F.KINDS[kind][1](data), dpi)


def _compute(key: str, bar) -> tuple[Any, float]:
    bar.describe(f"computing: {TITLES[key]}")
    t0 = time.perf_counter()
    value = PG.playground() if key == "playground" else T.SECTIONS[key][1]()
    bar.update(1)
    return value, time.perf_counter() - t0


@dataclass(frozen=True)
class Written:
    """What :func:`tour` wrote: the absolute path of the page, the checks over their bounds, the seconds taken."""

    index: Path
    failed: list[str]
    seconds: float


def tour(out: str | Path = "liepos-tour.html", *, folder: bool = False, dpi: int = 100, quiet: bool = False) -> Written:
    """Run every section, draw every figure, write the page (see :class:`Written`).

    By default ``out`` is the page itself, one self-contained HTML file: every figure inline as SVG data,
    every number (what the folder form puts in ``numbers.json``) in a ``<script type="application/json"
    id="numbers">``, no reference to any other file. With ``folder``, ``out`` is a folder holding
    ``index.html``, ``figures/*.svg`` and ``numbers.json``."""
    start = time.perf_counter()
    out = Path(out).resolve()
    index = out / "index.html" if folder else out
    index.parent.mkdir(parents=True, exist_ok=True)
    n_fig = sum(len(v) for v in FIGURES.values())
    F.require_matplotlib()  # imported once here, inherited by the drawing processes
    with progress(len(SECTION_ORDER) + n_fig + 1, "liepos tour", enabled=not quiet) as bar:
        data: dict[str, Any] = {}
        timings: dict[str, float] = {}
        for key in T.SECTIONS:
            data[key], timings[key] = _compute(key, bar)
        # the figures are drawn by DRAWING_PROCESSES workers while this process computes the playground
        fork = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=DRAWING_PROCESSES, mp_context=fork) as pool:
            jobs = {kind: pool.submit(_draw, kind, data[key], dpi) for key in SECTION_ORDER for kind in FIGURES[key]}
            data["playground"], timings["playground"] = _compute("playground", bar)
            figures = {kind: _place(kind, job.result(), out if folder else None, bar) for kind, job in jobs.items()}
        bar.describe("writing the page")
        errors = T.measured_errors(data)
        checked = {k: v for k, v in errors.items() if v.get("ok") is not None}
        failed = [k for k, v in checked.items() if not v["ok"]]
        elapsed = time.perf_counter() - start
        numbers = _numbers(data, errors, failed, figures, timings, elapsed)
        if folder:
            (out / "numbers.json").write_text(json.dumps(numbers, indent=1, ensure_ascii=False, allow_nan=False))
        index.write_text(_html(data, figures, checked, failed, elapsed, None if folder else numbers), encoding="utf-8")
        bar.update(1)
    return Written(index, failed, time.perf_counter() - start)


def _place(kind: str, svg: bytes, folder: Path | None, bar) -> dict[str, str]:
    """Where the page finds figure ``kind``: a data URI (one file), or ``figures/<kind>.svg`` written in ``folder``."""
    bar.describe(f"drawn: {kind}")
    if folder is None:
        src = "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")
    else:
        (folder / "figures").mkdir(exist_ok=True)
        (folder / "figures" / f"{kind}.svg").write_bytes(svg)
        src = f"figures/{kind}.svg"
    bar.update(1)
    return {"src": src, "section": F.KINDS[kind][0], "title": F.KINDS[kind][2]}


def _numbers(data, errors, failed, figures, timings, elapsed) -> dict[str, Any]:
    """Every figure's data and every measured error with its bound (``numbers.json``, or inline)."""
    from liepos._version import __version__

    figs = {k: {"file": f["src"] if not f["src"].startswith("data:") else None, "section": f["section"],
                "title": f["title"]} for k, f in figures.items()}
    return json_safe({
        "liepos_version": __version__, "python": platform.python_version(),
        "torch": __import__("torch").__version__, "seconds": round(elapsed, 3),
        "timings": {k: round(v, 4) for k, v in timings.items()}, "errors": errors, "failed": failed,
        "figures": figs, "sections": data,
    })


def _section(i: int, key: str, data: dict[str, Any], figures: dict[str, dict[str, str]]) -> str:
    figs = "".join(
        f"<figure><img src='{figures[kind]['src']}' alt='{_e(figures[kind]['title'])}' loading='eager'>"
        f"<figcaption>Figure <code>{kind}</code>: {_e(figures[kind]['title'])}. "
        f"Alone: <code>liepos plot {kind} --out {kind}.png</code></figcaption></figure>"
        for kind in FIGURES[key]
    )
    return f"<section id='{key}'><h2>{i}. {_e(TITLES[key])}</h2>{TEXT[key](data[key])}{figs}</section>"


def _html(data, figures, checked, failed, elapsed, numbers: dict[str, Any] | None) -> str:
    """The page; ``numbers`` (the one-file form) are embedded in it, else they are in numbers.json beside it."""
    from liepos._version import __version__

    nav = " ".join(f"<a href='#{k}'>{_e(TITLES[k])}</a>" for k in SECTION_ORDER)
    sections = "".join(_section(i, key, data, figures) for i, key in enumerate(SECTION_ORDER, 1))
    ok = not failed
    where = ("this one file holds every figure and, in its <code>numbers</code> script, every number"
             if numbers is not None else
             "every number and figure is also in <a href='numbers.json'>numbers.json</a> beside this page")
    embedded = ("" if numbers is None else "<script id='numbers' type='application/json'>"
                + json.dumps(numbers, separators=(",", ":"), ensure_ascii=False, allow_nan=False).replace("</", "<\\/")
                + "</script>")
    summary = (f"<div class='summary{'' if ok else ' bad'}'><b>{len(checked) - len(failed)} of {len(checked)} measured "
               f"identities within their bounds</b>{'' if ok else ': over bound: ' + _e(', '.join(failed))}. "
               f"Generated in {elapsed:.1f} s by liepos {__version__}; every number and figure here was "
               f"computed by this run; {where}.</div>")
    glossary = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in GLOSSARY.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>liepos tour: every relative positional encoding is exp(uX)</title><style>{asset('page.css')}</style></head>
<body>
<h1>Turn, fade, slide: the liepos tour</h1>
<p class="sub">Every positional encoding that is linear in the query and key, depends only on the gap, is the
identity at gap zero and varies continuously, is a one-parameter group <code>A(u) = exp(uX)</code>. This report
walks that argument with liepos doing every computation.</p>
{summary}
<nav>{nav} <a href='#glossary'>Glossary</a></nav>
{sections}
<section id='glossary'><h2>Glossary</h2><dl class='glossary'>{glossary}</dl></section>
<hr><p class="sub">Reproduce: liepos is not on a package registry; in a clone of its repository run
<code>{_e(INSTALL)}</code>.
The theory follows Alok Puranik, <i>Using group theory to explore the space of positional encodings for attention</i>
(Jane Street blog), and the explanations built on it.</p>
{embedded}<script>{asset('check.js')}</script></body></html>
"""
