"""Context extension of a transformers model, measured: every scaling map at a target length, the best written back.

For a model trained to ``L0`` (its config's ``max_position_embeddings``) and a target length ``L``,
:func:`extend` builds each map of :data:`MAPS` at ``factor = L / L0`` on the model's own encoding
(:func:`~liepos.interop.from_hf`), runs the model patched with it (:func:`~liepos.interop.patch_model`)
on the user's ``L`` tokens, and measures the negative log-likelihood of every next token
(:func:`token_nll`): ``nll[i] = −log p(x_{i+1} | x_0 … x_i)``, natural log. ``"none"`` is the
unpatched model. The map with the lowest mean NLL over the positions past ``L0`` wins, and
:func:`extend` states it as config entries through :func:`~liepos.interop.to_hf` (dynamic NTK, a
length rule, as its own ``rope_parameters``), checked by reading them back with
:func:`~liepos.interop.from_hf`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from liepos import scaling
from liepos.encoding import Encoding
from liepos.interop.hf_config import from_hf
from liepos.interop.hf_export import to_hf
from liepos.interop.hf_model import patch_model, unpatch_model

__all__ = ["MAPS", "scaling_maps", "token_nll", "next_token_stats", "bucket_means", "Extension", "extend"]

# the lm-head rows computed at once: (chunk, vocab) float32 logits, never (L, vocab)
_CHUNK = 1024
# relative agreement of a written config's frequencies with the measured ones
_ROUND_TRIP = 1e-12


def _linear(enc: Encoding, s: float, L0: int) -> Encoding:
    return scaling.linear(enc, factor=s)


def _ntk(enc: Encoding, s: float, L0: int) -> Encoding:
    return scaling.ntk(enc, factor=s)


def _dynamic(enc: Encoding, s: float, L0: int) -> Encoding:
    return scaling.dynamic(enc, factor=s, original_max_position_embeddings=L0)


def _yarn(enc: Encoding, s: float, L0: int) -> Encoding:
    return scaling.yarn(enc, factor=s, original_max_position_embeddings=L0)


def _llama3(enc: Encoding, s: float, L0: int) -> Encoding:
    return scaling.llama3(enc, factor=s, original_max_position_embeddings=L0)


# every map extend tries, at factor s = L / L0 (Hugging Face's defaults for the others' parameters)
MAPS: dict[str, Callable[[Encoding, float, int], Encoding]] = {
    "linear": _linear, "ntk": _ntk, "dynamic": _dynamic, "yarn": _yarn, "llama3": _llama3,
}


def scaling_maps(enc: Encoding, *, factor: float, original: int, names: Sequence[str] | None = None) -> dict[str, Encoding]:
    """``{name: MAPS[name](enc, factor, original)}`` for ``names`` (default: all of :data:`MAPS`)."""
    names = list(MAPS) if names is None else list(names)
    unknown = [n for n in names if n not in MAPS]
    if unknown:
        raise ValueError(f"unknown scaling maps {unknown}; known: {list(MAPS)}")
    return {n: MAPS[n](enc, float(factor), int(original)) for n in names}


def _head(model: Any) -> tuple[Any, Any]:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "final_logit_softcapping", None):
        raise NotImplementedError(
            f"final_logit_softcapping={config.final_logit_softcapping}: token_nll computes logits as lm_head(hidden) "
            "without the model's soft-capping"
        )
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    if decoder is None or head is None:
        raise ValueError(f"{type(model).__name__} has no decoder and output embeddings (a causal LM is needed)")
    return decoder, head


def token_nll(model: Any, ids: torch.Tensor, encoding: Encoding | None = None) -> torch.Tensor:
    """``nll`` ``(S − 1,)`` float64: ``−log p(ids[i + 1] | ids[: i + 1])`` of ``ids`` ``(1, S)``.

    ``encoding``: patch the model with it for this call (unpatched again after); None: the model as
    it is. The hidden states come from one forward; the logits are formed ``_CHUNK`` rows at a time.
    """
    return next_token_stats(model, ids, encoding)[0]


def next_token_stats(model: Any, ids: torch.Tensor, encoding: Encoding | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_nll` and the greedy next token ``(S − 1,)`` at every position, from the same forward."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"ids must be a (1, S) tensor of token ids with S >= 2, got {getattr(ids, 'shape', ids)!r}")
    decoder, head = _head(model)
    if encoding is not None:
        patch_model(model, encoding)
    try:
        with torch.no_grad():
            hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0]  # (S, hidden)
            out, top = [], []
            for a in range(0, ids.shape[1] - 1, _CHUNK):
                b = min(a + _CHUNK, ids.shape[1] - 1)
                logits = head(hidden[a:b]).float()  # (b − a, vocab)
                out.append(torch.nn.functional.cross_entropy(logits, ids[0, a + 1:b + 1], reduction="none"))
                top.append(logits.argmax(-1))
    finally:
        if encoding is not None:
            unpatch_model(model)
    return torch.cat(out).double(), torch.cat(top)


def bucket_means(nll: torch.Tensor, edges: Sequence[int]) -> list[float]:
    """Mean of ``nll`` over ``[edges[j], edges[j + 1])`` (positions of the predicted token minus one)."""
    if len(edges) < 2 or any(b <= a for a, b in zip(edges[:-1], edges[1:])) or edges[0] < 0 or edges[-1] > len(nll):
        raise ValueError(f"edges must increase strictly within [0, {len(nll)}], got {list(edges)}")
    return [float(nll[a:b].mean()) for a, b in zip(edges[:-1], edges[1:])]


@dataclass
class Extension:
    """What :func:`extend` measured and chose.

    ``nll[name]``: mean NLL per bucket of ``edges``; ``tail[name]``: mean NLL over ``[original, L − 1)``,
    the positions past the trained length (the choice); ``config``: the entries that make an unpatched
    transformers model compute the chosen map (``{}`` for ``"none"``).
    """

    length: int
    original: int
    factor: float
    edges: list[int]
    nll: dict[str, list[float]] = field(default_factory=dict)
    tail: dict[str, float] = field(default_factory=dict)
    best: str = "none"
    config: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        """The measurements as a Markdown table, the chosen map marked."""
        heads = [f"[{a}, {b})" for a, b in zip(self.edges[:-1], self.edges[1:])]
        lines = ["| map | " + " | ".join(heads) + f" | past {self.original} |", "|---" * (len(heads) + 2) + "|"]
        for name, row in self.nll.items():
            mark = " (best)" if name == self.best else ""
            lines.append(f"| {name}{mark} | " + " | ".join(f"{v:.3f}" for v in row) + f" | {self.tail[name]:.3f} |")
        return "\n".join(lines)


def _original(config: Any) -> int:
    L0 = getattr(config, "max_position_embeddings", None)
    if not isinstance(L0, int) or L0 < 1:
        raise ValueError(f"the config has no max_position_embeddings to extend from, got {L0!r}")
    return L0


def _written(name: str, enc: Encoding, factor: float, length: int, config: Any) -> dict[str, Any]:
    """Config entries for map ``name`` (through to_hf; dynamic NTK as its own rope_parameters), checked."""
    if name == "dynamic":
        rope = dict(getattr(config, "rope_parameters", None) or {})
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"dynamic NTK over a {rope.get('rope_type')!r} rope has no rope_parameters")
        rope.update(rope_type="dynamic", factor=float(factor))
        out: dict[str, Any] = {"rope_parameters": rope}
        fixed = enc.at_length(length)
    else:
        out = to_hf(enc)
        fixed = enc
    out["max_position_embeddings"] = _original(config) if name == "dynamic" else int(length)
    merged = {**config.to_dict(), **out}
    back = from_hf(merged)
    if not isinstance(back, Encoding):
        raise RuntimeError(f"the written config of {name!r} reads back as {type(back).__name__}, not one Encoding")
    back = back.at_length(length) if name == "dynamic" else back
    w, v = back.generator.freqs, fixed.generator.freqs
    if w.shape != v.shape or not torch.allclose(w, v, rtol=_ROUND_TRIP, atol=0) or not math.isclose(
            back.logit_scale, fixed.logit_scale, rel_tol=_ROUND_TRIP):
        raise RuntimeError(f"the written config of {name!r} does not read back as the measured encoding")
    return out


def extend(model: Any, ids: torch.Tensor, length: int, *, maps: Sequence[str] | None = None,
           edges: Sequence[int] | None = None, progress: Callable[[str], None] | None = None) -> Extension:
    """Measure every scaling map of the model at ``length`` on ``ids`` and choose the best; see the module.

    ``ids`` ``(1, ≥ length)``: the first ``length`` tokens are used. ``edges``: the NLL buckets
    (default: quarters of the original length up to ``length``). ``progress(line)`` hears each
    measurement as it ends.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    L0 = _original(config)
    if not isinstance(length, int) or length <= L0:
        raise ValueError(f"length must be an integer above max_position_embeddings={L0}, got {length!r}")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < length:
        raise ValueError(f"ids must be a (1, S) tensor with S >= length={length}, got {tuple(getattr(ids, 'shape', ()))}")
    base = from_hf(config)
    if not isinstance(base, Encoding) or base.length_rule is not None:
        raise NotImplementedError("extend takes a model with one fixed rope (no per-layer types, no length rule)")
    factor = length / L0
    candidates: dict[str, Encoding | None] = {"none": None, **scaling_maps(base, factor=factor, original=L0, names=maps)}
    step = max(L0 // 4, 1)
    cuts = list(edges) if edges is not None else sorted({*range(0, length - 1, step), length - 1})
    out = Extension(length, L0, factor, cuts)
    x = ids[:, :length]
    for name, enc in candidates.items():
        run = None if enc is None else (enc.at_length(length).replace(length_rule=None) if enc.length_rule else enc)
        nll = token_nll(model, x, run)
        out.nll[name], out.tail[name] = bucket_means(nll, cuts), float(nll[L0:].mean())
        if progress is not None:
            progress(f"{name}: mean NLL past {L0} = {out.tail[name]:.4f}")
    out.best = min(out.tail, key=out.tail.__getitem__)
    if out.best != "none":
        best = candidates[out.best]
        assert best is not None
        out.config = _written(out.best, best, factor, length, config)
    return out
