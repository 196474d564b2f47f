"""Hugging Face's own rotary code as a black-box encoder, built from a small config with random weights.

A model family is any transformers model type (``"llama"``, ``"mistral"``, ``"qwen2"``, …) whose
modeling module has a ``<Family>RotaryEmbedding``: the family table is transformers' own
``CONFIG_MAPPING``, so no list is kept here. transformers is imported inside the functions only
(``import liepos`` never loads it).

The defining identity of the wrapped encoder is upstream's: ``encode(x, t) = x cos(tω) + rotate_half(x)
sin(tω)`` with ``ω = rotary.inv_freq`` (times ``attention_scaling``), which :func:`liepos.diagnose`
recovers as 32 rotation blocks for a head dim of 64. For the default rope type that is liepos's RoPE
in the half layout, up to HF's float32 angles:

>>> import torch, liepos as lp
>>> enc, rotary = hf_encoder("llama", head_dim=8)
>>> x, t = torch.randn(1, 2, 5, 8), torch.arange(5)
>>> bool(torch.allclose(enc(x, t), lp.rope(8, layout="half").query(x, t), atol=1e-6))
True
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from liepos._checks import check_int, check_real, describe

__all__ = ["hf_encoder", "hf_rotary_encoder"]

Encoder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# the probe's config: the rotary embedding only reads head_dim, so two heads are enough
_HEADS = 2
# the logger transformers validates rope parameters with (it warns instead of raising)
_ROPE_LOGGER = "transformers.modeling_rope_utils"


def hf_rotary_encoder(rotary: Any, apply: Callable | None = None) -> Encoder:
    """Wrap a Hugging Face rotary module (``forward(x, position_ids) -> (cos, sin)``) as an encoder.

    The positions ``(seq,)`` become ``position_ids`` ``(1, seq)``; the tensor is rotated by
    ``apply_rotary_pos_emb`` (Llama's unless ``apply`` is given).
    """
    rotate: Callable
    if apply is None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as rotate
    else:
        rotate = apply

    def encode(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        ids = positions.reshape(1, -1) if positions.dim() == 1 else positions  # (seq,) -> (1, seq)
        cos, sin = rotary(x, ids)
        q, _ = rotate(x, x, cos, sin)
        return q

    config = getattr(rotary, "config", None)
    encode.dim = getattr(config, "head_dim", None)  # type: ignore[attr-defined]
    return encode


def _family(model: str) -> tuple[type, Any, str]:
    """(config class, modeling module, rotary class name) of a transformers model type."""
    from transformers import CONFIG_MAPPING

    if not isinstance(model, str):
        raise TypeError(f"`model` must be a transformers model type (str), got {describe(model)}")
    try:
        config_class = CONFIG_MAPPING[model]
    except KeyError:
        raise ValueError(f"`model` must be a transformers model type with a rotary embedding (e.g. llama, "
                         f"mistral, qwen2), got {model!r}") from None
    modeling = importlib.import_module(config_class.__module__.replace(".configuration_", ".modeling_"))
    rotary_name = config_class.__name__.removesuffix("Config") + "RotaryEmbedding"
    if not hasattr(modeling, rotary_name):
        raise ValueError(f"`model` must be a transformers model type with a rotary embedding, got {model!r} "
                         f"({modeling.__name__} has no {rotary_name})")
    return config_class, modeling, rotary_name


def _rope_parameters(rope: dict | None, rope_theta: float) -> dict:
    """The config's ``rope_parameters``: ``rope`` over the defaults, its rope type checked by name."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope is not None and not isinstance(rope, dict):
        raise TypeError(f"`rope` must be a dict of rope parameters, got {describe(rope)}")
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": rope_theta}
    params.update(rope or {})
    if "type" in params and "rope_type" not in (rope or {}):
        params["rope_type"] = params.pop("type")  # the old spelling
    known = ["default", *ROPE_INIT_FUNCTIONS]
    if params["rope_type"] not in known:
        raise ValueError(f"`rope['rope_type']` must be one of {known}, got {params['rope_type']!r}")
    return params


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def hf_encoder(model: str = "llama", rope: dict | None = None, head_dim: int = 64,
               max_position_embeddings: int = 2048, rope_theta: float = 10000.0) -> tuple[Encoder, Any]:
    """Build Hugging Face's own rotary embedding for a model family and rope parameters.

    Returns ``(encoder, rotary_module)``; ``rope`` goes into the config's ``rope_parameters``
    (transformers ≥ 5; ``rope_scaling`` on older versions). Parameters that transformers' validation
    warns about (a missing or unknown key, a factor below 1, ...) are refused with a ValueError that
    quotes the warning: upstream would otherwise run on them.
    """
    head_dim = check_int("head_dim", head_dim, min=2, even=True)
    max_position_embeddings = check_int("max_position_embeddings", max_position_embeddings, min=1)
    rope_theta = check_real("rope_theta", rope_theta, positive=True)
    import transformers

    config_class, modeling, rotary_name = _family(model)
    params = _rope_parameters(rope, rope_theta)
    kw: dict[str, Any] = dict(head_dim=head_dim, hidden_size=head_dim * _HEADS, num_attention_heads=_HEADS,
                              num_key_value_heads=_HEADS, max_position_embeddings=max_position_embeddings)
    logger, collect = logging.getLogger(_ROPE_LOGGER), _Collect()
    propagate, level = logger.propagate, logger.level
    logger.propagate = False
    logger.setLevel(logging.WARNING)  # heard even when the caller silenced transformers (set_verbosity_error)
    once = getattr(type(logger), "warning_once", None)  # transformers' once-per-process warnings: judge afresh
    if once is not None and hasattr(once, "cache_clear"):
        once.cache_clear()
    logger.addHandler(collect)
    try:
        if int(transformers.__version__.split(".")[0]) >= 5:
            config = config_class(rope_parameters=params, **kw)
        else:  # pragma: no cover - older transformers
            theta = params.pop("rope_theta")
            config = config_class(rope_scaling=params if params.get("rope_type") != "default" else None,
                                  rope_theta=theta, **kw)
    except KeyError as err:  # transformers' message for a missing required key
        raise ValueError(f"`rope` {rope!r} is refused by transformers' validation: {err.args[0]}") from None
    finally:
        logger.removeHandler(collect)
        logger.propagate = propagate
        logger.setLevel(level)
    if collect.messages:
        raise ValueError(f"`rope` {rope!r} is refused by transformers' validation: {'; '.join(collect.messages)}")
    rotary = getattr(modeling, rotary_name)(config)
    enc = hf_rotary_encoder(rotary, getattr(modeling, "apply_rotary_pos_emb", None))
    enc.dim = head_dim  # type: ignore[attr-defined]
    return enc, rotary
