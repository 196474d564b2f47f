"""Vision towers whose rotary module reads one (h, w) pair per patch: liepos' axial rope in their place.

A Qwen2-VL-style tower (Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V, …) computes, from its image grid,
``position_ids`` of shape ``(patches, 2)`` (each patch's row and column), turns them in its
``*VisionRotaryEmbedding`` into ``cos, sin`` of shape ``(patches, head_dim)``, and each attention
calls the modeling file's ``apply_rotary_pos_emb_vision(q, k, cos, sin)`` on q and k of shape
``(patches, heads, head_dim)``. liepos recovers what that computes with the probe discipline of the
text path (:mod:`liepos.interop.hf_verify`): basis vectors through upstream's apply, one axis moved
at a time, give the rotation planes, their layout (``half``: ``(k, k + d/2)``; ``interleaved``), the
axis each plane turns with, its frequency and direction; the frequencies are the rotary module's
own ``inv_freq`` (each probed angle must be one of them). The encoding is a 2-axis rotation
(:class:`liepos.Generator` with ``axes=2``) and is **proven** before anything changes: random q, k
at random (h, w) pairs, small and large, one call each ::

    apply(q, (h, w))ᵀ apply(k, (h', w')) == enc.query(q, (h, w))ᵀ enc.key(k, (h', w'))

to float32 rounding; otherwise refused with what did not match.

The patch: each rotary module of the tower answers upstream's ``cos, sin`` with its ``(h, w)`` pairs
appended to ``cos`` as two more columns (so that whatever the tower does with the position
embeddings between the rotary module and the attention, a window reordering of the patches
included, carries them along), and the modeling file's ``apply_rotary_pos_emb_vision``, inside a
patched attention, reads the pairs back and rotates q and k with liepos' encoding; anywhere else it
is upstream's. :func:`release` puts the file's function back once no patched tower needs it.

transformers is imported inside the functions only.
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
import math
import re
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from liepos.encoding import Encoding
from liepos.generator import Generator

__all__ = ["VISION_APPLY", "VisionRope", "vision_rope", "patch_vision", "release"]

VISION_APPLY = "apply_rotary_pos_emb_vision"
# an entry of a probe matrix below this is a zero (float32 cos/sin are exact to ~6e-8)
_ZERO = 1e-5
_TIMES = (1, 2, 3, 5, 4093)
_EPS32 = 2.0**-24
# the attention running now in a patched tower (its encoding), None elsewhere
# (its encoding, whether upstream's apply was proven to broadcast over a batch of q, k the same way)
_ACTIVE: contextvars.ContextVar[tuple[Encoding, bool] | None] = contextvars.ContextVar("liepos_vision", default=None)
_USERS: dict[str, weakref.WeakSet] = {}


@dataclass(frozen=True)
class VisionRope:
    """A tower's patch rope: its modeling module, rotary class, upstream's apply, head dim and attention classes."""

    modeling: Any
    rotary: Any
    apply: Any
    head_dim: int
    attention: tuple[str, ...]


def _refuse(model_type: Any, why: str) -> ValueError:
    return ValueError(f"model_type {model_type!r}: its vision rope (a rotary module reading one (h, w) pair per patch) "
                      f"was probed in its modeling code, which liepos cannot reproduce: {why}. liepos refuses rather "
                      "than return an encoding that differs from upstream")


def _reads_pairs(module: Any, head_dim: int) -> bool:
    """Whether a rotary module answers ``(patches, 2)`` position_ids with cos and sin of ``(patches, head_dim)``."""
    try:
        cos, sin = module(torch.zeros(1, 1, 1, head_dim), torch.zeros(5, 2, dtype=torch.long))
    except Exception:  # noqa: BLE001 - not a patch rope
        return False
    return tuple(cos.shape) == (5, head_dim) and tuple(sin.shape) == (5, head_dim)


def _calls(cls: type, name: str) -> bool:
    forward = getattr(cls, "forward", None)
    code = getattr(inspect.unwrap(forward), "__code__", None) if forward is not None else None
    return code is not None and name in code.co_names


def vision_rope(model: Any, config: Any) -> VisionRope | None:
    """The patch rope of a vision tower whose own config is ``config``, or None when ``model`` is not one
    (its rotary modules are not of ``config``, or read positions another way)."""
    name = type(config).__module__.replace(".configuration_", ".modeling_")
    try:
        modeling = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - no modeling file: not a tower liepos can probe
        return None
    apply = getattr(modeling, VISION_APPLY, None)
    apply = getattr(apply, "_liepos_upstream", apply)
    if apply is None:
        return None
    rotaries = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")
                and type(m).__module__ == modeling.__name__ and getattr(m, "config", None) is config]
    if not rotaries or len({type(m) for m in rotaries}) != 1:
        return None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if not _reads_pairs(type(rotaries[0])(config), int(head_dim)):
        return None
    attention = sorted({type(m).__name__ for m in model.modules()
                        if type(m).__module__ == modeling.__name__ and _calls(type(m), VISION_APPLY)})
    return VisionRope(modeling, type(rotaries[0]), apply, int(head_dim), tuple(attention))


# ---------------------------------------------------------------------- probe
def _matrices(vr: VisionRope, config: Any, axis: int) -> torch.Tensor:
    """``F(t)`` ``(T, d, d)`` (``F[t, j, i]``: dim j of e_i rotated) at :data:`_TIMES` on ``axis``, the other at 0."""
    d = vr.head_dim
    rotary = vr.rotary(config)
    ids = torch.zeros(len(_TIMES), 2, dtype=torch.long)
    ids[:, axis] = torch.tensor(_TIMES)
    cos, sin = rotary(torch.zeros(1, 1, 1, d), ids)
    eye = torch.eye(d).expand(len(_TIMES), d, d).contiguous()  # (patches, "heads" = basis vectors, d)
    out, _ = vr.apply(eye, eye, cos, sin)
    return out.to(torch.float64).transpose(1, 2)  # (T, i, j) -> (T, j, i)


def _planes(moved: torch.Tensor) -> tuple[str, list[tuple[int, int]]]:
    """The layout and the planes ``(i, j)`` (i < j) of the moved-dims pattern ``moved[j, i]``."""
    d = moved.shape[0]
    partner = {}
    for i in range(d):
        rows = [j for j in moved[:, i].nonzero().flatten().tolist() if j != i]
        if len(rows) != 1:
            raise ValueError(f"dim {i} turns into dims {rows}: not one rotation plane per pair of every dim")
        partner[i] = rows[0]
    if all(j == (i + d // 2) % d for i, j in partner.items()):
        return "half", [(k, k + d // 2) for k in range(d // 2)]
    if all(j == i ^ 1 for i, j in partner.items()):
        return "interleaved", [(2 * k, 2 * k + 1) for k in range(d // 2)]
    raise ValueError(f"the planes pair dims {sorted(partner.items())[:4]}…: neither (k, k + d/2) nor (2k, 2k + 1)")


def _encoding(vr: VisionRope, config: Any) -> Encoding:
    """The tower's rope probed: planes, layout, the axis, direction and frequency of each plane."""
    F = [_matrices(vr, config, a) for a in (0, 1)]
    eye = torch.eye(vr.head_dim, dtype=torch.float64)
    moved = [(f - eye).abs().amax(0) > _ZERO for f in F]  # (d, d) per axis
    layout, planes = _planes(moved[0] | moved[1])
    inv = vr.rotary(config).inv_freq.to(torch.float64)
    freqs = torch.zeros(2, len(planes), dtype=torch.float64)
    for k, (i, j) in enumerate(planes):
        axes = [a for a in (0, 1) if bool(moved[a][j, i])]
        if len(axes) != 1:
            raise ValueError(f"rotation plane {k} (dims {i}, {j}) turns with axes {axes}: not one axis per plane")
        a = axes[0]
        c, s = float(F[a][0, i, i]), float(F[a][0, j, i])  # t = 1
        if abs(math.hypot(c, s) - 1) > 1e-5:
            raise ValueError(f"rotation plane {k} scales by {math.hypot(c, s):.6g} (an attention scaling liepos does not apply)")
        omega = math.atan2(abs(s), c)
        near = int((inv - omega).abs().argmin())
        if abs(float(inv[near]) - omega) > 1e-5 * max(omega, 1e-3):
            raise ValueError(f"rotation plane {k} turns by {omega:.6g} per position, none of the rotary module's inv_freq")
        freqs[a, k] = math.copysign(float(inv[near]), s)
    name = f"hf:vision_axial[{layout}]"
    return Encoding(Generator(torch.zeros_like(freqs), freqs, [1] * len(planes), complex=[True] * len(planes), axes=2),
                    layout=layout, name=name)


