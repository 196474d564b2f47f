"""An encoding as a graph constant: its structure written out, so that a saved program can rebuild it.

``key(enc)`` is a JSON string of everything that determines the encoded values — the generator's rates,
frequencies, block sizes and kinds, ν, basis, heads and axes (each tensor with its dtype, shape and
values; a float written by ``repr`` reads back as the same float), the layout, the slots, the logit and
query scales, the name, the length and the length rule (a :class:`liepos.scaling.LengthRule`: its
source encoding and the module-level liepos function with its arguments) — and ``rebuild(key)`` is an
equal encoding built from that string alone, in any process. ``torch.compile`` and ``torch.export``
hold this string in their graphs (:mod:`liepos._graph` calls these two through the hooks it is given
at import), never an id that means something in one process only. Nothing is unpickled: a rebuilt
rule may only name a function of liepos itself.

>>> import liepos as lp
>>> enc = lp.xpos(8)
>>> twin = rebuild(key(enc))
>>> twin is not enc and key(twin) == key(enc)
True
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import torch

import liepos._graph as _graph
from liepos.encoding import Encoding
from liepos.generator import Generator
from liepos.scaling import LengthRule

__all__ = ["key", "rebuild"]

VERSION = 1
_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64)}


def _tensor(t: torch.Tensor | None) -> dict | None:
    if t is None:
        return None
    t = t.detach().cpu()
    return {"dtype": str(t.dtype), "shape": list(t.shape), "data": t.double().flatten().tolist()}


def _untensor(d: dict | None) -> torch.Tensor | None:
    if d is None:
        return None
    return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"]).to(_DTYPES[d["dtype"]])


def _rule(rule: Any) -> dict | None:
    """A length rule as data: a :class:`LengthRule` whose map is a ``functools.partial`` of a module-level
    liepos function with plain arguments; anything else is named but cannot be rebuilt."""
    if rule is None:
        return None
    at = getattr(rule, "at", None)
    if isinstance(rule, LengthRule) and isinstance(at, functools.partial) and not at.keywords:
        fn = at.func
        args = [_arg(a) for a in at.args]
        if _PLAIN not in args and fn.__module__.startswith("liepos.") and "." not in fn.__qualname__:
            return {"source": _structure(rule.source), "module": fn.__module__, "function": fn.__qualname__,
                    "args": args}
    return {"opaque": repr(rule)[:200]}


_PLAIN = "\0not plain"  # the marker of an argument that is not data


def _arg(a: Any) -> Any:
    """An argument of a scaling map as JSON: a number, string, None, a tensor, or a tuple/list of those."""
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, torch.Tensor):
        return {"tensor": _tensor(a)}
    if isinstance(a, (tuple, list)):
        items = [_arg(x) for x in a]
        return _PLAIN if _PLAIN in items else {"tuple" if isinstance(a, tuple) else "list": items}
    return _PLAIN


def _unarg(a: Any) -> Any:
    if isinstance(a, dict):
        if "tensor" in a:
            return _untensor(a["tensor"])
        if "tuple" in a:
            return tuple(_unarg(x) for x in a["tuple"])
        return [_unarg(x) for x in a["list"]]
    return a


def _structure(enc: Encoding) -> dict:
    g = enc.generator
    return {
        "version": VERSION, "rates": _tensor(g.rates), "freqs": _tensor(g.freqs), "sizes": list(g.sizes),
        "complex": list(g.complex), "basis": _tensor(g.basis), "allow_growth": g.allow_growth, "axes": g.num_axes,
        "nus": _tensor(g.nus), "layout": enc.layout, "query_slots": _tensor(enc.query_slots),
        "key_slots": _tensor(enc.key_slots), "logit_scale": enc.logit_scale, "query_scale": _tensor(enc.query_scale),
        "name": enc.name, "length": enc.length, "length_rule": _rule(enc.length_rule),
    }


def key(enc: Encoding) -> str:
    """The encoding's structure as a JSON string (see the module docstring)."""
    return json.dumps(_structure(enc), sort_keys=True, separators=(",", ":"))


def _from(d: dict) -> Encoding:
    if d.get("version") != VERSION:
        raise ValueError(f"liepos: an encoding written by another format version ({d.get('version')!r}, this "
                         f"liepos reads {VERSION})")
    g = Generator(_untensor(d["rates"]), _untensor(d["freqs"]), d["sizes"], complex=d["complex"],
                  basis=_untensor(d["basis"]), allow_growth=d["allow_growth"], axes=d["axes"], nus=_untensor(d["nus"]))
    rule = d["length_rule"]
    if rule is not None:
        rule = _rebuild_rule(rule)
    return Encoding(g, d["layout"], query_slots=_untensor(d["query_slots"]), key_slots=_untensor(d["key_slots"]),
                    logit_scale=d["logit_scale"], query_scale=_untensor(d["query_scale"]), name=d["name"],
                    length_rule=rule, length=d["length"])


def _rebuild_rule(rule: dict) -> LengthRule:
    if "opaque" in rule:
        raise ValueError(f"liepos: the encoding's length rule {rule['opaque']} is not a liepos scaling map, so a "
                         f"saved program cannot rebuild it: build the encoding in this process before running it")
    module = sys.modules.get(rule["module"])  # liepos's own modules only, already imported with liepos
    fn = getattr(module, rule["function"], None) if rule["module"].startswith("liepos.") else None
    if not callable(fn):
        raise ValueError(f"liepos: the length rule names {rule['module']}.{rule['function']}, which this liepos lacks")
    return LengthRule(_from(rule["source"]), functools.partial(fn, *(_unarg(a) for a in rule["args"])))


def rebuild(text: str) -> Encoding:
    """An encoding equal to the one ``text`` (a :func:`key`) was written from."""
    return _from(json.loads(text))


_graph.install(key, rebuild)
