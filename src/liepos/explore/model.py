"""A small decoder in plain PyTorch whose attention is :func:`liepos.attention`.

Embedding → ``layers`` pre-norm blocks (LayerNorm → causal attention with an Encoding →
residual; LayerNorm → MLP → residual) → LayerNorm → tied output head. No absolute position
embedding: the encoding is the only source of position (besides the causal mask).

The encoding is pluggable per layer and per head: ``encoding`` is one spec (string such as
``"rope"``, ``"rope+decay"``, or an :class:`~liepos.Encoding`) for every layer, or a list with one
spec per layer; within a layer, a string ``"rope|alibi"`` or a tuple ``("rope", lp.alibi(32, num_heads=2))``
splits the heads into contiguous equal groups (an Encoding in a tuple must be built for its group).
A per-layer schedule (:mod:`liepos.schedule`) is the string ``"schedule:<name>[:key=value…]"`` (e.g.
``"schedule:rnope_swa:window=64"``, ``"schedule:ssmax"``; :mod:`liepos.explore.schedule_rows`), a
:class:`~liepos.Schedule`, or a :class:`~liepos.LayerSpec` per layer (or a tuple of them, one per head
group): each layer or head group then gets its encoding, window and temperature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import cast

import torch
from torch import nn

from liepos.attend import attention
from liepos.encoding import Encoding
from liepos.explore.schedule_rows import schedule_layers
from liepos.explore.spec import SpecEncoding, is_schedule_row, split_heads
from liepos.schedule import LayerSpec, Schedule, window_mask

# an evaluation-time change of an encoding (a context-extension map): (encoding, sequence length) -> encoding
Transform = Callable[[Encoding, int], Encoding]

__all__ = ["Block", "Decoder", "ModelConfig", "Transform", "layer_specs", "resolve_schedule"]


@dataclass
class ModelConfig:
    vocab_size: int = 256
    d_model: int = 128
    layers: int = 5
    heads: int = 4
    mlp_ratio: int = 4

    def to_dict(self) -> dict:
        return asdict(self)


class _Fixed(nn.Module):
    """An :class:`~liepos.Encoding` given directly, as a module: ``forward()`` returns it."""

    def __init__(self, enc: Encoding) -> None:
        super().__init__()
        self.enc, self.name = enc, enc.name

    def forward(self) -> Encoding:
        return self.enc

    def canonical(self) -> tuple[Encoding, None]:
        return self.enc, None


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, encoding, mlp_ratio: int = 4) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} must be divisible by heads {heads}")
        self.heads, self.head_dim = heads, d_model // heads
        spans: list[tuple[int, int]]
        specs: list[Encoding | str]  # a fixed encoding or a spec per head group
        if isinstance(encoding, LayerSpec):  # a schedule's layer: one encoding, window and temperature
            encoding = (encoding,)
        layers: list[LayerSpec | None]  # a schedule's window and temperature per head group (None: causal only)
        if isinstance(encoding, Encoding):
            spans, specs, layers = [(0, heads)], [encoding], [None]
        elif isinstance(encoding, (list, tuple)):
            # one spec, Encoding or LayerSpec per contiguous group of heads
            n = len(encoding)
            if not 1 <= n <= heads or heads % n:
                raise ValueError(f"{n} head groups do not divide {heads} heads evenly")
            w = heads // n
            spans = [(i * w, (i + 1) * w) for i in range(n)]
            specs = [e.encoding if isinstance(e, LayerSpec) else e for e in encoding]
            layers = [e if isinstance(e, LayerSpec) else None for e in encoding]
        else:
            groups = split_heads(encoding, heads)
            spans, specs = [(a, b) for a, b, _ in groups], [s for _, _, s in groups]
            layers = [None] * len(spans)
        self.spans, self.layers = spans, layers
        # learned temperatures (a schedule row's Scalable-Softmax s) train here
        self.temperatures = nn.ModuleList()
        for spec in layers:
            if spec is not None and isinstance(spec.temperature, nn.Module):
                self.temperatures.append(spec.temperature)
        # one module per head group: fixed encodings, or learned generators whose parameters train here
        self.encoders = nn.ModuleList(
            _Fixed(s) if isinstance(s, Encoding) else SpecEncoding(s, self.head_dim, b - a)
            for (a, b), s in zip(spans, specs)
        )
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(), nn.Linear(mlp_ratio * d_model, d_model)
        )

    @staticmethod
    def _schedule_kwargs(layer: LayerSpec | None, S: int, device: torch.device) -> dict:
        """A schedule group's window mask and temperature for positions 0 … S − 1 (nothing otherwise)."""
        if layer is None:
            return {}
        kw: dict = {"temperature": layer.temperature}
        if layer.window is not None or layer.chunk is not None:
            t = torch.arange(S, dtype=torch.float64, device=device)[None]  # (1, S)
            kw["attn_mask"] = window_mask(t, t, window=layer.window, chunk=layer.chunk)  # (1, 1, S, S)
        return kw

    @property
    def groups(self) -> list[tuple[int, int, Encoding]]:
        """``(first head, end head, encoding)`` per head group, with the learned parts' current values."""
        return [(a, b, m()) for (a, b), m in zip(self.spans, self.encoders)]

    def canonical(self) -> list[tuple[Encoding, torch.Tensor | None]]:
        """Per head group: its encoding in canonical blocks and the learned diagonal basis ``p`` (or None)."""
        # __init__ puts only _Fixed and SpecEncoding modules in self.encoders (a ModuleList types them Module)
        return [cast("_Fixed | SpecEncoding", m).canonical() for m in self.encoders]

    def forward(self, x: torch.Tensor, transform: Transform | None = None) -> torch.Tensor:
        B, S, D = x.shape
        qkv = self.qkv(self.ln1(x)).view(B, S, 3, self.heads, self.head_dim)  # (B, S, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, S, hd)
        outs = []
        for (a, b), (enc, p), layer in zip(self.spans, self.canonical(), self.layers):
            # canonical blocks, and the learned diagonal basis P = diag(p) or None
            enc = transform(enc, S) if transform is not None else enc
            qg, kg = (q[:, a:b], k[:, a:b]) if p is None else (q[:, a:b] * p.to(q.dtype), k[:, a:b] / p.to(k.dtype))
            # positions default to arange(S) (bottom-right aligned, causal): the fast path of liepos.attention
            outs.append(attention(qg, kg, v[:, a:b], enc, causal=True, **self._schedule_kwargs(layer, S, x.device)))
        y = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]  # (B, H, S, hd)
        y = y.transpose(1, 2).reshape(B, S, D)  # (B, S, D)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