def _batched(vr: VisionRope, config: Any) -> bool:
    """Whether upstream's apply on q, k ``(batch, patches, heads, d)`` is its apply on each batch row (it broadcasts
    cos and sin over a leading batch dim): then a batched attention's q and k are rotated as unbatched ones."""
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 6, 2, vr.head_dim, generator=gen) for _ in range(2))
    cos, sin = vr.rotary(config)(q, torch.randint(0, 9, (6, 2), generator=gen))
    try:
        batch = vr.apply(q, k, cos, sin)
    except (RuntimeError, ValueError, IndexError):
        return False
    rows = [vr.apply(q[b], k[b], cos, sin) for b in range(2)]
    return all(torch.equal(batch[i][b], rows[b][i]) for i in range(2) for b in range(2))


def _prove(vr: VisionRope, config: Any, enc: Encoding) -> str | None:
    """None when ``enc`` gives upstream's scores at random (h, w) pairs, else what did not match."""
    gen = torch.Generator().manual_seed(0)
    d, heads = vr.head_dim, 2
    omega = float(enc.generator.freqs.abs().max())
    for hi in (16, 64, 1024):
        pos = torch.randint(0, hi, (24, 2), generator=gen)
        q, k = (torch.randn(24, heads, d, generator=gen) for _ in range(2))
        cos, sin = vr.rotary(config)(q[None], pos)
        qu, ku = (x.to(torch.float64).transpose(0, 1) for x in vr.apply(q, k, cos, sin))  # (H, N, d)
        want = qu @ ku.transpose(-1, -2)
        p = pos.to(torch.float64)
        ql = enc.query(q.to(torch.float64).transpose(0, 1)[None], p)[0]
        kl = enc.key(k.to(torch.float64).transpose(0, 1)[None], p)[0]
        got = ql @ kl.transpose(-1, -2)
        norms = q.to(torch.float64).norm(dim=-1).T[:, :, None] * k.to(torch.float64).norm(dim=-1).T[:, None, :]
        t = p.amax(-1)
        tol = 8 * _EPS32 * (2 * omega * (t[:, None] + t[None, :]) + 8) + 1e-6  # (N, N)
        err = (got - want).abs() / norms
        if bool((err > tol).any()) or not bool(torch.isfinite(got).all()):
            worst = float((err / tol).max())
            return (f"scores differ by {worst:.3g} times float32 rounding at (h, w) pairs below {hi} "
                    f"(liepos read {enc!r})")
    return None


