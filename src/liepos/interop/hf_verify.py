"""Families outside the table, verified on the spot against transformers' own rotary code.

For a ``model_type`` that :mod:`liepos.interop.families` has no row for, liepos takes what
transformers wires for it — the modeling module's ``apply_rotary_pos_emb`` and its
``*RotaryEmbedding`` — and probes them with basis vectors (:class:`liepos.diagnosis.probes.Probe`)::

    F(t)_ji = ⟨e_j, apply_rotary_pos_emb(e_i, cos(t), sin(t))⟩

Which dims a column moves gives the partial slice (the rotated dims, which must be the first ones
of the head), which pairs of dims move together gives the layout (``(k, k + r/2)``: rotate_half;
``(2k, 2k + 1)``: interleaved), the sign of ``F(t)_ji`` for ``i < j`` the direction of the rotation,
the angle and length of each plane the frequencies and the temperature. With those facts the
config is read as usual (frequencies, every scaling map and temperature of
:mod:`liepos.interop.hf_config`) and the encoding is **proven**: for random q and k at positions
before and past the original length (one call each, as one forward would) ::

    apply(q, t)ᵀ apply(k, s) == enc.query(q, t)ᵀ enc.key(k, s) · logit_scale

to float32 rounding (``_tolerance``); anything else is refused with what did not match. What
cannot be probed this way (MLA's decoupled slice, a layout per sub-module, M-RoPE sections, ALiBi
variants, an attention that passes only part of the head to the rope when no model is at hand)
stays in the table or is refused.

transformers is imported inside the functions only.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from liepos.diagnosis.probes import Probe
from liepos.interop.config_source import config_object
from liepos.interop.families import FAMILIES, Family

__all__ = ["Upstream", "Structure", "upstream_of", "verified_family", "patch_family", "unnumber_layers", "prove",
           "axis_of", "one_tensor", "rotate_one", "slices_query", "sin_first", "reach"]

_APPLY = "apply_rotary_pos_emb"
# an entry of a probe matrix below this is a zero (float32 cos/sin are exact to ~6e-8)
_ZERO = 1e-5
# the probe times of the structure: small ones (a plane's angle ωt below π for ω ≤ 1: its direction) and
# large ones (a plane of ω ~ 1e-6, as llama3's scaled low frequencies, still moves)
_TIMES = (1, 2, 3, 4093, 1048573)
_SMALL = 3
# the proof's batch: heads of random q and k
_HEADS = 2
# float32: the relative rounding of one operation
_EPS32 = 2.0**-24


_CONVENTIONS = ("'llama': rotate_half pairs (k, k + d/2); 'cohere': pairs (2k, 2k + 1); 'gpt_neox': the default "
                "rope reads partial_rotary_factor")


def _refusal(model_type: Any, why: str, missing: bool = True) -> str:
    """The refusal of a family outside the table: why, and what to pass (``missing``: no code to verify against)."""
    where = ("cannot be verified against its modeling code" if missing
             else "was probed in its modeling code, which liepos cannot reproduce")
    todo = ("use a transformers that has this model type, or pass a config whose model_type is a table family "
            f"with the same conventions (e.g. {_CONVENTIONS})" if missing else
            f"if its rope has the conventions of a table family, pass that model_type in the config (e.g. {_CONVENTIONS})")
    return (f"model_type {model_type!r} is not a family of liepos' table (liepos.interop.families) and it {where}: "
            f"{why}. liepos refuses rather than assume Llama's conventions; {todo}")


@dataclass(frozen=True)
class Upstream:
    """What transformers wires for a model type: its text config, modeling module, rotary class, apply."""

    model_type: str
    config: Any
    modeling: Any
    rotary: type
    apply: Callable[..., Any]

    @property
    def per_tensor(self) -> bool:
        """The apply rotates one tensor, ``apply(x, cos, sin)`` (Gemma 4), not ``apply(q, k, cos, sin)``."""
        return one_tensor(self.apply)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[Any, Any]:
        """Upstream's apply on q and k ``(B, H, S, dims)`` with the rotary module's two outputs in its order."""
        if sin_first(self.apply):  # (B, H, S, D) -> (B, S, H, D), as GPT-J's attention passes them, and back
            return tuple(self.apply(x.transpose(1, 2), cos, sin).transpose(1, 2) for x in (q, k))
        if self.per_tensor:
            return self.apply(q, cos, sin), self.apply(k, cos, sin)
        return self.apply(q, k, cos, sin)[:2]

    def rotary_for(self, layer_type: str | None) -> Callable[[torch.Tensor, torch.Tensor], Any]:
        """``(x, position_ids) -> (cos, sin)`` of a fresh rotary module (its dynamic state starts anew).

        A layer type of the rope parameters that no layer of the config has is still built: the
        rotary module is made from a copy of the config whose ``layer_types`` include it."""
        module = self.rotary_for_module(layer_type)
        takes = inspect.signature(module.forward).parameters
        if layer_type is not None and "layer_type" in takes:
            return lambda x, ids: module(x, ids, layer_type=layer_type)
        return lambda x, ids: module(x, ids)

    def rotary_for_module(self, layer_type: str | None) -> Any:
        """A fresh rotary module for ``layer_type`` (see :meth:`rotary_for`)."""
        config = self.config
        types = getattr(config, "layer_types", None)
        if layer_type is not None and isinstance(types, list | tuple) and layer_type not in types:
            config = copy.deepcopy(config)
            config.layer_types = [*types, layer_type]
        return self.rotary(config)


def one_tensor(apply: Callable[..., Any]) -> bool:
    """Whether a rope function rotates one tensor, ``apply(x, cos, sin, unsqueeze_dim=1)`` (Gemma 3n/4) or
    ``apply(x, sin, cos)`` (GPT-J, CodeGen)."""
    names = getattr(getattr(apply, "__code__", None), "co_varnames", ())
    return names[1:2] in (("cos",), ("sin",))


def sin_first(apply: Callable[..., Any]) -> bool:
    """Whether a rope function is GPT-J's ``apply(x, sin, cos)``: one tensor, sequence-first ``(B, S, H, D)``,
    its sin and cos of half the rotated dims (each repeated for a pair); its rotary module answers (sin, cos)."""
    names = getattr(getattr(apply, "__code__", None), "co_varnames", ())
    return names[1:3] == ("sin", "cos")


def rotate_one(layer: Any, x: torch.Tensor, args: tuple[Any, ...], kwargs: Mapping[str, Any],
               seq_first: bool | None = None) -> torch.Tensor:
    """A patched layer's rope on the one tensor of ``apply(x, cos, sin, unsqueeze_dim=1)``: q and k take the
    same call, which a rotation allows (its query and key sides agree); ``unsqueeze_dim=2`` (or
    ``seq_first``, GPT-J's apply): x is ``(batch, seq, heads, dim)``."""
    if layer.encoded and layer.sided:
        raise NotImplementedError(f"{layer.family.model_type}: the rope is applied per tensor, which does not say "
                                  f"query from key, and {layer.encoding!r} encodes them differently")
    if seq_first is None:
        seq_first = kwargs.get("unsqueeze_dim", args[1] if len(args) > 1 else 1) == 2
    x = x.transpose(1, 2) if seq_first else x  # (B, S, H, D) -> (B, H, S, D)
    out, _ = layer.rotate(x, x)
    return out.transpose(1, 2) if seq_first else out


def _config_object(config: Any, model_type: str) -> Any:
    """The transformers config of ``config`` (a dict is built into its config class)."""
    from transformers import CONFIG_MAPPING

    if not isinstance(config, Mapping):
        if model_type not in CONFIG_MAPPING:
            import transformers

            raise ValueError(_refusal(model_type, f"transformers {transformers.__version__} has no such model type"))
        return config
    try:
        return config_object(config, model_type)
    except ValueError as err:
        raise ValueError(_refusal(model_type, str(err))) from None


def _text_rotaries(modeling: Any) -> list[str]:
    """The names of the modeling module's own ``*RotaryEmbedding`` classes outside a vision tower."""
    return [n for n, c in vars(modeling).items() if n.endswith("RotaryEmbedding") and inspect.isclass(c)
            and c.__module__ == modeling.__name__ and "Vision" not in n]


def _rotary_class(modeling: Any, config: Any) -> type | None:
    """The text rotary class of a modeling module: ``<Config>RotaryEmbedding``, else the one the module's
    models of this config class build (``self.rotary_emb = …RotaryEmbedding(config)``), else the only one."""
    name = type(config).__name__.removesuffix("Config") + "RotaryEmbedding"
    if inspect.isclass(getattr(modeling, name, None)):
        return getattr(modeling, name)
    built: set[str] = set()
    for cls in vars(modeling).values():
        if inspect.isclass(cls) and cls.__module__ == modeling.__name__ and getattr(cls, "config_class", None) is type(config):
            try:
                built |= set(re.findall(r"(\w+RotaryEmbedding)\(", inspect.getsource(cls.__init__)))
            except (OSError, TypeError):  # no source: judged by the names alone
                continue
    texts = _text_rotaries(modeling)
    built &= set(texts)
    found = sorted(built) if built else texts
    return getattr(modeling, found[0]) if len(found) == 1 else None


def upstream_of(config: Any, model_type: str) -> Upstream:
    """The rotary module and apply function transformers uses for ``model_type``, or a ValueError that says why not."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ValueError(_refusal(model_type, "transformers is not installed")) from None
    cfg = _config_object(config, model_type)
    if hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    name = type(cfg).__module__.replace(".configuration_", ".modeling_")
    try:
        modeling = importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - a missing optional dependency of the modeling file
        raise ValueError(_refusal(model_type, f"{name} does not import ({type(err).__name__}: {err})")) from None
    apply = getattr(modeling, _APPLY, None)
    apply = getattr(apply, "_liepos_upstream", apply)  # a patched model's dispatcher: upstream's own function
    rotary = _rotary_class(modeling, cfg)
    if apply is None or rotary is None:
        texts = _text_rotaries(modeling)
        if not texts:  # nothing rotates the text: position-free attention (or a vision tower's own rope)
            vision = sorted(n for n in vars(modeling) if n.endswith("RotaryEmbedding") and "Vision" in n)
            raise ValueError(_refusal(model_type, f"{name} has no text *RotaryEmbedding class: its text attention "
                                                  "takes no rotary embedding" + (f" (only its vision tower rotates: "
                                                  f"{', '.join(vision)})" if vision else ""), False))
        what = (f"no module-level {_APPLY}" if apply is None else
                f"several text *RotaryEmbedding classes ({', '.join(texts)}) and none named after {type(cfg).__name__}")
        raise ValueError(_refusal(model_type, f"{name} has {what}"))
    return Upstream(model_type, cfg, modeling, rotary, apply)


# ---------------------------------------------------------------------- the structure
@dataclass(frozen=True)
class Structure:
    """What a probe of upstream's apply says: ``rotated`` first dims of ``head_dim`` turn in ``layout``
    planes, in ``direction`` (+1: liepos' sense, ``F(t)_ji = +sin ωt`` for the pair i < j), with the
    frequencies ``omega`` and the per-plane temperature ``tau2`` (``|F(1) e_i|²``) measured at t = 1;
    ``splits``: the apply takes only the rotated dims (the attention cuts the head)."""

    head_dim: int
    rotated: int
    layout: str
    direction: int
    splits: bool
    omega: tuple[float, ...]
    tau2: tuple[float, ...]


def _encoder(up: Upstream, layer_type: str | None, dims: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Upstream's query side as an encoder of the first ``dims`` dims (the rest passed through)."""
    rotary = up.rotary_for(layer_type)

    def encode(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        ids = positions.reshape(1, -1).to(torch.long)  # (seq,) -> (1, seq)
        cos, sin = rotary(x, ids)
        head, rest = x[..., :dims], x[..., dims:]
        q, _ = up.rotate(head, head, cos, sin)
        return torch.cat((q.to(x.dtype), rest), dim=-1)  # (…, dims) + (…, d − dims)

    return encode


def _matrices(up: Upstream, layer_type: str | None, head_dim: int) -> tuple[torch.Tensor, bool, int]:
    """``F(t)`` ``(T, d, d)`` (``F[t, j, i]``) at :data:`_TIMES`, whether the apply takes only the rotary
    module's dims (the attention cuts the head), and those dims (the last dim of cos and sin)."""
    times = _times(up, layer_type)
    x = torch.zeros(1, 1, 1, head_dim)
    cos, _ = up.rotary_for(layer_type)(x, times[None, :1])
    rdim = int(cos.shape[-1]) * (2 if sin_first(up.apply) else 1)  # GPT-J's sin and cos: one entry per pair
    if rdim > head_dim:
        raise ValueError(f"the rotary module gives cos and sin of {rdim} dims but the head has {head_dim}")
    eye = torch.eye(head_dim, dtype=torch.float64)
    for splits in ((False, True) if rdim < head_dim else (False,)):
        probe = Probe(_encoder(up, layer_type, rdim if splits else head_dim), head_dim, "query", dtype=torch.float32)
        try:
            rows = probe(eye, times, "structure")  # (d, T, d): row i is F(t) e_i
        except (RuntimeError, ValueError) as err:
            if splits or rdim == head_dim:
                raise ValueError(f"{up.modeling.__name__}.{_APPLY} does not run on probe vectors: {err}") from None
            continue
        return rows.permute(1, 2, 0), splits, rdim  # (d, T, d) -> (T, d_out, d_in)
    raise AssertionError("unreachable")  # pragma: no cover


def reach(up: Upstream, layer_type: str | None) -> int | None:
    """The positions a rotary module that looks its sin and cos up in a table (GPT-J's ``embed_positions``)
    answers: the table's rows; None for one that computes them at any position."""
    table = getattr(up.rotary_for_module(layer_type), "embed_positions", None)
    return int(table.shape[0]) if isinstance(table, torch.Tensor) else None


def _times(up: Upstream, layer_type: str | None) -> torch.Tensor:
    """:data:`_TIMES` the rotary module answers (within a table's rows, the last row added)."""
    rows = reach(up, layer_type)
    if rows is None:
        return torch.tensor(_TIMES)
    return torch.tensor(sorted({t for t in _TIMES if t < rows} | {rows - 1}))


def _pairs(F: torch.Tensor) -> dict[int, int]:
    """The partner of every moved dim: the one other row its column reaches at some probe time."""
    moved = (F - torch.eye(F.shape[-1], dtype=F.dtype)).abs().amax(0) > _ZERO  # (d_out, d_in)
    partner: dict[int, int] = {}
    for i in range(F.shape[-1]):
        rows = [j for j in moved[:, i].nonzero().flatten().tolist() if j != i]
        if len(rows) > 1:
            raise ValueError(f"dim {i} is mixed into dims {rows}: not one rotation plane per pair of dims")
        if rows:
            partner[i] = rows[0]
    for i, j in partner.items():
        if partner.get(j) != i:
            raise ValueError(f"dim {i} turns into dim {j} but dim {j} does not turn into dim {i}")
    return partner


def _layout(partner: dict[int, int], r: int) -> str:
    """``"half"`` when every moved dim i of the first ``r`` pairs with i ± r/2, ``"interleaved"`` with i xor 1."""
    beyond = sorted(i for i in partner if i >= r)
    if beyond:
        raise ValueError(f"the apply rotates dims {beyond[:4]}… past the {r} dims of the rotary module's cos and sin")
    if all(j == (i + r // 2 if i < r // 2 else i - r // 2) for i, j in partner.items()):
        return "half"
    if all(j == i ^ 1 for i, j in partner.items()):
        return "interleaved"
    raise ValueError(f"the apply pairs dims {sorted((i, j) for i, j in partner.items() if i < j)[:4]}…: "
                     "neither rotate_half pairs (k, k + r/2) nor interleaved pairs (2k, 2k + 1)")


def structure(up: Upstream, layer_type: str | None, head_dim: int) -> Structure:
    """Probe upstream's apply at :data:`_TIMES`: the layout, partial slice, direction, frequencies, temperature.

    The rotated dims are the first ``r`` (the dims of the rotary module's cos and sin); a plane of
    frequency 0 among them (``proportional``) stays in place and is still one of them.
    """
    F, splits, r = _matrices(up, layer_type, head_dim)
    partner = _pairs(F)
    if not partner:
        raise ValueError("the apply rotates no dim")
    if not splits and r < max(partner) + 1 <= 2 * r <= head_dim:
        r = 2 * r  # cos and sin of one entry per plane (the OpenAI privacy filter's pairs): the planes cover 2r dims
    layout = _layout(partner, r)
    lows = sorted(i for i, j in partner.items() if i < j)
    F1 = F[0]
    sines = torch.tensor([float(F1[partner[i], i]) for i in lows], dtype=torch.float64)
    coses = torch.tensor([float(F1[i, i]) for i in lows], dtype=torch.float64)
    small = F[:_SMALL]  # (3, d, d): the planes whose sines clear the zero there tell the direction
    signs = {int(torch.sign(small[:, partner[i], i]).sum()) for i in lows
             if float(small[:, partner[i], i].abs().min()) > _ZERO}
    if len(signs) != 1 or abs(next(iter(signs))) != _SMALL:
        raise ValueError("the planes do not all turn the same way at every probe time")
    direction = 1 if next(iter(signs)) > 0 else -1
    return Structure(head_dim, r, layout, direction, splits,
                     tuple(torch.atan2(sines.abs(), coses).tolist()), tuple((sines**2 + coses**2).tolist()))


# ---------------------------------------------------------------------- the family row
def _head_dim(cfg: Any, layer_type: str | None) -> int:
    """The config's head dim (of ``layer_type`` on a heterogeneous config), as the attention reads it."""
    try:
        hd = getattr(cfg, "head_dim", None)
    except (RuntimeError, ValueError):  # a per-layer attribute of a heterogeneous config
        hd = getattr(cfg.per_layer_config[layer_type], "head_dim", None)
    if hd is None:
        hd = cfg.hidden_size // cfg.num_attention_heads
    return int(hd)


def _layer_types(up: Upstream) -> list[str | None]:
    rp = getattr(up.config, "rope_parameters", None)
    if isinstance(rp, Mapping) and rp and all(isinstance(v, Mapping) or v is None for v in rp.values()):
        return [k for k, v in rp.items() if v is not None] or [None]
    return [None]


def _rope_params(up: Upstream, layer_type: str | None) -> Mapping[str, Any]:
    rp = getattr(up.config, "rope_parameters", None) or {}
    inner = rp.get(layer_type) if layer_type is not None else None
    return inner if isinstance(inner, Mapping) else rp


def _num_axes(up: Upstream, layer_type: str | None) -> int:
    """The position axes an M-RoPE rotary module reads: one per ``mrope_section`` entry (3 without one)."""
    sections = _rope_params(up, layer_type).get("mrope_section")
    return len(sections) if isinstance(sections, list | tuple) and len(sections) > 1 else 3


def _axes_ids(positions: torch.Tensor, axes: int, axis: int | None = None) -> torch.Tensor:
    """``(S,)`` or ``(S, axes)`` positions as a rotary module's ``(axes, 1, S)`` position_ids; ``axis``:
    only that axis at the positions, the others at 0."""
    if positions.dim() == 2:
        return positions.T[:, None, :].to(torch.long)  # (S, axes) -> (axes, 1, S)
    ids = positions.reshape(1, 1, -1).to(torch.long).expand(axes, 1, -1)  # (S,) -> (axes, 1, S)
    if axis is not None:
        ids = torch.where(torch.arange(axes)[:, None, None] == axis, ids, torch.zeros_like(ids))
    return ids


def _axes_read(up: Upstream, layer_type: str | None) -> int:
    """How many position axes the rotary module reads from ``(axes, batch, seq)`` position_ids, turning them
    into one rotation that differs from the first axis's (M-RoPE); 1 for a 1-D rotary module (it fails on
    them or answers another shape). Tried: one axis per ``mrope_section`` entry, then 3, 2 and 4."""
    t = torch.arange(5)
    x = torch.zeros(1, 1, 5, 2)
    try:
        one = up.rotary_for(layer_type)(x, t[None, :])[0]
    except Exception:  # noqa: BLE001 - judged by the probe of the structure
        return 1
    for axes in dict.fromkeys((_num_axes(up, layer_type), 3, 2, 4)):
        try:
            many = up.rotary_for(layer_type)(x, torch.stack([(a + 1) * t + a for a in range(axes)])[:, None, :])[0]
        except Exception:  # noqa: BLE001 - not this many axes
            continue
        if tuple(many.shape) == tuple(one.shape) and not torch.equal(many, one):
            return axes
    return 1


def _planes(s: Structure) -> list[tuple[int, int]]:
    """The dims ``(i, j)`` of each rotation plane, in the order of the rotary module's frequencies."""
    r = s.rotated
    return [(k, k + r // 2) for k in range(r // 2)] if s.layout == "half" else [(2 * k, 2 * k + 1) for k in range(r // 2)]


def axis_of(up: Upstream, layer_type: str | None, s: Structure, axes: int) -> tuple[int, ...]:
    """The position axis each rotation plane turns with: upstream's apply probed with position_ids
    ``(axes, 1, seq)`` that move one axis at a time. A plane that turns with no axis (frequency 0) is
    given axis 0; one that turns with several, or with none while it turns on text positions, is refused."""
    dims = s.rotated if s.splits else s.head_dim
    rotary = up.rotary_for(layer_type)
    times = torch.tensor(_TIMES[:1] + _TIMES[-2:])
    eye = torch.eye(s.head_dim, dtype=torch.float64)
    planes = _planes(s)
    moved = torch.zeros(axes, len(planes), dtype=torch.bool)
    for a in range(axes):
        def encode(x: torch.Tensor, positions: torch.Tensor, a: int = a) -> torch.Tensor:
            cos, sin = rotary(x, _axes_ids(positions, axes, a))
            head, rest = x[..., :dims], x[..., dims:]
            q, _ = up.rotate(head, head, cos, sin)
            return torch.cat((q.to(x.dtype), rest), dim=-1)  # (…, dims) + (…, d − dims)

        F = Probe(encode, s.head_dim, "query", dtype=torch.float32)(eye, times, "structure").permute(1, 2, 0)
        for n, (i, j) in enumerate(planes):  # F: (T, d_out, d_in)
            block = F[:, [i, j]][:, :, [i, j]] - torch.eye(2, dtype=F.dtype)  # (T, 2, 2): the plane's motion
            moved[a, n] = bool((block.abs() > _ZERO).any())
    owners = []
    for n, omega in enumerate(s.omega):
        turns = moved[:, n].nonzero().flatten().tolist()
        if len(turns) > 1:
            raise ValueError(f"rotation plane {n} turns with position axes {turns}: not one axis per plane")
        if not turns and omega > _ZERO:
            raise ValueError(f"rotation plane {n} turns on text positions (ω = {omega:.4g}) but with no single axis")
        owners.append(turns[0] if turns else 0)
    return tuple(owners)


def _sub_rope(up: Upstream) -> str | None:
    """Why a wrapper whose own config carries no rope (a CTC head over an encoder, an audio tower) is
    refused: the sub-configs that carry one, whose model is the one to patch; None otherwise."""
    if getattr(up.config, "rope_parameters", None) is not None:
        return None
    subs = sorted(f"{name} ({sub.model_type})" for name, sub in vars(up.config).items()
                  if hasattr(sub, "model_type") and getattr(sub, "rope_parameters", None) is not None)
    where = (f"; its sub-config {', '.join(subs)} does: patch the model built from it" if subs else "")
    return (f"its config {type(up.config).__name__} carries no rope parameters, so the rotary module "
            f"{up.rotary.__name__} cannot be built from it{where}")


def _patch_positions(up: Upstream, layer_type: str | None) -> str | None:
    """Why a vision tower's rope is refused, when its rotary module reads one (h, w) pair per patch
    (``position_ids`` ``(patches, 2)``) and not a sequence of positions; None otherwise."""
    try:
        x = torch.zeros(1, 1, 1, _head_dim(up.config, layer_type))
        cos = up.rotary_for(layer_type)(x, torch.zeros(5, 2, dtype=torch.long))[0]
    except Exception:  # noqa: BLE001 - not a patch rope: the probe's own error is the reason
        return None
    if cos.dim() != 2 or cos.shape[0] != 5:  # (5, 2, d): a 1-D rope broadcast over the pair, not a patch rope
        return None
    vision = sorted(n for n in vars(up.modeling) if n.startswith(_APPLY) and n != _APPLY)
    calls = f", and its attention calls {', '.join(vision)}" if vision else ""
    return (f"its rotary module {up.rotary.__name__} reads one (h, w) position pair per patch (position_ids of shape "
            f"(patches, 2), cos of shape {tuple(cos.shape)}){calls}: a 2-D rope over image patches, whose positions "
            "the vision model computes from its grid; patch_model patches such a tower only where its attention "
            "calls apply_rotary_pos_emb_vision (liepos.interop.hf_vision)")


def slices_query(up: Upstream, layer_type: str | None, s: Structure) -> bool:
    """Whether upstream's apply, given one query and three keys with the keys' cos and sin, returns one
    query rotated at the last position (q and k of different lengths) rather than refusing or broadcasting."""
    dims = s.rotated if s.splits else s.head_dim
    q, k = torch.randn(1, 1, 1, dims), torch.randn(1, 1, 3, dims)
    cos, sin = up.rotary_for(layer_type)(k, torch.arange(3)[None])
    try:
        out, _ = up.rotate(q, k, cos, sin)
    except (RuntimeError, ValueError, IndexError):
        return False  # lengths must agree: the usual apply
    return tuple(out.shape[-2:]) == (1, dims)


def verified_family(config: Any, model_type: str, *, model: Any = None, ignore_axes: bool = False) -> Family:
    """The facts of an unknown family, probed from its modeling code (a :class:`Family` row marked verified).

    Raises a ValueError that says what to pass when the code is not there or does not have the
    shape liepos can probe. Without a ``model``, an apply that takes only the rotated dims is refused:
    which dims the attention passes is its code, not the rope's.
    """
    up = upstream_of(config, model_type)
    lt = _layer_types(up)[0]
    try:
        s = structure(up, lt, _head_dim(up.config, lt))
    except Exception as err:  # noqa: BLE001 - any failure of upstream's code on a probe is a refusal
        why = _patch_positions(up, lt) or _sub_rope(up) or f"probing {up.modeling.__name__}.{_APPLY}: {err}"
        raise ValueError(_refusal(model_type, why, False)) from None
    if not up.per_tensor and slices_query(up, lt, s):
        raise ValueError(_refusal(model_type, f"{up.modeling.__name__}.{_APPLY} rotates a query shorter than its keys "
                                              "at the keys' last positions (a drafter whose keys carry a context "
                                              "the queries lack), which liepos' layers do not follow", False))
    axes = 1 if ignore_axes else _axes_read(up, lt)
    owners: tuple[int, ...] = ()
    if axes > 1:
        try:
            owners = axis_of(up, lt, s, axes)
        except Exception as err:  # noqa: BLE001 - upstream's code failing on a probe is a refusal
            raise ValueError(_refusal(model_type, f"its rotary module reads one position per axis ((axes, batch, seq) "
                                                  f"position_ids: M-RoPE), and probing its axes: {err}", False)) from None
    others = [t for t in _layer_types(up)[1:] if not ignore_axes and _axes_read(up, t) != axes]
    if others:  # the probed axes are the first layer type's: every other must read positions the same way
        raise ValueError(_refusal(model_type, f"its layer types {lt!r} and {others[0]!r} differ in how many "
                                              "position axes their rotary module reads (M-RoPE)", False))
    if s.splits and model is None:
        what = ("its rope is GPT-J's (apply(x, sin, cos) on the first rotary_dim dims, in pairs (2k, 2k + 1)): "
                if sin_first(up.apply) else "")
        raise ValueError(_refusal(
            model_type, f"{what}its attention passes only {s.rotated} of {s.head_dim} dims to {_APPLY} and which "
            "ones is the attention's code, not the rope's; patch_model(model) verifies it with the model at hand", False))
    module = up.modeling.__name__.split(".")[-2]
    return Family(model_type, module, (), layout=s.layout, default_partial=s.rotated < s.head_dim,
                  splits_rotary=s.splits, direction=s.direction, rotary_dims=s.rotated if s.splits else s.head_dim,
                  axes=axes, axis_of=owners, verified=True)


def _forward(cls: type) -> Any:
    """A class's ``forward`` under its decorators (transformers wraps some to rename keyword arguments)."""
    forward = getattr(cls, "forward", None)
    return None if forward is None else inspect.unwrap(forward)


def _source(cls: type) -> str:
    try:
        return inspect.getsource(_forward(cls))
    except (OSError, TypeError):  # no source to read: judged by its calls alone
        return ""


def _calls(cls: type, name: str) -> bool:
    code = getattr(_forward(cls), "__code__", None)
    return code is not None and name in code.co_names


def _number_layers(callers: list[Any], config: Any) -> None:
    """Give the attention modules of an encoder that numbers none (GTE, NomicBERT, ESM C: no cache, no layer types)
    their index in the model's order, as ``layer_idx`` (what liepos' layers key their state by); a
    model with layer types, or a cache-using model, numbers its own and is left as it is."""
    bare = [m for m in callers if getattr(m, "layer_idx", None) is None]  # none, or None (ESM C)
    if bare and len(bare) == len(callers) and not getattr(config, "layer_types", None) \
            and not getattr(config, "is_decoder", False) and all(getattr(m, "is_causal", True) is False for m in bare):
        for i, m in enumerate(bare):
            m.__dict__[_NUMBERED] = ("layer_idx" in m.__dict__, m.__dict__.get("layer_idx"))  # what it had
            m.layer_idx = i  # unnumber_layers takes it back (a refusal, unpatch_model)


_NUMBERED = "_liepos_numbered"


def unnumber_layers(model: Any) -> None:
    """Take back the ``layer_idx`` that :func:`patch_family` gave an encoder's attention modules: a refused
    patch and :func:`~liepos.interop.patch_model`'s undo leave the model as it was."""
    for m in model.modules():
        if _NUMBERED in m.__dict__:
            had, old = m.__dict__.pop(_NUMBERED)
            if had:
                m.layer_idx = old
            else:
                del m.layer_idx


def _own_classes(up: Upstream, callers: list[Any], model_type: str) -> list[str]:
    """The attention classes of ``callers`` that belong to ``model_type``'s config: a tower of a composite
    with a config of its own (an audio encoder beside the text decoder, in the same modeling file)
    keeps upstream's rope, its frequencies are its own config's. A class that serves both is kept
    where the other config's rotary module gives the same cos and sin at every probe position (one
    rope, proven once), else refused."""
    def owner(m: Any) -> Any:
        return getattr(getattr(m, "config", None), "model_type", model_type)

    mine = {type(m).__name__ for m in callers if owner(m) == model_type}
    for m in callers:
        if type(m).__name__ in mine and owner(m) != model_type and not _same_rope(up, m.config):
            raise ValueError(_refusal(model_type, f"its attention class {type(m).__name__} serves both the "
                                                  f"{model_type!r} layers and the {owner(m)!r} layers, whose rotary "
                                                  "module gives other cos and sin", False))
    return sorted(mine)


def _same_rope(up: Upstream, other: Any) -> bool:
    """Whether ``up``'s rotary class built from the config ``other`` answers as from ``up.config``."""
    x = torch.zeros(1, 1, 1, _head_dim(up.config, None))
    ids = torch.tensor([sorted({0, 1, 5, 31, 127, 4093})])
    try:
        got, want = up.rotary(other)(x, ids), up.rotary(up.config)(x, ids)
    except Exception:  # noqa: BLE001 - a config the rotary class cannot read is not the same rope
        return False
    return all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def patch_family(model: Any, config: Any) -> Family:
    """:func:`verified_family` plus the attention classes of ``model`` that call the module's apply."""
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str):
        raise ValueError(f"the config has no model_type to find its family by, got {model_type!r}")
    family = verified_family(config, model_type, model=model)
    up = upstream_of(config, model_type)
    others = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")
                     and getattr(getattr(m, "config", None), "model_type", model_type) == model_type
                     and not isinstance(m, up.rotary)})
    if others:
        raise ValueError(_refusal(model_type, f"its text rotary modules are {', '.join(others)}, not the "
                                              f"{up.rotary.__name__} the probe proved", False))
    modeling = importlib.import_module(family.modeling)
    callers = [m for m in model.modules()
               if type(m).__module__ == modeling.__name__ and _calls(type(m), _APPLY)
               and getattr(_forward(type(m)), "__globals__", None) is vars(modeling)]
    _number_layers(callers, config)
    callers = [m for m in callers if getattr(m, "layer_idx", None) is not None]  # a helper module (a compressor)
    classes = _own_classes(up, callers, model_type)
    if not classes:
        raise ValueError(_refusal(model_type, f"no attention module of {type(model).__name__} calls "
                                              f"{modeling.__name__}.{_APPLY} from its forward", False))
    by_type: dict[Any, set[int]] = {}  # layer type -> head sizes: the proof probes each layer type at its own
    types = list(getattr(config, "layer_types", None) or ())
    for m in model.modules():
        if type(m).__name__ in classes and isinstance(getattr(m, "head_dim", None), int):
            lt = getattr(m, "layer_type", None) or (types[m.layer_idx] if m.layer_idx < len(types) else None)
            by_type.setdefault(lt if len(_layer_types(up)) > 1 else None, set()).add(int(m.head_dim))
    sizes = sorted(set().union(*by_type.values()))
    if any(len(v) > 1 for v in by_type.values()) or (len(sizes) > 1 and family.splits_rotary):
        raise ValueError(_refusal(model_type, f"its attention layers have head sizes {sizes}, and the probe proves "
                                              "one rotation for one head size per layer type", False))
    if len(sizes) > 1:  # one head size per layer type: each layer rotates its own head (read per layer type)
        family = replace(family, rotary_dims=0)
    seq_first = [] if up.per_tensor else [  # a per-tensor apply's unsqueeze_dim is read by the dispatcher
        c for c in classes if re.search(r"unsqueeze_dim\s*=\s*(?!1\b)", _source(getattr(modeling, c)))]
    if seq_first:
        raise ValueError(_refusal(model_type, f"{', '.join(seq_first)} passes unsqueeze_dim to {_APPLY} (q and k "
                                              "sequence-first, as Llama 4), which the dispatcher does not read", False))
    own = [c for c in classes if not _calls(getattr(modeling, c), "ALL_ATTENTION_FUNCTIONS")]
    both = sorted({type(m).__name__ for m in model.modules()
                   if type(m).__name__ in classes and getattr(m, "is_causal", True) is False})
    why = (f"{', '.join(own)} computes attention itself, not through ALL_ATTENTION_FUNCTIONS" if own else
           f"{', '.join(both)} attends both ways (is_causal=False), and liepos' raw-key attention is causal" if both
           else "")
    return replace(family, attention=tuple(classes), raw_keys=not (own or both), why=why)


# ---------------------------------------------------------------------- the proof
def _positions(L0: int) -> tuple[list[int], list[int]]:
    """Probe positions of one forward within the original length, and of one past it (to 4 L0)."""
    short = sorted({p for p in (0, 1, 2, 3, 5, 8, 13, 21, L0 // 2, L0 - 1) if 0 <= p < L0})
    long = sorted({0, 1, 7, L0 - 1, L0, L0 + 1, L0 + 13, 2 * L0 - 1, 2 * L0 + 5, 3 * L0, 4 * L0 - 1})
    return short, long


def _tolerance(pos: torch.Tensor, omega_max: float) -> torch.Tensor:
    """Float32 rounding of upstream's scores of (t, s), relative to ``|q_t| |k_s| τ²``: the angles ω·t
    rounded twice (inv_freq, the product) and cos, sin and the products once, with a margin of 8."""
    t = pos.to(torch.float64).abs()
    if t.dim() == 2:  # (S, axes): the largest angle of each token
        t = t.amax(-1)
    return 8 * _EPS32 * (2 * omega_max * (t[:, None] + t[None, :]) + 8) + 1e-6  # (S, S)


def _scores(enc: Any, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, rotary_dim: int, scale: float,
            exact: bool) -> torch.Tensor:
    """liepos' scores ``(1, H, S, S)`` float64 of an :class:`~liepos.interop.hf_config.HFRope`'s reading."""
    if enc.length_rule is not None:
        enc = enc.at_length(int(pos.max()) + 1)
    qe = enc.query(q.to(torch.float64), pos)
    ke = enc.key(k.to(torch.float64), pos)
    if not exact:  # the temperature on the rotated dims only, as upstream
        qe = torch.cat((qe[..., :rotary_dim] * scale, qe[..., rotary_dim:]), dim=-1)
    return (qe @ ke.transpose(-1, -2)) * enc.logit_scale


def _upstream_scores(up: Upstream, lt: str | None, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor,
                     dims: int) -> torch.Tensor:
    rotary = up.rotary_for(lt)
    cos, sin = rotary(q, pos[None, :] if pos.dim() == 1 else _axes_ids(pos, pos.shape[-1]))
    qh, kh = up.rotate(q[..., :dims], k[..., :dims], cos, sin)
    qe = torch.cat((qh.to(torch.float64), q[..., dims:].to(torch.float64)), dim=-1)
    ke = torch.cat((kh.to(torch.float64), k[..., dims:].to(torch.float64)), dim=-1)
    return qe @ ke.transpose(-1, -2)  # (1, H, S, S)


def _prove_one(up: Upstream, lt: str | None, read: Any, s: Structure, L0: int) -> str | None:
    """None when ``read`` reproduces upstream at every probe pair, else what did not match."""
    gen = torch.Generator().manual_seed(0)
    omega_max = max(s.omega) if s.omega else 0.0
    tau2 = max(s.tau2) if s.tau2 else 1.0
    dims = s.rotated if s.splits else s.head_dim
    axes = read.encoding.generator.num_axes
    rows = reach(up, lt)
    for pos in _positions(L0):
        pos = [t for t in pos if rows is None or t < rows]  # a table's rows: upstream answers no other position
        p = torch.tensor(pos)
        if axes is not None:  # M-RoPE: every axis at its own positions (a shuffle of them), the first in order
            p = _per_axis(p, axes, gen)
        q = torch.randn(1, _HEADS, len(pos), s.head_dim, generator=gen)
        k = torch.randn(1, _HEADS, len(pos), s.head_dim, generator=gen)
        want = _upstream_scores(up, lt, q, k, p, dims)
        got = _scores(read.encoding, q, k, p, read.rotary_dim, read.rotary_scale, read.exact_encoding)
        norms = q.to(torch.float64).norm(dim=-1)[..., :, None] * k.to(torch.float64).norm(dim=-1)[..., None, :]
        err = (got - want).abs() / (norms * max(tau2, 1.0))  # (1, H, S, S)
        ratio = err / _tolerance(p, omega_max)
        if bool((ratio > 1).any()) or not bool(torch.isfinite(got).all()):
            h, i, j = (int(v) for v in divmod_index(ratio[0]))
            at = (pos[i], pos[j]) if p.dim() == 1 else (p[i].tolist(), p[j].tolist())
            return (f"scores differ by {float(err[0, h, i, j]):.3g} of |q||k| at (t, s) = ({at[0]}, {at[1]}) "
                    f"(float32 rounding allows {float(_tolerance(p, omega_max)[i, j]):.3g}); upstream: "
                    f"{_described(s)}; liepos read {read.encoding!r}")
    return None


def _per_axis(p: torch.Tensor, axes: int, gen: torch.Generator) -> torch.Tensor:
    """``(S,)`` positions as ``(S, axes)``: axis 0 at ``p``, every other axis at its own shuffle of ``p``."""
    cols = [p] + [p[torch.randperm(p.numel(), generator=gen)] for _ in range(axes - 1)]
    return torch.stack(cols, dim=-1)  # (S,) * axes -> (S, axes)


def divmod_index(x: torch.Tensor) -> tuple[int, ...]:
    """The index of the largest entry of ``x`` (NaN first)."""
    flat = torch.where(torch.isfinite(x), x, torch.full_like(x, math.inf)).flatten()
    return tuple(int(v) for v in torch.unravel_index(flat.argmax(), x.shape))


def _described(s: Structure) -> str:
    way = "liepos' sense" if s.direction > 0 else "the other way (ω < 0 in liepos' sense)"
    freqs = ", ".join(f"{w:.4g}" for w in s.omega[:3])
    return (f"layout {s.layout!r}, the first {s.rotated} of {s.head_dim} dims rotated"
            f"{' (the attention passes only those)' if s.splits else ''}, turning {way}, ω(t=1) = [{freqs}, …], "
            f"τ² = {max(s.tau2):.6g}")


def prove(config: Any, model_type: str, read: Any, layer_type: str | None = None) -> None:
    """Raise a ValueError unless ``read`` (an HFRope, or a dict of them by layer type) is upstream's rope.

    Every layer type is probed again at its own head dim (its structure) and proven at positions
    within and past the original length (``original_max_position_embeddings``, else
    ``max_position_embeddings``).
    """
    up = upstream_of(config, model_type)
    types = _layer_types(up)
    reads = read if isinstance(read, Mapping) else {(layer_type if layer_type in types else types[0]): read}
    L0 = _original_length(up.config)
    for lt, r in reads.items():
        if r.rotary_dim == 0:
            continue  # a NoPE layer type: nothing to prove
        try:
            s = structure(up, lt, r.encoding.content_dim)
            why = _prove_one(up, lt, r, s, L0)
        except Exception as err:  # noqa: BLE001 - upstream's code failing on a probe is a refusal
            why = f"probing {up.modeling.__name__}.{_APPLY} failed: {type(err).__name__}: {err}"
        if why is not None:
            where = "" if lt is None else f" (layer type {lt!r})"
            raise ValueError(f"model_type {model_type!r} is not in liepos' table and its verification failed{where}: "
                             f"{why}. liepos refuses rather than return an encoding that differs from upstream")


def _original_length(cfg: Any) -> int:
    rp = getattr(cfg, "rope_parameters", None) or {}
    flat = [rp] if not all(isinstance(v, Mapping) or v is None for v in rp.values()) else [v for v in rp.values() if v]
    for params in flat:
        if params.get("original_max_position_embeddings"):
            return int(params["original_max_position_embeddings"])
    mp = getattr(cfg, "max_position_embeddings", None)
    return int(mp) if mp else 2048


def is_verified(family: Family | None) -> bool:
    """Whether a row came from a probe rather than the table."""
    return family is not None and family.verified and family.model_type not in FAMILIES