def resolve_schedule(encoding, config: ModelConfig):
    """A schedule row ``"schedule:<name>[:key=value…]"`` (:func:`~liepos.explore.schedule_rows.schedule_layers`)
    or a :class:`~liepos.Schedule` -> one item per layer (a LayerSpec, or a LayerSpec per head group); else as given."""
    if is_schedule_row(encoding):
        return schedule_layers(encoding, config.layers, config.d_model // config.heads, config.heads)
    return list(encoding) if isinstance(encoding, Schedule) else encoding


def layer_specs(encoding, config: ModelConfig) -> list[LayerSpec]:
    """Every LayerSpec of a schedule row or Schedule, layer by layer and head group by head group."""
    out: list[LayerSpec] = []
    for item in resolve_schedule(encoding, config):
        out.extend(item if isinstance(item, tuple) else [item])
    return out


class Decoder(nn.Module):
    """``Decoder(config, encoding)``; ``forward(tokens (B, S)) -> logits (B, S, vocab)``."""

    def __init__(self, config: ModelConfig, encoding="rope") -> None:
        super().__init__()
        self.config = config
        encoding = resolve_schedule(encoding, config)
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
            if isinstance(m, nn.Linear) and m.bias is not None:  # an Embedding has no bias
                nn.init.zeros_(m.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: torch.Tensor, transform: Transform | None = None) -> torch.Tensor:
        """Logits; ``transform(enc, length)`` replaces every encoding for this call (evaluation-time scaling)."""
        x = self.embed(tokens)  # (B, S, D)
        for blk in self.blocks:
            x = blk(x, transform)
        return self.ln_f(x) @ self.embed.weight.T  # (B, S, vocab), tied head