# ---------------------------------------------------------------------- patch
def _rotary_forward(self: Any, x: Any, position_ids: Any, *args: Any, **kwargs: Any) -> Any:
    cos, sin = type(self).forward(self, x, position_ids, *args, **kwargs)
    pairs = position_ids.to(cos.dtype)
    if not torch.equal(pairs.to(position_ids.dtype), position_ids):
        raise ValueError(f"{type(self).__name__}: (h, w) positions up to {int(position_ids.max())} are not exact in "
                         f"{cos.dtype}, the dtype its cos carries them in")
    return torch.cat((cos, pairs), dim=-1), sin  # (N, d) + (N, 2): the pairs ride along with cos


def _attention_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    token = _ACTIVE.set(self._liepos_vision)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        _ACTIVE.reset(token)


def _dispatcher(upstream: Any) -> Any:
    def apply(q: Any, k: Any, cos: Any, sin: Any) -> Any:
        state = _ACTIVE.get()
        if state is None:
            return upstream(q, k, cos, sin)
        enc, batched = state
        d = q.shape[-1]
        if cos.shape[-1] != d + 2 or q.shape[-3] != cos.shape[0] or not (q.dim() == 3 or (q.dim() == 4 and batched)):
            raise RuntimeError(f"a patched vision attention got q {tuple(q.shape)} and cos {tuple(cos.shape)}: "
                               "not (patches, heads, head_dim) (or batched, where the proof showed upstream's apply "
                               "broadcasts over a batch) with the (h, w) pairs beside cos")
        pos = cos[..., d:].to(torch.float64)  # (N, 2)

        def rotate(x: Any, side: Any) -> Any:  # (…, N, H, d) -> (B, H, N, d) and back
            y = x.to(torch.float32).reshape(-1, *x.shape[-3:]).transpose(1, 2)
            return side(y, pos).transpose(1, 2).reshape(x.shape).to(x.dtype)

        return rotate(q, enc.query), rotate(k, enc.key)

    vars(apply)["_liepos_upstream"] = upstream
    return apply


