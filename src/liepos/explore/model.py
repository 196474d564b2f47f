"""A small decoder in plain PyTorch whose attention is :func:`liepos.attention`.

Embedding → ``layers`` pre-norm blocks (LayerNorm → causal attention with an Encoding →
residual; LayerNorm → MLP → residual) → LayerNorm → tied output head. No absolute position
embedding: the encoding is the only source of position (besides the causal mask).

The encoding is pluggable per layer and per head: ``encoding`` is one spec (string such as
``"rope"``, ``"rope+decay"``, or an :class:`~liepos.Encoding`) for every layer, or a list with one
spec per layer; within a layer, a string ``"rope|alibi"`` or a tuple ``("rope", lp.alibi(2, 32))``
splits the heads into contiguous equal groups (an Encoding in a tuple must be built for its group).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

import liepos as lp
from liepos.encoding import Encoding
from liepos.explore.spec import from_spec, split_heads

__all__ = ["ModelConfig", "Decoder", "Block"]


@dataclass
class ModelConfig:
    vocab_size: int = 256
    d_model: int = 128
    layers: int = 5
    heads: int = 4
    mlp_ratio: int = 4

    def to_dict(self) -> dict:
        return asdict(self)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, encoding, mlp_ratio: int = 4) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} must be divisible by heads {heads}")
        self.heads, self.head_dim = heads, d_model // heads
        if isinstance(encoding, Encoding):
            self.groups = [(0, heads, encoding)]
        elif isinstance(encoding, (list, tuple)):
            # one spec or Encoding per contiguous group of heads
            n = len(encoding)
            if not 1 <= n <= heads or heads % n:
                raise ValueError(f"{n} head groups do not divide {heads} heads evenly")
            w = heads // n
            self.groups = [(i * w, (i + 1) * w, from_spec(e, self.head_dim, w)) for i, e in enumerate(encoding)]
        else:
            self.groups = [(a, b, from_spec(s, self.head_dim, b - a)) for a, b, s in split_heads(encoding, heads)]
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(), nn.Linear(mlp_ratio * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        qkv = self.qkv(self.ln1(x)).view(B, S, 3, self.heads, self.head_dim)  # (B, S, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, S, hd)
        # positions default to arange(S) (bottom-right aligned, causal): the fast path of lp.attention
        outs = [lp.attention(q[:, a:b], k[:, a:b], v[:, a:b], enc, causal=True) for a, b, enc in self.groups]
        y = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]  # (B, H, S, hd)
        y = y.transpose(1, 2).reshape(B, S, D)  # (B, S, D)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    """``Decoder(config, encoding)``; ``forward(tokens (B, S)) -> logits (B, S, vocab)``."""

    def __init__(self, config: ModelConfig, encoding="rope") -> None:
        super().__init__()
        self.config = config
        per_layer = list(encoding) if isinstance(encoding, (list, tuple)) else [encoding] * config.layers
        if len(per_layer) != config.layers:
            raise ValueError(f"got {len(per_layer)} per-layer encodings for {config.layers} layers")
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            Block(config.d_model, config.heads, e, config.mlp_ratio) for e in per_layer
        )
        self.ln_f = nn.LayerNorm(config.d_model)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, S, D)
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.embed.weight.T  # (B, S, vocab), tied head
