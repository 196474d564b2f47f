"""What :func:`~liepos.interop.patch_model` puts in a family's modeling file, and takes out again.

* The module-level rope functions (``apply_rotary_pos_emb`` and kin, the names of ``Family.apply``)
  become dispatchers: inside a patched attention (:data:`liepos.interop.hf_attention.ACTIVE`) they
  call the layer's ``rotate``, anywhere else (an indexer's, an unpatched model's) upstream's.
  transformers has no registry for the rope function, so this stays module-level on every route.
* Only where a registered twin cannot be exact (:mod:`liepos.interop.hf_attention` says where):
  the file's ``ALL_ATTENTION_FUNCTIONS`` is wrapped, so that ``get_interface`` returns
  :func:`~liepos.interop.hf_attention.interface` in front of whatever the name asks for.

Each hook is counted per file: :func:`release` (and the collection of a model never unpatched) puts
transformers' objects back once no patched model needs them, the table as soon as no model on the
hooks is left, the rope functions with the last model.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

from liepos.interop.hf_attention import ACTIVE, interface, is_twin
from liepos.interop.hf_verify import one_tensor, rotate_one, sin_first

__all__ = ["install", "release", "patched_models"]

# modeling file -> the patched models whose rope functions it dispatches / whose attention table it wraps
_ROPE: dict[str, weakref.WeakSet] = {}
_TABLE: dict[str, weakref.WeakSet] = {}


def _rope_dispatcher(upstream: Any) -> Any:
    def rope(q: Any, k: Any, *args: Any, **kwargs: Any) -> Any:
        module = ACTIVE.get()
        if module is None:
            return upstream(q, k, *args, **kwargs)
        if module._liepos.family.inner_rotary:  # positions from the rotary call that made this cos
            sin = args[0] if args else kwargs["sin"]
            return module._liepos.rotate_tagged(q, k, sin, kwargs.get("unsqueeze_dim", args[1] if len(args) > 1 else 1))
        if one_tensor(upstream):
            return rotate_one(module._liepos, q, args, kwargs, seq_first=sin_first(upstream) or None)
        return module._liepos.rotate(q, k)

    vars(rope)["_liepos_upstream"] = upstream
    return rope


class _Interfaces:
    """``ALL_ATTENTION_FUNCTIONS`` of a modeling file: liepos' dispatch in front of upstream's interface."""

    def __init__(self, upstream: Any) -> None:
        self._liepos_upstream = upstream

    def get_interface(self, name: Any, default: Any) -> Any:
        fn = self._liepos_upstream.get_interface(name, default)
        return fn if is_twin(name) else interface(fn)  # a twin: a model of the file on the registered route

    def __getitem__(self, name: Any) -> Any:
        return self._liepos_upstream[name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._liepos_upstream, name)


def install(modeling: str, apply: tuple[str, ...], model: Any, *, table: bool) -> None:
    """The rope dispatchers in ``modeling`` (and with ``table`` its attention table wrapped) for ``model``."""
    mod = importlib.import_module(modeling)
    _add(_ROPE, modeling, model, _unwrap_rope)
    for name in apply:
        fn = getattr(mod, name)
        if not hasattr(fn, "_liepos_upstream"):
            setattr(mod, name, _rope_dispatcher(fn))
    if not table:
        _drop(_TABLE, modeling, model, _unwrap_table)  # a repatched model that needed the table before
        return
    _add(_TABLE, modeling, model, _unwrap_table)
    upstream = getattr(mod, "ALL_ATTENTION_FUNCTIONS", None)
    if upstream is not None and not isinstance(upstream, _Interfaces):
        vars(mod)["ALL_ATTENTION_FUNCTIONS"] = _Interfaces(upstream)


def release(model: Any) -> None:
    """``model`` needs no hook any more: each file's objects back once no patched model needs them."""
    for modeling in list(_TABLE):
        _drop(_TABLE, modeling, model, _unwrap_table)
    for modeling in list(_ROPE):
        _drop(_ROPE, modeling, model, _unwrap_rope)


def patched_models(modeling: str) -> list[Any]:
    """The patched models whose rope functions ``modeling`` dispatches now."""
    return list(_ROPE.get(modeling, ()))


def _add(users: dict[str, weakref.WeakSet], modeling: str, model: Any, unwrap: Any) -> None:
    models = users.setdefault(modeling, weakref.WeakSet())
    if model not in models:
        models.add(model)
        weakref.finalize(model, _drop, users, modeling, None, unwrap)  # a model collected while patched


def _drop(users: dict[str, weakref.WeakSet], modeling: str, model: Any, unwrap: Any) -> None:
    """``model`` (None: one collected) leaves ``users``; the file's own objects back once no live model is left."""
    models = users.get(modeling)
    if models is None:
        return
    if model is not None:
        models.discard(model)
    if not list(models):  # only live models (a collected one may not be discarded yet)
        unwrap(importlib.import_module(modeling))
        del users[modeling]


def _unwrap_rope(mod: Any) -> None:
    for name, value in list(vars(mod).items()):
        if callable(value) and hasattr(value, "_liepos_upstream") and not isinstance(value, _Interfaces):
            setattr(mod, name, value._liepos_upstream)


def _unwrap_table(mod: Any) -> None:
    table = vars(mod).get("ALL_ATTENTION_FUNCTIONS")
    if isinstance(table, _Interfaces):
        mod.ALL_ATTENTION_FUNCTIONS = table._liepos_upstream
