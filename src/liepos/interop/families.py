"""The Hugging Face families liepos knows: one row of facts per ``model_type``.

Most transformers modeling files share one shape: a rotary module computes ``cos, sin`` from
``position_ids``, the attention calls a module-level ``apply_rotary_pos_emb(q, k, cos, sin)``,
updates the cache and calls ``ALL_ATTENTION_FUNCTIONS.get_interface(...)``. :mod:`liepos.interop.hf_model`
patches every family of that shape with one mechanism; what differs between families is data,
written here once:

* ``layout``: how the rotation planes are stored (``"half"``: ``rotate_half``; ``"interleaved"``:
  dims (2k, 2k+1); ``"rope_interleave"``: the config's flag decides, as in DeepSeek-V3);
* ``default_partial``: whether the family's *default* rope reads ``partial_rotary_factor``
  (Llama's ``compute_default_rope_parameters`` ignores it; the scaled types of
  ``modeling_rope_utils`` always read it);
* ``splits_rotary``: the attention passes only the rotated dims to ``apply_rotary_pos_emb``
  (Phi, StableLM) instead of the whole head;
* ``seq_first``: q and k reach the rope as ``(batch, seq, heads, dim)`` (Llama 4);
* ``softmax_mscale``: the attention multiplies its softmax scale by DeepSeek's ``m(s, mscale_all_dim)²``
  (a model-level multiplier, not the rope's ``attention_factor``);
* ``apply``: the names of the module-level rope functions the attention calls;
* ``raw_keys``: the attention calls ``ALL_ATTENTION_FUNCTIONS`` with no extra term liepos'
  attention lacks, so encodings that are not fixed rotations (xPos, ALiBi's slots, dynamic
  NTK, …) can run through it; ``why`` says what is missing when not;
* ``positions``: ``"rope"``, ``"alibi"`` (Bloom, MPT, Falcon with ``alibi=True``: read by
  :func:`liepos.from_hf` as ALiBi), ``"absolute"`` (GPT-2, OPT: refused by name) or ``"refused"``
  (a rope liepos does not reproduce yet: ``why`` says what it is);
* ``direction``: +1, or -1 for a rotation that runs the other way (``ω < 0`` in liepos' sense);
* ``rotary_dims``: the dims the attention passes to the rope, when known (a verified row: the probed
  head, or with ``splits_rotary`` the rotated dims; table rows read them from the attention module);
* ``axis_of``: a verified M-RoPE row (``axes`` > 1): the position axis each rotation plane turns with,
  in the order of the rotary module's frequencies (probed one axis at a time, then proven);
* ``rope_last``: the rotated dims are the head's last ones, its NoPE dims first (DeepSeek-V4 lays a head
  out as ``[nope | rope]`` and passes the whole head to the rope; its rotary module reads ``head_dim``, not
  ``qk_rope_head_dim``);
* ``rope_key``: the attention's attribute that names its entry of a nested ``rope_parameters`` whose keys
  are not layer types (DeepSeek-V4's ``rope_layer_type``: ``"main"`` or ``"compress"``);
* ``inner_rotary``: rotary modules inside the attention (compressors, an indexer) rotate tensors at
  positions of their own, so each rope call rotates at the positions of the rotary call that made its
  ``cos``, and a call with that ``sin`` negated rotates back (DeepSeek-V4 un-rotates the attention's
  output at the query's position);
* ``derived_rope``: the family's config class derives its rope parameters at construction (DeepSeek-V4
  nests ``"main"`` / ``"compress"`` from flat keys and a ``partial_rotary_factor`` from
  ``qk_rope_head_dim``), so a ``config.json`` dict is read through that class, never as it stands;
* ``upstream_inside``: sub-modules of the attention that rotate with upstream's rope, the dispatchers
  inactive in their forward (a sparse-attention indexer calling the attention's own rope function);
* ``verified``: the row was probed from the modeling code and proven (:mod:`liepos.interop.hf_verify`),
  not written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Family", "FAMILIES", "family_of"]

_APPLY = ("apply_rotary_pos_emb",)


@dataclass(frozen=True)
class Family:
    """The per-family facts :func:`~liepos.interop.patch_model` and :func:`~liepos.from_hf` read."""

    model_type: str
    module: str = ""
    attention: tuple[str, ...] = ()
    layout: str = "half"
    default_partial: bool = False
    splits_rotary: bool = False
    seq_first: bool = False
    softmax_mscale: bool = False
    apply: tuple[str, ...] = _APPLY
    raw_keys: bool = True
    why: str = ""
    positions: str = "rope"
    axes: int = 1
    direction: int = 1
    rotary_dims: int = 0
    axis_of: tuple[int, ...] = ()
    upstream_inside: tuple[str, ...] = ()
    rope_last: bool = False
    rope_key: str = ""
    inner_rotary: bool = False
    derived_rope: bool = False
    verified: bool = False

    @property
    def modeling(self) -> str:
        """The transformers module of the family's modeling code."""
        return f"transformers.models.{self.module}.modeling_{self.module}"


