"""A per-layer encoding schedule: which layer gets which generator, which window and which temperature.

Production models no longer use one encoding for every layer: Command A (Hugging Face ``cohere2``,
the RNoPE-SWA layout of arXiv 2501.18795) rotates on three sliding-window layers of four and leaves
the fourth global and NoPE; SWAN-GPT (arXiv 2504.08719) interleaves the same two kinds; Llama 4 puts
a NoPE layer (with its temperature tuning) every fourth layer and chunked attention on the RoPE
layers; SmolLM3 a NoPE layer every fourth. Each layer is still a point of the family — a generator
X_ℓ — plus a visibility rule and possibly a logit temperature (:mod:`liepos.temperature`)::

    layer ℓ:  softmax_j(τ_ℓ(t_i, n_i) · c · q_iᵀ exp((t_i − s_j) X_ℓ) k_j + mask_ℓ(t_i, s_j)) v_j

with ``mask_ℓ`` the window: sliding (``t − s < window``, as transformers' sliding-window mask) or
chunked (``⌊s/chunk⌋ = ⌊t/chunk⌋``, Llama 4's ``attention_chunk_size``). :meth:`Schedule.attention`
runs layer ℓ through :func:`liepos.attention` (a :class:`~liepos.KVCache` per layer: decode equals
the full forward), :meth:`Schedule.encodings` gives the per-layer list a model takes, and
:data:`SCHEDULES` builds the named layouts by name.

>>> import torch, liepos as lp
>>> sch = build_schedule("rnope_swa", layers=4, head_dim=8, window=2)
>>> [(s.encoding.name, s.window) for s in sch]
[('rope', 2), ('rope', 2), ('rope', 2), ('nope', None)]
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from liepos._checks import check_choice, check_int, check_real, describe
from liepos.attend import KVCache, attention
from liepos.attention_call import key_times
from liepos.catalogue import nope, rope
from liepos.encoding import Encoding, as_positions
from liepos.temperature import Llama4Temperature, ScalableSoftmax, SwanLengthScaling, Temperature

__all__ = ["LayerSpec", "Schedule", "SCHEDULES", "build_schedule", "window_mask"]


def window_mask(qpos: torch.Tensor, kpos: torch.Tensor, *, window: int | None = None,
                chunk: int | None = None) -> torch.Tensor:
    """``(B, 1, Sq, Sk)`` True where a key at ``s`` is inside query ``t``'s window (causality is separate).

    Sliding: ``t − s < window``; chunked: ``⌊s/chunk⌋ = ⌊t/chunk⌋``. Times ``(B, Sq)`` / ``(B, Sk)``.

    >>> t = torch.arange(4.0).reshape(1, 4)
    >>> window_mask(t, t, window=2)[0, 0].int().tolist()
    [[1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    lag = qpos[:, None, :, None] - kpos[:, None, None, :]  # (B, 1, Sq, Sk)
    m = torch.ones_like(lag, dtype=torch.bool)
    if window is not None:
        m = m & (lag < window)
    if chunk is not None:
        m = m & (torch.floor(qpos / chunk)[:, None, :, None] == torch.floor(kpos / chunk)[:, None, None, :])
    return m


@dataclass(frozen=True)
class LayerSpec:
    """One layer: its :class:`~liepos.Encoding`, a sliding ``window`` or a ``chunk`` (or neither), a temperature."""

    encoding: Encoding
    window: int | None = None
    chunk: int | None = None
    temperature: Temperature | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.encoding, Encoding):
            raise TypeError(f"`encoding` must be a liepos.Encoding, got {describe(self.encoding)}")
        for name in ("window", "chunk"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), min=1)
                if self.encoding.num_axes is not None:
                    raise ValueError(f"`{name}`={getattr(self, name)} follows one time per token, but {self.encoding!r} "
                                     f"has {self.encoding.num_axes} position axes; give such a layer its visibility "
                                     f"as an attn_mask")
        if self.temperature is not None and not isinstance(self.temperature, Temperature):
            raise TypeError(f"`temperature` must be a liepos.temperature.Temperature, got {describe(self.temperature)}")


