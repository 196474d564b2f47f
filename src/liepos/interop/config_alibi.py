"""ALiBi and absolute positions of a transformers config: the slopes as the family computes them (BLOOM's
and MPT's float32 formulas), and which kind of positions a config's family uses (rotary, ALiBi, learned
absolute positions, none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from liepos.catalogue import alibi
from liepos.encoding import Encoding
from liepos.interop.config_source import ConfigSource
from liepos.interop.families import Family

__all__ = ["config_alibi", "position_kind"]


def _f32_bloom_slopes(num_heads: int) -> torch.Tensor:
    """Bloom's (and Falcon's) ``_get_alibi_slopes``, in float32 as upstream."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        n = min(closest, num_heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * n, 2, dtype=torch.int32))])
    return slopes


def _f32_mpt_slopes(num_heads: int, bias_max: Any) -> torch.Tensor:
    """MPT's ``build_mpt_alibi_tensor`` slopes (another order than Bloom's for other head counts)."""
    n2 = 2 ** math.ceil(math.log2(num_heads))
    slopes = 1.0 / torch.pow(2, torch.arange(1, n2 + 1, dtype=torch.int64).float() * (bias_max / n2))
    if n2 != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


def config_alibi(src: ConfigSource, family: Family) -> Encoding:
    """Bloom, MPT, Falcon(alibi=True): ``qᵀk/√d − m_h (t − s)`` with the model's own slopes.

    Bloom and MPT add ``m_h·s`` after the ``1/√d`` scaling; Falcon adds it before, so its
    slopes in that identity are ``m_h/√d``.
    """
    if family.model_type == "mpt":
        attn = src.get("attn_config") or {}
        bias_max = attn.get("alibi_bias_max", 8) if isinstance(attn, Mapping) else getattr(attn, "alibi_bias_max", 8)
        heads, hidden = src.get("n_heads"), src.get("d_model")
    else:
        heads = src.get("num_attention_heads") or src.get("n_head")
        hidden = src.get("hidden_size") or src.get("n_embed")
    if heads is None or hidden is None:
        raise ValueError(f"the {family.model_type} config has no head count or hidden size to read its ALiBi from")
    slopes = _f32_mpt_slopes(int(heads), bias_max) if family.model_type == "mpt" else _f32_bloom_slopes(int(heads))
    head_dim = int(hidden) // int(heads)
    slopes = slopes.to(torch.float64)
    if family.model_type == "falcon":
        # Falcon adds its alibi tensor before the 1/√d softmax scaling (eager) or as alibi/√d (sdpa)
        slopes = slopes / math.sqrt(head_dim)
    enc = alibi(head_dim, num_heads=int(heads), slopes=slopes)
    return enc.replace(name=f"hf:alibi[{family.model_type}]")


def position_kind(src: ConfigSource, family: Family | None) -> str:
    if family is not None and family.model_type == "falcon":
        return "alibi" if src.get("alibi", False) else "rope"
    if family is not None and family.model_type == "mpt":
        attn = src.get("attn_config") or {}
        on = attn.get("alibi", True) if isinstance(attn, Mapping) else getattr(attn, "alibi", True)
        if not on:
            raise ValueError("an MPT config with attn_config.alibi=False has no position encoding liepos can read")
    return "rope" if family is None else family.positions