def _rope(model_type: str, attention: str, module: str | None = None, **facts: Any) -> Family:
    return Family(model_type, module or model_type, (attention,), **facts)


_SOFTCAP = "Gemma 2/3 soft-cap their attention logits (attn_logit_softcapping), which liepos.attention does not"
_SINKS = "GPT-OSS adds learned attention sinks (s_aux) to the softmax, which liepos.attention does not"
# the other MLA families of transformers: their attention multiplies the softmax scale by m(s, mscale_all_dim)²
# (yarn_apply_mscale in each modeling file); from_hf knows it, patch_model does not patch them
_BOTH = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave")
_INTERLEAVE = ("apply_rotary_pos_emb_interleave",)
# MLA families whose decoupled rotary slice is DeepSeek-V3's (yarn_apply_mscale on the softmax scale)
_MLA_ROWS = (
    ("glm4_moe_lite", "Glm4MoeLiteAttention", "rope_interleave", _BOTH),
    ("mistral4", "Mistral4Attention", "rope_interleave", _BOTH),
    ("youtu", "YoutuAttention", "rope_interleave", _BOTH),
    ("axk1", "AXK1Attention", "rope_interleave", _BOTH),
    ("minicpm3", "MiniCPM3Attention", "half", ("apply_rotary_pos_emb",)),
    ("longcat_flash", "LongcatFlashMLA", "interleaved", _INTERLEAVE),
    ("bailing_hybrid", "BailingHybridAttention", "interleaved", _INTERLEAVE),
    # the indexer rotates with the other apply function, which stays upstream's
    ("deepseek_v32", "DeepseekV32Attention", "interleaved", _INTERLEAVE),
    ("axk2", "AXK2Attention", "interleaved", _INTERLEAVE),
    # complex freqs_cis on pairs (2k, 2k + 1): the interleaved rotation
    ("deepseek_v2", "DeepseekV2Attention", "interleaved", ("apply_rotary_emb",)),
)
# the indexer of these calls the attention's own rope function, on (batch, seq, heads, dim), inside the
# attention's forward: it keeps upstream's rope
_INDEXED = (
    ("glm_moe_dsa", "GlmMoeDsaAttention", "glm_moe_dsa", "GlmMoeDsaIndexer", _INTERLEAVE),
    ("mistral_large4_text", "MistralLarge4TextAttention", "mistral_large4", "MistralLarge4TextIndexer", _INTERLEAVE),
    ("hy_v4", "HYV4Attention", "hy_v4", "HYV4Indexer", ("apply_rotary_pos_emb",)),
)
_HY_V4_VL = ("HunYuan-V4-VL's M-RoPE interleaves its three position axes across the frequencies "
             "(recomposition_frequencies), which liepos does not reproduce yet")