class Schedule:
    """A per-layer schedule: ``Schedule([LayerSpec, …])``, indexable by layer.

    The identity: layer ℓ of a schedule is ``lp.attention(q, k, v, spec.encoding,
    attn_mask=window_mask(t, s, …), temperature=spec.temperature)`` — nothing else.
    """

    def __init__(self, layers: Sequence[LayerSpec], name: str | None = None) -> None:
        layers = list(layers)
        if not layers or not all(isinstance(s, LayerSpec) for s in layers):
            raise TypeError(f"`layers` must be a non-empty sequence of LayerSpec, got {describe(layers)}")
        self.layers, self.name = layers, name

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerSpec:
        return self.layers[check_int("layer", layer, min=0, max=len(self.layers) - 1)]

    def __iter__(self) -> Iterator[LayerSpec]:
        return iter(self.layers)

    def __repr__(self) -> str:
        kinds = ",".join(f"{s.encoding.name}{'/w' if s.window else ''}{'/c' if s.chunk else ''}"
                         f"{'/τ' if s.temperature else ''}" for s in self.layers)
        return f"Schedule({self.name or ''}[{kinds}])"

    def encodings(self) -> list[Encoding]:
        """One encoding per layer (what :class:`liepos.explore.model.Decoder` takes as its per-layer list)."""
        return [s.encoding for s in self.layers]

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: Any = None,
                  key_positions: Any = None, *, cache: KVCache | None = None, **kwargs: Any) -> torch.Tensor:
        """Layer ``layer``'s attention: :func:`liepos.attention` with its encoding, window mask and temperature.

        The window follows the times, including the cached keys': a decode step through ``cache``
        sees exactly the keys the full forward's row sees. ``attn_mask`` in ``kwargs`` is combined.
        """
        spec = self[layer]
        if spec.window is not None or spec.chunk is not None:
            B, _, Sq, _ = q.shape
            new = key_times(k, positions, key_positions, B, Sq, None, cache)  # (B, Sk_new), as attention does
            kall = new if cache is None or not len(cache) else torch.cat((cache.held()[2].to(new.device), new), 1)
            if positions is None:
                qpos = kall[:, kall.shape[1] - Sq :]
            else:
                qpos = as_positions(positions, Sq, B).to(new.device).expand(B, Sq)
            m = window_mask(qpos, kall, window=spec.window, chunk=spec.chunk)  # (B, 1, Sq, Sk)
            user = kwargs.pop("attn_mask", None)
            kwargs["attn_mask"] = m if user is None else m & user
        return attention(q, k, v, spec.encoding, positions, key_positions, cache=cache,
                         temperature=spec.temperature, **kwargs)

    def by_layer_type(self, layer_types: Sequence[str]) -> dict[str, Encoding]:
        """``{layer_type: Encoding}`` of the rotating layers, for :func:`liepos.interop.patch_model` (which keeps
        the layers its family runs without rope NoPE, and their temperature, as upstream).

        ``layer_types``: the config's, one per layer. Layers of one type must share one encoding (else ValueError).
        """
        types = list(layer_types)
        if len(types) != len(self.layers):
            raise ValueError(f"`layer_types` has {len(types)} entries for a schedule of {len(self.layers)} layers")
        out: dict[str, Encoding] = {}
        for i, (kind, spec) in enumerate(zip(types, self.layers)):
            if spec.encoding.generator.is_orthogonal and not any(spec.encoding.generator.complex):
                continue  # a NoPE layer: patch_model leaves it to the family
            if kind in out and out[kind].version != spec.encoding.version:
                raise ValueError(f"layer {i} ({kind!r}) has another encoding than an earlier {kind!r} layer: "
                                 f"patch_model takes one encoding per layer type")
            out[kind] = spec.encoding
        return out

    @classmethod
    def from_hf(cls, config: Any) -> Schedule:
        """The layer layout of a transformers config: Cohere 2 (Command A), Llama 4, SmolLM3, or any config
        with ``layer_types`` / ``no_rope_layers``; the RoPE layers' encoding is :func:`liepos.from_hf` of it.

        Reads ``no_rope_layers`` (1 = RoPE), ``layer_types`` (``sliding_attention`` with ``sliding_window``,
        ``chunked_attention`` with ``attention_chunk_size``), Llama 4's ``attn_temperature_tuning`` with
        ``floor_scale`` and ``attn_scale`` (on its NoPE layers, as transformers applies it) and Cohere 2's
        rule that its full-attention layers carry no RoPE.
        """
        from_hf = importlib.import_module("liepos.interop").from_hf
        get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
        cfg = get("text_config", None) or config
        if cfg is not config:
            get = cfg.get if isinstance(cfg, dict) else lambda key, default=None: getattr(cfg, key, default)
        n = check_int("num_hidden_layers", get("num_hidden_layers"), min=1)
        types = list(get("layer_types", None) or ["full_attention"] * n)
        model = get("model_type", "")
        uses_rope = list(get("no_rope_layers", None) or [int(model != "cohere2" or t == "sliding_attention")
                                                           for t in types])
        enc = from_hf(cfg)
        if isinstance(enc, dict):
            raise ValueError(f"per-layer-type rope parameters ({sorted(enc)}) are not read by Schedule.from_hf")
        hd = enc.content_dim
        tau = None
        if get("attn_temperature_tuning", False):
            tau = Llama4Temperature(get("floor_scale", 8192), get("attn_scale", 0.1))
        layers = []
        for i, kind in enumerate(types):
            kind = check_choice(f"layer_types[{i}]", kind, ("full_attention", "sliding_attention", "chunked_attention"))
            layers.append(LayerSpec(
                enc if uses_rope[i] else nope(hd),
                window=get("sliding_window") if kind == "sliding_attention" else None,
                chunk=get("attention_chunk_size") if kind == "chunked_attention" else None,
                temperature=None if uses_rope[i] else tau,
            ))
        return cls(layers, name=model or None)


