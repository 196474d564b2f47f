"""The attention implementation a patched model runs: transformers' own, registered under a liepos name.

transformers' attention modules call ``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation,
…)`` and its masks are built by ``ALL_MASK_ATTENTION_FUNCTIONS[config._attn_implementation]``. For each
implementation in :data:`TWINS`, :func:`register` adds a twin to both registries
(``AttentionInterface.register`` and ``AttentionMaskInterface.register``): ``liepos_sdpa`` is
:func:`interface` in front of upstream's ``sdpa``, its mask function upstream's ``sdpa`` mask, looked up at
each call, so the mask's format and every argument are exactly upstream's. :func:`route` writes the twin's
name into the configs of the patched attention layers only (vision towers and other models keep
theirs) and :func:`restore` writes back what was there. Inside the twin the dispatch is per layer: a
layer on liepos' raw-key path runs :func:`liepos.interop.hf_raw.raw_attention`, packed documents run
one by one (:func:`liepos.interop.hf_raw.packed_attention`), every other module (a layer left upstream,
a NoPE layer, an unpatched model sharing the config) runs upstream's implementation.

Where transformers or the family's modeling file reads the implementation's *name*, a twin would take
another branch than upstream, so :func:`route` returns None and the patch takes the modeling file's
hooks instead (:mod:`liepos.interop.hf_modeling_hooks`, which wraps the file's ``ALL_ATTENTION_FUNCTIONS``):

* ``eager``: ``PreTrainedConfig.output_attentions`` (its setter and ``validate_output_attentions``, run by
  ``save_pretrained``) accepts ``True`` only when the name is ``"eager"``;
* ``flash_attention_*``: ``flash_attention_forward`` picks its kernel by
  ``module.config._attn_implementation``, and masks, generation and the vision towers branch on
  ``"flash" in name``; ``flex_attention`` and hub kernels are chosen by their names likewise;
* a modeling file that reads ``_attn_implementation`` anywhere but as the argument of ``get_interface``
  or in an ``__init__`` (which runs before the patch, on upstream's name): the sparse-attention indexer
  families (``in ("eager", "sdpa")`` in their attention), Falcon (``== "sdpa"``), or any such file probed
  outside the table.

What stays module-level on either route: the rope functions of the modeling file
(``apply_rotary_pos_emb`` and kin), since transformers has no registry for them.
"""

from __future__ import annotations

import contextvars
import functools
import sys
from typing import Any

from liepos.interop.hf_raw import packed_attention, raw_attention

__all__ = ["ACTIVE", "TWINS", "interface", "is_twin", "register", "route", "restore", "twin_name"]

# the patched attention module whose forward runs now (None: upstream's rope and attention)
ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("liepos_attention", default=None)

# upstream implementations with a registered twin (the others: the modeling file's hooks, see above)
TWINS = ("sdpa",)
_PREFIX = "liepos_"
_BEFORE = "_liepos_attn_implementation"  # on the model: {id(config): (config, name before, twin name)}


def interface(fn: Any) -> Any:
    """The attention the active layer runs in place of upstream's ``fn``: the raw-key path, per document."""
    module = ACTIVE.get()
    if module is not None and not module._liepos.encoded:
        fn = raw_attention
    if module is not None and module._liepos.call.get("cu") is not None:
        return functools.partial(packed_attention, fn)
    return fn


def twin_name(upstream: str) -> str:
    """The registered name of ``upstream``'s twin."""
    return _PREFIX + upstream


def is_twin(name: Any) -> bool:
    """Whether ``name`` is a registered twin (which dispatches itself: a wrapped table passes it on as is)."""
    return isinstance(name, str) and name.startswith(_PREFIX) and name[len(_PREFIX):] in TWINS


def _upstream_table(module: Any) -> Any:
    """The ``ALL_ATTENTION_FUNCTIONS`` the module's forward reads (the modeling file's, unwrapped)."""
    table = getattr(type(module).forward, "__globals__", {}).get("ALL_ATTENTION_FUNCTIONS")
    if table is None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as table
    return getattr(table, "_liepos_upstream", table)


def _twin(upstream: str) -> tuple[Any, Any]:
    """The attention function and mask function registered for ``upstream``'s twin."""

    def attention(module: Any, *args: Any, **kwargs: Any) -> Any:
        return interface(_upstream_table(module).get_interface(upstream, None))(module, *args, **kwargs)

    def mask(*args: Any, **kwargs: Any) -> Any:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        return ALL_MASK_ATTENTION_FUNCTIONS[upstream](*args, **kwargs)

    attention.__name__ = mask.__name__ = twin_name(upstream)
    return attention, mask


@functools.cache
def register() -> None:
    """Register every twin with transformers (once per process; a name taken by another library is refused)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    for upstream in TWINS:
        name = twin_name(upstream)
        for table in (ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS):
            if name in table:
                raise RuntimeError(f"the attention implementation {name!r} is already registered with transformers "
                                   f"({table[name]!r}), so liepos cannot register its own")
        attention, mask = _twin(upstream)
        AttentionInterface.register(name, attention)
        AttentionMaskInterface.register(name, mask)


@functools.cache
def _reads_name(modeling: str) -> bool:
    """Whether the modeling file reads ``_attn_implementation`` where a twin's name would change what runs:
    anywhere but as the argument of ``get_interface`` or in an ``__init__`` (run before the patch, so on
    upstream's name). A file whose source cannot be read counts as reading it."""
    import ast
    import inspect

    try:
        tree = ast.parse(inspect.getsource(sys.modules[modeling]))
    except (KeyError, OSError, TypeError, SyntaxError):
        return True

    def reads(node: ast.AST, exact: bool) -> bool:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            exact = True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get_interface":
            return any(reads(n, exact) for n in ast.iter_child_nodes(node.func)) or any(
                reads(n, True if i == 0 else exact) for i, n in enumerate(node.args)) or any(
                reads(k, exact) for k in node.keywords)
        if isinstance(node, ast.Attribute) and node.attr == "_attn_implementation" and not exact:
            return True
        return any(reads(n, exact) for n in ast.iter_child_nodes(node))

    return reads(tree, False)


def route(model: Any, modules: list[Any], modeling: str) -> bool:
    """Run ``modules`` on registered twins; False (nothing changed): the modeling file's hooks are needed.

    Every config of ``modules`` must name a twinned implementation (or a twin: a repatched model) and the
    modeling file must not read the name; the name before is kept on ``model`` for :func:`restore`.
    """
    configs = {id(m.config): m.config for m in modules}
    names = {key: c._attn_implementation for key, c in configs.items()}
    upstream = {key: n[len(_PREFIX):] if isinstance(n, str) and n.startswith(_PREFIX) else n for key, n in names.items()}
    if _reads_name(modeling) or any(u not in TWINS for u in upstream.values()):
        return False
    register()
    before = model.__dict__.setdefault(_BEFORE, {})
    for key, config in configs.items():
        before.setdefault(key, (config, names[key], twin_name(upstream[key])))
        config._attn_implementation_internal = twin_name(upstream[key])  # this config only, not its sub-configs
    return True


def restore(model: Any) -> None:
    """Every config :func:`route` changed names its implementation before again (unless changed since)."""
    for config, name, twin in model.__dict__.pop(_BEFORE, {}).values():
        if config._attn_implementation == twin:
            config._attn_implementation_internal = name