_OWN = "the family computes attention itself, not through ALL_ATTENTION_FUNCTIONS"
_DEEPSEEK_V4 = ("DeepSeek-V4's attention adds per-head sinks and its compressors and indexer rotate compressed keys "
                "and queries with the rope inside the attention, so the cached keys are rotated ones")

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    _rope("llama", "LlamaAttention"),
    _rope("mistral", "MistralAttention"),
    _rope("mixtral", "MixtralAttention"),
    _rope("qwen2", "Qwen2Attention"),
    _rope("qwen2_moe", "Qwen2MoeAttention"),
    _rope("qwen3", "Qwen3Attention"),
    _rope("qwen3_moe", "Qwen3MoeAttention"),
    _rope("gemma", "GemmaAttention"),
    _rope("gemma2", "Gemma2Attention", raw_keys=False, why=_SOFTCAP),
    _rope("gemma3_text", "Gemma3Attention", "gemma3", raw_keys=False, why=_SOFTCAP),
    _rope("olmo", "OlmoAttention"),
    _rope("olmo2", "Olmo2Attention"),
    _rope("granite", "GraniteAttention"),
    _rope("starcoder2", "Starcoder2Attention"),
    _rope("cohere", "CohereAttention", layout="interleaved"),
    _rope("glm", "GlmAttention", layout="interleaved", default_partial=True),
    _rope("glm4", "Glm4Attention", layout="interleaved", default_partial=True),
    _rope("stablelm", "StableLmAttention", default_partial=True, splits_rotary=True),
    _rope("phi", "PhiAttention", default_partial=True, splits_rotary=True),
    _rope("phi3", "Phi3Attention", default_partial=True),
    _rope("gpt_neox", "GPTNeoXAttention", default_partial=True),
    _rope("falcon", "FalconAttention", raw_keys=False, why=_OWN),
    _rope("deepseek_v3", "DeepseekV3Attention", layout="rope_interleave", softmax_mscale=True,
          apply=("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave")),
    _rope("gpt_oss", "GptOssAttention", raw_keys=False, why=_SINKS),
    _rope("smollm3", "SmolLM3Attention"),
    _rope("llama4_text", "Llama4TextAttention", "llama4", layout="interleaved", seq_first=True,
          apply=("apply_rotary_emb",)),
    _rope("qwen2_vl_text", "Qwen2VLAttention", "qwen2_vl", axes=3),
    _rope("qwen2_5_vl_text", "Qwen2_5_VLAttention", "qwen2_5_vl", axes=3),
    *(_rope(t, attention, layout=layout, softmax_mscale=True, apply=apply) for t, attention, layout, apply in _MLA_ROWS),
    *(_rope(t, attention, module, layout="interleaved" if apply == _INTERLEAVE else "half", softmax_mscale=True,
            apply=apply, upstream_inside=(indexer,)) for t, attention, module, indexer, apply in _INDEXED),
    Family("hy_v4_vl_text", positions="refused", why=_HY_V4_VL),
    # [nope | rope] heads, interleaved pairs; sliding layers read the "main" rope, compressed ones "compress", and
    # the compressors' and indexer's rotary modules rotate compressed keys at their windows' positions
    _rope("deepseek_v4", "DeepseekV4Attention", layout="interleaved", default_partial=True, rope_last=True,
          rope_key="rope_layer_type", inner_rotary=True, derived_rope=True, raw_keys=False, why=_DEEPSEEK_V4),
    Family("bloom", "bloom", ("BloomAttention",), positions="alibi"),
    Family("mpt", "mpt", ("MptAttention",), positions="alibi"),
    Family("gpt2", positions="absolute"),
    Family("opt", positions="absolute"),
)}
# model types whose text decoder is one of the rows above
_ALIASES = {"gemma3": "gemma3_text", "llama4": "llama4_text", "qwen2_vl": "qwen2_vl_text",
            "qwen2_5_vl": "qwen2_5_vl_text", "mistral_large4": "mistral_large4_text", "hy_v4_vl": "hy_v4_vl_text"}


def family_of(model_type: Any) -> Family | None:
    """The row for ``model_type`` (a config's ``model_type``), or None for a family liepos does not know.

    >>> family_of("llama").layout, family_of("cohere").layout, family_of("unknown") is None
    ('half', 'interleaved', True)
    """
    if not isinstance(model_type, str):
        return None
    return FAMILIES.get(_ALIASES.get(model_type, model_type))