# ---------------------------------------------------------------------- the named layouts
def _interleaved(layers: int, head_dim: int, every: int, base: float, rope_layer: Callable[[Encoding], LayerSpec],
                 nope_layer: Callable[[Encoding], LayerSpec], name: str) -> Schedule:
    """Layer i is ``nope_layer`` when ``(i + 1) % every == 0`` (transformers' rule), else ``rope_layer``."""
    layers = check_int("layers", layers, min=1)
    every = check_int("every", every, min=1)
    r, z = rope(head_dim, check_real("base", base, positive=True), "half"), nope(head_dim)
    return Schedule([nope_layer(z) if (i + 1) % every == 0 else rope_layer(r) for i in range(layers)], name=name)


def rnope_swa(layers: int, head_dim: int, num_heads: int = 1, *, window: int = 4096, every: int = 4,
              base: float = 10000.0) -> Schedule:
    """RNoPE-SWA (Yang et al., Cohere, arXiv 2501.18795; Command A = ``cohere2``): RoPE on sliding-window
    layers, NoPE on every ``every``-th (global) layer."""
    window = check_int("window", window, min=1)
    return _interleaved(layers, head_dim, every, base, lambda e: LayerSpec(e, window=window), LayerSpec, "rnope_swa")


def swan_gpt(layers: int, head_dim: int, num_heads: int = 1, *, window: int = 512, every: int = 4,
             base: float = 10000.0, alpha: float | None = None, train_length: int | None = None) -> Schedule:
    """SWAN-GPT (Puvvada et al., NVIDIA, arXiv 2504.08719): NoPE global layers interleaved with SWA-RoPE
    layers; with ``alpha``, its inference-time length scaling
    :class:`~liepos.temperature.SwanLengthScaling` ``(alpha, train_length)`` on the NoPE global layers."""
    window = check_int("window", window, min=1)
    if alpha is not None and train_length is None:
        raise ValueError("swan_gpt: alpha needs the model's train_length (the length it was trained at), got none")
    tau = None if alpha is None or train_length is None else SwanLengthScaling(alpha=alpha, train_length=train_length)
    return _interleaved(layers, head_dim, every, base, lambda e: LayerSpec(e, window=window),
                        lambda e: LayerSpec(e, temperature=tau), "swan_gpt")


def llama4(layers: int, head_dim: int, num_heads: int = 1, *, every: int = 4, chunk: int | None = 8192,
           base: float = 500000.0, floor_scale: float = 8192.0, attn_scale: float | None = 0.1) -> Schedule:
    """Llama 4 (iRoPE): chunked-attention RoPE layers, a NoPE global layer every ``every``-th with the
    temperature tuning :class:`~liepos.temperature.Llama4Temperature` (``attn_scale=None``: none)."""
    tau = None if attn_scale is None else Llama4Temperature(floor_scale, attn_scale)
    return _interleaved(layers, head_dim, every, base, lambda e: LayerSpec(e, chunk=chunk),
                        lambda e: LayerSpec(e, temperature=tau), "llama4")


def smollm3(layers: int, head_dim: int, num_heads: int = 1, *, every: int = 4, base: float = 5000000.0) -> Schedule:
    """SmolLM3 (Hugging Face): RoPE on every layer but every ``every``-th, which is NoPE (``no_rope_layers``)."""
    return _interleaved(layers, head_dim, every, base, LayerSpec, LayerSpec, "smollm3")


def ssmax(layers: int, head_dim: int, num_heads: int = 1, *, s: float = 0.43, base: float = 10000.0) -> Schedule:
    """RoPE on every layer with Scalable-Softmax's temperature ``s · log n`` (arXiv 2501.19399; one fixed ``s``
    for every head here, learned per head in the paper)."""
    T = ScalableSoftmax(s)
    return _interleaved(layers, head_dim, layers + 1, base, lambda e: LayerSpec(e, temperature=T), LayerSpec, "ssmax")


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "rnope_swa": rnope_swa,
    "ssmax": ssmax,
    "swan_gpt": swan_gpt,
    "llama4": llama4,
    "smollm3": smollm3,
}
"""Every named layout, one signature: ``SCHEDULES[name](layers, head_dim, num_heads=1, **options)``."""


def build_schedule(name: str, layers: int, head_dim: int, num_heads: int = 1, **options: Any) -> Schedule:
    """``SCHEDULES[name](layers, head_dim, num_heads, **options)``, the unknown name named.

    >>> build_schedule("llama4", layers=4, head_dim=8)[3].temperature
    Llama4Temperature(floor_scale=8192, attn_scale=0.1)
    """
    name = check_choice("name", name, sorted(SCHEDULES))
    return SCHEDULES[name](layers, head_dim, num_heads, **options)
