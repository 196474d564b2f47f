"""Storage layouts of rotation planes as a change of basis on the q/k projection weights.

A layout says which two dims of a head form a rotation plane:

* ``"interleaved"`` (aliases ``"meta"``, ``"gptj"``): plane k is dims (2k, 2k + 1) — Meta's
  complex RoPE, GPT-J, torchtune, torchscale, rotary-embedding-torch;
* ``"half"`` (aliases ``"hf"``, ``"neox"``): plane k is dims (k, k + P), P = rotary_dim/2 — Hugging
  Face ``rotate_half``, GPT-NeoX.

Dims past ``rotary_dim`` (partial rotary) are not rotated and keep their place. Between two layouts
the head dims differ by a fixed permutation Π, so with ``W' = Π W`` (rows of each head permuted)::

    RoPE_to(Π q)ᵀ RoPE_to(Π k) = RoPE_from(q)ᵀ RoPE_from(k)

which is what Hugging Face's ``convert_llama_weights_to_hf.permute`` does to Meta checkpoints.
"""

from __future__ import annotations

import torch

from liepos.generator import Generator, direct_sum
from liepos.tables import make_plan

__all__ = ["LAYOUT_ALIASES", "layout_permutation", "permute_qk_weights"]

LAYOUT_ALIASES = {
    "interleaved": "interleaved", "meta": "interleaved", "gptj": "interleaved",
    "half": "half", "hf": "half", "neox": "half",
}


def _layout(name: object, arg: str) -> str:
    if not isinstance(name, str) or name not in LAYOUT_ALIASES:
        raise ValueError(f"{arg} must be one of {sorted(LAYOUT_ALIASES)}, got {name!r}")
    return LAYOUT_ALIASES[name]


def _storage(layout: str, head_dim: int, rotary_dim: int) -> torch.Tensor:
    """``pos[c]``: the storage index of canonical dim c (rotation planes (2k, 2k+1), then real dims).

    The core's :func:`liepos.tables.make_plan` is the one writer of that permutation; a generator
    of ``rotary_dim/2`` planes and ``head_dim − rotary_dim`` real dims gives its structure.
    """
    P, rest = rotary_dim // 2, head_dim - rotary_dim
    zp, zr = torch.zeros(P, dtype=torch.float64), torch.zeros(rest, dtype=torch.float64)
    blocks = ([Generator(zp, zp, [1] * P, complex=[True] * P)] if P else []) + ([Generator(zr, zr, [1] * rest)] if rest else [])
    return make_plan(direct_sum(*blocks), layout).perm


def layout_permutation(head_dim: int, from_layout: str, to_layout: str, rotary_dim: int | None = None) -> torch.Tensor:
    """Indices ``idx`` with ``x_to = x_from[..., idx]`` for one head of ``head_dim`` dims.

    >>> layout_permutation(8, "interleaved", "half").tolist()
    [0, 2, 4, 6, 1, 3, 5, 7]
    >>> layout_permutation(8, "half", "interleaved").tolist()
    [0, 4, 1, 5, 2, 6, 3, 7]
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    rd = head_dim if rotary_dim is None else rotary_dim
    if isinstance(rd, bool) or not isinstance(rd, int) or rd < 0 or rd > head_dim or rd % 2:
        raise ValueError(
            f"rotary_dim must be an even int between 0 and head_dim={head_dim}, got {rotary_dim!r}"
            + (" (head_dim is odd: pass the rotated part as rotary_dim)" if rotary_dim is None else "")
        )
    src = _storage(_layout(from_layout, "from_layout"), head_dim, rd)
    dst = _storage(_layout(to_layout, "to_layout"), head_dim, rd)
    idx = torch.empty(head_dim, dtype=torch.long)
    idx[dst] = src  # the new slot of canonical c reads the old slot of canonical c
    return idx


def permute_qk_weights(
    w: torch.Tensor,
    num_heads: int,
    from_layout: str,
    to_layout: str,
    *,
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Permute the rows of a q or k projection (weight ``(heads·head_dim, in)`` or bias ``(heads·head_dim,)``).

    Pass ``num_heads`` = the number of query heads for ``q_proj`` and of key/value heads for
    ``k_proj`` (grouped-query attention). The result is a new tensor (a gather, so the round trip
    ``to → from`` is the identity exactly); ``rotary_dim`` (default: the whole head) limits the
    permutation to the rotated dims of each head.

    Meta → Hugging Face is ``permute_qk_weights(w, n_heads, "interleaved", "half")``, the same
    rows as ``convert_llama_weights_to_hf.permute``.

    >>> w = torch.arange(8.0).reshape(8, 1)
    >>> permute_qk_weights(w, 2, "meta", "hf").flatten().tolist()
    [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
    """
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() not in (1, 2):
        raise ValueError(f"w must be a weight (out, in) or a bias (out,), got shape {tuple(w.shape)}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    out = w.shape[0]
    if out % num_heads:
        raise ValueError(f"w has {out} rows, not a multiple of num_heads={num_heads}")
    head_dim = out // num_heads
    idx = layout_permutation(head_dim, from_layout, to_layout, rotary_dim)
    # (heads·head_dim, …) -> (heads, head_dim, …) -> permute the head dims -> back
    full = (torch.arange(num_heads)[:, None] * head_dim + idx[None, :]).reshape(-1).to(w.device)
    return w.index_select(0, full)
