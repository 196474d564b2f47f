"""The tour's figures by name: kind -> (the section whose data it draws, its title).

Plain data with no import beyond the standard library, so that ``liepos plot --help`` lists the kinds
without loading torch or matplotlib; :data:`liepos.tour.figures.KINDS` pairs each with its drawing.

>>> KIND_TITLES["spectrum"][0]
'spectrum'
"""

from __future__ import annotations

__all__ = ["KIND_TITLES"]

KIND_TITLES: dict[str, tuple[str, str]] = {
    "attention": ("attention", "raw scores, RoPE-encoded scores and the causal mask of one head"),
    "group": ("group", "measured errors of A(0)=I, A(u)A(v)=A(u+v), F(t)^T G(s)=A(t-s)"),
    "trajectories": ("rows", "the six rows: a fixed vector under A(u) as the lag grows"),
    "fate": ("rows", "|A(u)v| against the lag for the six rows"),
    "lookup": ("lookup", "A(t-s) and scores over (t, s): constant diagonals, broken by absolute"),
    "clocks": ("clocks", "RoPE frequencies per base, score against gap, the worked example"),
    "spectrum": ("spectrum", "rate against frequency of every catalogue entry"),
    "scaling": ("scaling", "frequencies before/after linear, NTK, YaRN, llama3"),
    "precision": ("precision", "cos/sin error against position: liepos vs a float32 pipeline"),
    "alibi": ("alibi", "ALiBi's nilpotent block, slots and the bias they produce"),
}