def _joins(model: Any, vr: VisionRope) -> str | None:
    """The class whose forward runs the rotary module and concatenates its output with other cos and sin
    (MLCD's class token, ``torch.cat([class_pos_emb.cos(), position_embeddings[0]])``), else None."""
    for m in model.modules():
        if any(isinstance(c, vr.rotary) for c in m.children()):
            try:
                src = inspect.getsource(inspect.unwrap(type(m).forward))
            except (OSError, TypeError):
                return f"{type(m).__name__} (no source to read)"
            if re.search(r"cat\([^\n]*(position_embeddings|rotary_pos_emb|\.cos\(\))", src):
                return type(m).__name__
    return None


def patch_vision(model: Any, config: Any, vr: VisionRope) -> Any:
    """Patch the tower ``model`` (see the module docstring), or raise a ValueError saying why not."""
    if not vr.attention:
        raise _refuse(config.model_type, f"no attention module of {type(model).__name__} calls {VISION_APPLY}")
    joined = _joins(model, vr)
    if joined:
        raise _refuse(config.model_type, f"{joined} joins other angles to its rotary module's cos and sin (a class "
                                         "token's own), which are not at a patch's (h, w) pair")
    batched = False
    try:
        enc = _encoding(vr, config)
        why, batched = _prove(vr, config, enc), _batched(vr, config)
    except Exception as err:  # noqa: BLE001 - upstream's code failing on a probe is a refusal
        why = f"probing {vr.modeling.__name__}.{VISION_APPLY}: {type(err).__name__}: {err}"
    if why is not None:
        raise _refuse(config.model_type, why)
    modules: list[Any] = list(model.modules())
    for m in modules:
        if isinstance(m, vr.rotary) and "_liepos_vision" not in m.__dict__:
            m._liepos_vision = None
            m.forward = _rotary_forward.__get__(m, type(m))
        elif type(m).__name__ in vr.attention:
            m._liepos_vision = (enc, batched)
            m.forward = _attention_forward.__get__(m, type(m))
    name = vr.modeling.__name__
    users = _USERS.setdefault(name, weakref.WeakSet())
    users.add(model)
    fn = getattr(vr.modeling, VISION_APPLY)
    if not hasattr(fn, "_liepos_upstream"):
        setattr(vr.modeling, VISION_APPLY, _dispatcher(fn))
    return model


def release(model: Any) -> None:
    """Undo :func:`patch_vision` on ``model``; each modeling file's function back once no patched tower needs it."""
    for m in model.modules():
        if "_liepos_vision" in m.__dict__:
            m.__dict__.pop("_liepos_vision")
            m.__dict__.pop("forward", None)
    for name in list(_USERS):
        users = _USERS[name]
        users.discard(model)
        if not list(users):
            mod = importlib.import_module(name)
            upstream = getattr(getattr(mod, VISION_APPLY, None), "_liepos_upstream", None)
            if upstream is not None:
                setattr(mod, VISION_APPLY, upstream)
            del _USERS[name]
