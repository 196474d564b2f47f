"""Coverage of `patch_model` over every rotary or ALiBi model type of the installed transformers.

Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/hf_coverage.py            # every model type
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/hf_coverage.py --quick    # a handful, to try it
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/hf_coverage.py --only cohere2 nanochat

Every model type whose modeling file carries a rotary embedding or ALiBi is built from a tiny config
with random weights (``AutoConfig.for_model(model_type, **SMALL)``, its sub-configs shrunk the same way;
nothing is downloaded), run unpatched, patched with ``liepos.interop.patch_model`` (the encoding its
config means: a table family, or one verified against its modeling code), and compared against itself:

* **exact**: max|Δlogit| / max|logit| ≤ 1e-4 on 24 tokens and the same 8 greedy tokens (causal LMs);
  without logits, the last hidden state, else the first float output (Mimi's audio, not its codes);
* **refused**: patch_model raised, with its reason;
* **mismatch**: patch_model accepted the model and the outputs differ (a silent divergence: a bug);
* **failed**: the patched model raised while running;
* **not measured**: patch_model accepted a model whose unpatched forward runs on none of the inputs
  tried: nothing compared, nothing claimed; where patch_model refuses such a model the row is
  **refused**, with the forward's error beside the reason. The inputs tried, in order: token ids, then
  tiny random features of what the forward takes instead or beside them (audio features either way
  round, a waveform, latents, pixels, a time series, embeddings; ``_candidates``); the first that runs
  unpatched is the one the patched model gets, and a forward that samples is seeded alike both times;
* **exact (in parent)**: a sub-config type with no model class of its own (``mllama_text_model``), measured
  inside a parent that builds it (the shortest-named model type whose config holds it, then up to two
  more): the parent patched is exact as above, *and* it is true of the component (``in_parent``): modules
  built from the component's config class ran in the compared forward, and either every one of them whose
  forward calls a rope function carries liepos' patched forward (every rotary module of it records its
  positions for liepos, no position embedding of it left upstream's), or none of them encodes positions at
  all. The row gives the parent's figures and names the patched attention modules; the summary counts these
  among the exact and says how many;
* **component**: such a sub-config type for which that is not shown (a tower whose rope stays upstream's,
  modules the token-only forward never runs, a parent that is not exact): the row says which and why;
* **could not build**: the tiny config or the model raised (the exception).

A patch tower (a forward taking ``hidden_states`` or ``pixel_values`` with ``grid_thw``) gets the flattened
patches of one image grid of (2 · merge) × (3 · merge) patches. The omni configs (``THINKER``) are built as
their thinker's for-conditional-generation model. A type no auto class takes is built with its modeling
module's own model class where its parent does not show it exact (or it has no parent): a component whose
own class patch_model refuses, or whose unpatched output is not finite, stays a component.

The tiny config is ``SMALL`` at every level (sub-configs, encoder and decoder included); where a
config's validator rejects the combination (a width that must equal another, grouped-query attention
refused, a list-valued field), the field it names is set to agree and the config built again.

Each model runs in a worker process with a time limit (``--timeout``); a worker that hangs is
killed and the next model gets a fresh one. Writes ``benchmarks/results/hf_coverage.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOL = 1e-4
SEQ, NEW, VOCAB = 24, 8, 128
QUICK = ["llama", "cohere2", "ernie4_5", "nanochat", "helium", "persimmon", "apertus", "gptj", "gpt_neox", "bloom"]
SMALL: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=128, initializer_range=0.2,
    attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    # MoE sizes (ignored by the families that do not read them)
    moe_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    n_group=1, topk_group=1, first_k_dense_replace=1, shared_expert_intermediate_size=32,
    index_topk=16,  # sparse-attention indexers select fewer keys than the input
    # other spellings of the same sizes
    d_model=64, n_heads=4, n_layers=2, n_layer=2, n_head=4, n_embd=64, num_layers=2, num_heads=4,
    ffn_hidden_size=128, n_positions=128, max_seq_len=128,
)
# sizes of the fields a config already has (vision towers), never passed as new attributes
FIELDS: dict[str, Any] = dict(depth=2, embed_dim=64, encoder_attention_heads=4, decoder_attention_heads=4,
                              encoder_layers=2, decoder_layers=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                              upsample_groups=64)  # a depthwise convolution over hidden_size channels (Mimi)
# per-family facts a tiny model needs beyond SMALL
_MLA = dict(num_key_value_heads=4, head_dim=8, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=16)
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
EXTRA: dict[str, dict[str, Any]] = {
    "gptj": dict(rotary_dim=8), "codegen": dict(rotary_dim=8),
    **{t: _MLA for t in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa",
                         "longcat_flash", "minicpm3", "mistral4", "mistral_large4", "mistral_large4_text", "youtu",
                         "kimi_k25")},
    # [nope | rope] heads of 32 dims (8 rotated); one layer of each attention type, with compression rates and a
    # sliding window short enough that the test sequence fills windows of each and slides past the window
    "deepseek_v4": dict(num_key_value_heads=1, head_dim=32, partial_rotary_factor=0.25, q_lora_rank=32, o_groups=2,
                        o_lora_rank=16, num_hidden_layers=3, sliding_window=8,
                        layer_types=["sliding_attention", "compressed_sparse_attention",
                                     "heavily_compressed_attention"],
                        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}),
    "mistral4": dict(_MLA, head_dim=16),  # its rotary module reads head_dim = qk_nope + qk_rope
    "dots1": dict(n_shared_experts=1),
    "dbrx": dict(attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                 ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}),
    "qwen3_next": dict(num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"]),
    # hybrids whose layer list has no default for a shrunk depth: one recurrent layer, one attending
    "lfm2_moe": dict(layer_types=["conv", "full_attention"]),
    "zamba2": dict(layers_block_type=["linear_attention", "hybrid"], use_mem_rope=True),
    "bamba": dict(attn_layer_indices=[1]),
    "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
    # per-layer-type rope parameters for the layer types of the shrunk depth
    "cohere_compass_text": dict(rope_parameters={"full_attention": _ROPE}),
    "gemma3n_text": dict(layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0),
    # the rope these types carry, switched on (their default positions are absolute or none)
    "esm": dict(position_embedding_type="rotary"), "granitemoehybrid": dict(position_embedding_type="rope"),
    # Flint rotates its sliding-window layers only, and its first two layers attend in full
    "flint": dict(num_hidden_layers=3, layer_types=["full_attention", "full_attention", "sliding_attention"],
                  sliding_window=8),
    "diffusion_gemma": dict(top_k_experts=2),
    "chameleon": dict(vocabulary_map={"<image>": 3}),  # no image tokens: the text path
    "deepseek_ocr2_text": dict(mlp_layer_types=["dense", "sparse"]),
    # Dory's config reads its saved form: an mlp block after each attention, every count doubled
    "dory": dict(layer_types=["sliding_attention", "mlp", "full_attention", "mlp"], num_hidden_layers=4,
                 n_input_layers=2, n_recurrent_layers=0, n_output_layers=2, sliding_window=8,
                 rope_parameters={"sliding_attention": _ROPE, "full_attention": dict(_ROPE, rope_theta=1e6)}),
    "molmo2_adapter": dict(vision_feature_layer=[1, 0]),
    "apertus1p5_text": dict(vocab_size=266752),  # its audio and image token ranges sit at the top of the vocabulary
    "kyutai_speech_to_text": dict(vocab_size=4001),
    "dia_decoder": dict(cross_hidden_size=64),
    "blt": dict(encoder_hash_byte_group_vocab=512),  # 500 002 hash rows per group otherwise: a minute of random init
    "step3p7": dict(sliding_window=16),
    # one layer per stack, one cycle each: num_hidden_layers = per stack · H_cycles · (L_cycles + 1)
    "hrm_text": dict(num_layers_per_stack=1, H_cycles=1, L_cycles=1, L_bp_cycles=[1]),
    # the sparse-attention indexer's sizes (no defaults)
    # the thinker's M-RoPE index reads vision_start_token_id, which its config class lacks and the
    # checkpoints' thinker_config carries (upstream's default of the other omni configs)
    # Dots3's vision tower derives its per-layer expert counts (per_layer_config) from pyramid_num_routed,
    # 42 layers by default: one dense and one sparse layer for the shrunk depth
    # (and its adapters' widths those of the tiny tower and text model)
    "dots3_note_vision_encoder": dict(pyramid_num_routed=[-1, 4], adapter_in_dim=64, adapter_out_dim=64),
    "dots3_note_audio_encoder": dict(adapter_out_dim=64),
    # T5Gemma 2's top config hands its dropout_rate to the encoder's text config; the encoder alone reads it there
    "t5gemma2_text": dict(dropout_rate=0.0),
    # Granite 4 Vision's projector injects vision layers into LLM layers by a map with no default: the shrunk depths'
    "granite4_vision": dict(deepstack_layer_map=[[0, 0], [1, 1]], spatial_target_layers=[0, 1, 0, 1],
                            downsample_rate="1/2"),
    # ESMFold2's atom transformers (a config class without a model type of its own) pack 3 · 2 spatial and 10 UID
    # rotary pairs into half a head: a head of 32
    # (their output the token width, which the single inputs carry beside 2 · 33 residue types and one flag)
    "EsmFold2AtomEncoderConfig": dict(head_dim=32, output_dim=64), "esmfold2": dict(single_inputs_size=64 + 67),
    "qwen2_5_omni_thinker": dict(vision_start_token_id=151652),
    "qwen3_omni_moe_thinker": dict(vision_start_token_id=151652),
    "qwen4_exp_text": dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=16,
                           indexer_compress_ratio=4),
}
# parameters a family initialises to zero that would make its scores position-free (ZAYA's key temperature
# multiplies every key by 0: uniform attention, whatever the rope): set to random values so the rope is exercised
NONZERO: dict[str, tuple[str, ...]] = {"zaya": ("qk_norm.temp",)}
# conditioning a decoder's layers read beside the tokens, that its composite computes and passes on (Voxtral
# Realtime's time embedding, ``t_cond``): a random one of the hidden width, the same both runs
CONDITIONS: dict[str, tuple[str, ...]] = {"voxtral_realtime_text": ("t_cond",)}
# omni configs that no model class runs (their for-generation class only generates): the row is the
# thinker's for-conditional-generation model built from the shrunk ``thinker_config``, the text model
# inside it the one that carries the rope
THINKER = ("qwen2_5_omni", "qwen3_omni_moe")
# per-layer lists of the full-size config, dropped before shrinking (rebuilt for the new depth)
_PER_LAYER = ("layer_types", "no_rope_layers", "mlp_only_layers", "sliding_window_pattern", "block_types",
              "layers_block_type", "attn_layer_indices", "moe_layer_freq", "mlp_layer_types", "kv_source_layers",
              "activation_sparsity_pattern", "per_layer_config")


def model_types() -> list[str]:
    """Every model type whose modeling file carries a rotary embedding or ALiBi."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    root = Path(transformers.__file__).parent / "models"
    found = []
    for mt in CONFIG_MAPPING_NAMES:
        module = model_type_to_module_name(mt)
        path = root / module / f"modeling_{module}.py"
        if path.exists() and re.search(r"class \w*Rotary\w*\(|apply_rotary_pos_emb|alibi", path.read_text(), re.I):
            found.append(mt)
    return found


def _is_config(obj: Any) -> bool:
    return hasattr(obj, "to_dict") and hasattr(obj, "model_type")


def _read_only(cls: type) -> set[str]:
    """The config class's properties without a setter (derived values: passing them back would raise)."""
    return {k for k in dir(cls) if isinstance(getattr(cls, k, None), property) and getattr(cls, k).fset is None}


_RECURRENT = {"linear_attention", "conv", "mamba", "mamba2", "ssm", "recurrent", "rwkv", "deltanet", "gated_deltanet"}
_DROP = object()  # a repair that drops the key: the class's own default


def _set(d: dict[str, Any], name: str, value: Any) -> bool:
    """``d[name] = value``, or on the sub-config ``d[a]`` for ``name = "a.b"``; False when there is no such field."""
    head, _, leaf = name.rpartition(".")
    if head:
        sub = d.get(head)
        if not _is_config(sub) or leaf not in vars(sub) or getattr(sub, leaf) == value:
            return False
        setattr(sub, leaf, value)
        return True
    if name not in d or d[name] == value:
        return False
    d[name] = value
    return True


def _value(d: dict[str, Any], name: str) -> Any:
    head, _, leaf = name.rpartition(".")
    return vars(d[head]).get(leaf) if head and _is_config(d.get(head)) else d.get(name)


def _repair(msg: str, d: dict[str, Any]) -> bool:
    """Make ``d`` satisfy the validator that raised ``msg`` (the tiny sizes made two fields disagree)."""
    if m := re.search(r"Field '(\w+)' with value .* doesn't match any type", msg):
        return d.pop(m.group(1), _DROP) is not _DROP  # a list-valued field given a number: the default
    if "num_key_value_heads" in msg and re.search(r"must match|must be the same|must equal|grouped-query", msg):
        return _set(d, "num_key_value_heads", d.get("num_attention_heads"))
    if "is not a multiple of the number of attention heads" in msg and {"head_dim", "num_heads"} <= set(d):
        return _set(d, "embed_dim", d["head_dim"] * d["num_heads"])
    if m := re.search(r"`(\w+)` \((\d+)\) must be a class below `(\w+)` \((\d+)\)", msg):
        return _set(d, m.group(1), int(m.group(4)) - 1)
    if m := re.search(r"supports `(\w+)=(\d+)` only", msg):
        return _set(d, m.group(1), int(m.group(2)))
    if m := re.search(r"got (\d+)(?:, \d+)* and \d+ for `num_hidden_layers`", msg):
        return _set(d, "num_hidden_layers", int(m.group(1)))
    if m := re.search(r"((?:\w+ \+ )+\w+) must equal num_hidden_layers", msg):
        parts = m.group(1).split(" + ")
        return all(isinstance(d.get(k), int) for k in parts) and _set(d, "num_hidden_layers", sum(d[k] for k in parts))
    if m := re.search(r"(\w+) should be equal to the last value in (\w+)", msg):
        return isinstance(d.get(m.group(2)), list) and _set(d, m.group(1), d[m.group(2)][-1])
    # "`a.x` (512) must equal / match `b.y` (64)", "x must match y": the first follows the second
    m = re.search(r"`?([\w.]+)`? (?:\(\d+\) )?(?:must|should) (?:equal|match|be equal to) (?:the backbone )?`?([\w.]+)`?", msg)
    if m and _value(d, m.group(2)) is not None:
        return _set(d, m.group(1), _value(d, m.group(2)))
    return False


def _construct(cls: type, d: dict[str, Any]) -> Any:
    """``cls(**d)``, repairing what its validators name (at most a few times)."""
    for _ in range(6):
        try:
            return cls(**d)
        except Exception as err:  # noqa: BLE001 - a validator: repaired, else raised
            if not _repair(str(err), d):
                raise
    return cls(**d)


def _shrunk(config: Any, small: dict[str, Any], extra: dict[str, Any]) -> Any:
    """``config`` with ``small`` (and ``extra``) over every sub-config that has those fields."""
    for name, sub in list(vars(config).items()):  # vars: per-layer attributes raise on getattr
        if _is_config(sub):  # text_config, vision_config, encoder, decoder, ...
            facts = EXTRA.get(sub.model_type) or EXTRA.get(type(sub).__name__, {})  # its own row's (or class's) facts
            setattr(config, name, _shrunk(sub, small, facts))
    d = config.to_dict()
    for key in _PER_LAYER:
        d.pop(key, None)
    d.update({k: v for k, v in {**FIELDS, **small}.items() if k in d and k != "rope_parameters"})
    rope, want = d.get("rope_parameters"), small.get("rope_parameters")
    mrope = "mrope_section" in rope if isinstance(rope, dict) else False
    mrope = mrope or "mrope_section" in (getattr(config, "ignore_keys_at_rope_validation", None) or ())
    if isinstance(rope, dict) and mrope and want:  # M-RoPE sections that fit the tiny head (default ones too)
        d["rope_parameters"] = dict(rope, mrope_section=want["mrope_section"])
    d.update(extra)
    d.pop("model_type", None)
    for key in _read_only(type(config)):
        d.pop(key, None)
    for name in list(d):
        sub = vars(config).get(name)
        if _is_config(sub):
            d[name] = sub  # keep the shrunk sub-config object
    out = _construct(type(config), d)
    types = vars(out).get("layer_types")
    if isinstance(types, list) and types and set(types) <= _RECURRENT and "layer_types" not in _read_only(type(out)):
        # a hybrid shrunk to recurrent layers only: its last layer attends, the one the rope is for
        out = _construct(type(out), dict(d, layer_types=types[:-1] + ["full_attention"]))
    return out


def _attempts(model_type: str) -> list[dict[str, Any]]:
    """The tiny sizes to try, in order: SMALL, then what strict configs ask for (no grouped-query
    attention, a derived head_dim, M-RoPE sections that fit the head)."""
    small = {**SMALL, **EXTRA.get(model_type, {})}
    mha = dict(small, num_key_value_heads=small["num_attention_heads"])
    derived = {k: v for k, v in small.items() if k != "head_dim"}
    mrope = dict(small, rope_parameters={"mrope_section": [2, 3, 3]})
    half = dict(small, rope_parameters={"mrope_section": [2, 1, 1]})
    return [small, mha, derived, dict(derived, num_key_value_heads=small["num_attention_heads"]), mrope, half]


def _model_class(config: Any, causal: bool, alone: bool = False) -> Any:
    """The auto class for ``config``, else the modeling module's own class whose config_class it is
    (``alone``: a model class of the modeling module that the auto mapping does not name, see ``ALONE``)."""
    import importlib

    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    if causal:
        return AutoModelForCausalLM
    modeling = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    if config.model_type in MODEL_MAPPING_NAMES and type(config) in MODEL_MAPPING:
        try:  # the auto class, where it resolves (a class the package does not export, a config class the
            MODEL_MAPPING[type(config)]  # auto mapping does not key as AutoModel does: the module's own, below)
            return AutoModel
        except (KeyError, ValueError):
            pass
    own = [c for c in vars(modeling).values() if isinstance(c, type) and getattr(c, "config_class", None) is type(config)
           and hasattr(c, "from_config") and c.__module__ == modeling.__name__]
    name = MODEL_MAPPING_NAMES.get(config.model_type)
    if not own and name is not None:  # the model class the auto mapping names, where AutoModel does not resolve it
        own = [c for c in [getattr(modeling, name, None)] if isinstance(c, type) and hasattr(c, "_from_config")]
    if not own and alone:
        own = [c for c in vars(modeling).values() if isinstance(c, type) and getattr(c, "config_class", None) is type(config)
               and hasattr(c, "_from_config") and c.__module__ == modeling.__name__ and "PreTrained" not in c.__name__]
    own.sort(key=lambda c: (not c.__name__.endswith("ForCausalLM"), not c.__name__.endswith("Model"), c.__name__))
    if not own:
        raise ValueError(f"no model class of {modeling.__name__} takes a {type(config).__name__}")
    return own[0]


def build(model_type: str, small: dict[str, Any], alone: bool = False) -> tuple[Any, bool]:
    """A tiny random model of ``model_type`` and whether it is a causal LM (greedy decoding compared)."""
    import importlib

    import torch
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    torch.manual_seed(0)
    cls = CONFIG_MAPPING[model_type]
    try:  # the small sizes at construction, so that derived fields follow them
        first = _construct(cls, dict(small))
    except Exception:  # noqa: BLE001 - a validator that reads sub-configs: the defaults, shrunk below
        first = cls()
    config = _shrunk(first, small, EXTRA.get(model_type, {}))
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if model_type in THINKER:  # no model class runs the top config: its thinker's, which holds the text model
        config, causal = config.thinker_config, True
        modeling = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
        thinker = getattr(modeling, type(config).__name__.replace("Config", "ForConditionalGeneration"))
        model_class: Any = lambda c: thinker(c)  # noqa: E731 - a PreTrainedModel: no auto from_config
    else:
        found = _model_class(config, causal, alone)
        model_class = getattr(found, "from_config", None) or found  # the auto class, else the PreTrainedModel itself
    config._attn_implementation = "eager"
    model = model_class(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(NONZERO.get(model_type, ())):
                param.copy_(torch.rand(param.shape) + 0.5)
            elif param.is_floating_point() and param.numel() and not bool(param.abs().max() < 1e3):
                # a parameter the class's init leaves as torch.empty's memory (Qwen3-Omni's talker experts,
                # built alone): random, so the unpatched output would be non-finite or not, run to run
                param.copy_(0.02 * torch.randn(param.shape, generator=g))
    return model.eval(), causal


def _inputs(model: Any, x: Any) -> dict[str, Any]:
    """The forward's token inputs: ``input_ids``, and the same tokens for an encoder-decoder's decoder."""
    if getattr(model.config, "is_encoder_decoder", False):
        return {"input_ids": x, "decoder_input_ids": x}
    return {"input_ids": x}


def _size(config: Any, *names: str, default: int) -> int:
    """The first of ``names`` that ``config`` (or its text / audio / encoder sub-config) sets to an int."""
    subs = [config] + [vars(config).get(k) for k in ("text_config", "decoder_config", "audio_config", "encoder_config",
                                                     "vision_config")]
    for c in subs:
        for n in names:
            v = getattr(c, n, None) if c is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return default


def _candidates(model: Any, x: Any) -> list[dict[str, Any]]:
    """The inputs to try, in order: token ids alone, then the tiny random features a forward that takes
    no token ids asks for (audio features either way round, waveforms, latents, embeddings, pixels,
    a time series), with the token ids beside them where the forward takes both. The first that runs
    unpatched is the one the patched model gets."""
    import inspect

    import torch

    params = inspect.signature(model.forward).parameters
    c, g = model.config, torch.Generator().manual_seed(2)
    hidden = _size(c, "hidden_size", "d_model", default=64)
    mel = _size(c, "num_mel_bins", "feature_size", "input_feat_size", default=80)
    channels = _size(c, "audio_channels", default=1)
    frame = _size(c, "frame_size", "hop_length", default=320)
    image = _size(c, "image_size", default=32)
    codes = _size(c, "codebook_dim", default=hidden)
    depth = _size(c, "num_channels", default=0)  # multi-stream decoder ids (B, S, streams)

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=g)

    options: dict[str, list[Any]] = {
        "input_features": [rand(1, mel, 2 * SEQ), rand(1, 2 * SEQ, mel), rand(1, mel, 8 * SEQ)],
        # a waveform of 16 frames: a codec's transformer sees several positions after its downsampling
        "input_values": [rand(1, channels, 16 * frame), rand(1, 16 * frame), rand(1, channels, 16000)],
        "latents": [rand(1, codes, SEQ), rand(1, hidden, SEQ)],
        "past_values": [rand(1, 8 * SEQ)],
        "pixel_values": [rand(1, 1, 3, image, image), rand(1, 3, image, image)],
        "inputs_embeds": [rand(1, SEQ, hidden)],
    }
    layers = len(getattr(c, "target_layer_ids", None) or [0])  # a drafter's context: hidden states of these layers
    widths = {"noise_embeds": hidden, "context_hidden_states": hidden * layers}
    fixed = {n: rand(1, SEQ, w) for n, w in widths.items() if n in params}
    conditions = {n: rand(1, 1, hidden) for n in CONDITIONS.get(c.model_type, ())}  # through **kwargs to every layer
    fixed |= conditions
    decoder = [x] + ([x[..., None].expand(1, SEQ, depth).contiguous()] if depth else [])
    found = [_inputs(model, x)] + ([fixed] if fixed and "input_ids" not in params else [])
    found += [{**_inputs(model, x), **conditions}] if conditions else []
    grid = next((n for n in ("grid_thw", "image_grid_thw") if n in params), None)
    patches = next((n for n in ("hidden_states", "pixel_values") if n in params), None)
    if grid and patches:  # a patch tower: the flattened patches of one (2 · merge) × (3 · merge) grid
        kernel = getattr(c, "merge_kernel_size", None)  # Kimi's (h, w) merge kernel
        merge = int(max(kernel)) if isinstance(kernel, list | tuple) else _size(c, "spatial_merge_size", "merge_size", default=1)
        channels, size = _size(c, "in_channels", "num_channels", default=3), _size(c, "patch_size", default=14)
        embed = next((m for m in model.modules() if isinstance(m, torch.nn.Linear | torch.nn.Conv3d)), None)
        width = (embed.in_features if isinstance(embed, torch.nn.Linear) else  # the patch embedding's input width
                 embed.in_channels * math.prod(embed.kernel_size) if embed is not None else channels * size**2)
        h, w = 2 * merge, 3 * merge
        meta = {grid: torch.tensor([[1, h, w]])} | ({"merge_sizes": torch.tensor([merge])} if "merge_sizes" in params else {})
        images = (rand(1, channels, h * size, w * size), rand(1, h * size, w * size, channels),  # whole images
                  rand(h * size, w * size, channels))
        found += [{patches: p, **meta} for p in (rand(h * w, width), rand(1, h * w, width), rand(h * w, channels, size, size),
                                                 *images)]
        # merged tokens of merge × merge patches each, the grid in tokens (Inkling 2)
        found.append({patches: rand(6, merge * size, merge * size, channels), grid: torch.tensor([[1, 2, 3]])})
    for name, values in options.items():
        if name not in params:
            continue
        for value in values:
            for ids in ([True, False] if "input_ids" in params and name != "inputs_embeds" else [False]):
                for dec in (decoder if "decoder_input_ids" in params else [None]):
                    d = {name: value, **fixed}
                    if ids:
                        d["input_ids"] = x
                    if dec is not None:
                        d["decoder_input_ids"] = dec
                    if "image_attention_mask" in params and name == "pixel_values" and value.dim() == 5:
                        d["image_attention_mask"] = torch.ones(1, SEQ, 1, dtype=torch.long)  # every token sees the image
                    found.append(d)
    if "decoder_input_ids" in params:
        found += [{"input_ids": x, "decoder_input_ids": dec} for dec in decoder[1:]]
    return found


class _Unrun(Exception):
    """A model that builds but whose unpatched forward on ``input_ids`` alone raised (``model``, ``error``)."""

    def __init__(self, model: Any, error: BaseException) -> None:
        super().__init__(_short(error))
        self.model, self.error = model, error


def _reference(model_type: str, alone: bool = False) -> tuple[Any, bool, Any, Any, Any, dict[str, Any]]:
    """The first attempt that builds and runs unpatched: (model, causal, inputs, output, greedy tokens, gen).

    Raises the first build error, or :class:`_Unrun` (the first model that built) when every model
    that built raised in its forward: a further-reaching failure says more than a validator's."""
    import torch

    x = torch.randint(3, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1))
    gen = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    first: Exception | None = None
    unrun: _Unrun | None = None
    for small in _attempts(model_type):
        try:
            model, causal = build(model_type, small, alone)
        except Exception as err:  # noqa: BLE001 - the next attempt; the first error is the row's reason
            first = first or err
            continue
        for inputs in _candidates(model, x):
            try:
                with torch.no_grad():
                    torch.manual_seed(3)  # a forward that samples (a diffusion model's noise) draws the same twice
                    want = _output(model(**inputs)).float()
                    tokens = model.generate(x, **gen) if causal else None
                return model, causal, inputs, want, tokens, gen
            except Exception as err:  # noqa: BLE001 - the next inputs; the first error is the row's reason
                unrun = unrun or _Unrun(model, err)
    raise unrun or first  # type: ignore[misc]


_NO_CLASS = re.compile(r"no model class of \S+ takes a (\w+)")


def _parent(model_type: str) -> str | None:
    """The model type whose config holds ``model_type``'s config as a sub-config (at any depth): the shortest name."""
    found = _parents(model_type)
    return found[0] if found else None


def _parents(model_type: str) -> list[str]:
    """The model types whose configs hold ``model_type``'s config as a sub-config (at any depth), shortest name first
    (those of its own modeling package before others)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    want = CONFIG_MAPPING[model_type]

    def holds(cls: Any, depth: int = 0) -> bool:
        subs = dict(getattr(cls, "sub_configs", None) or {}).values()
        return any(c is want or (depth < 3 and isinstance(c, type) and holds(c, depth + 1)) for c in subs)

    package = want.__module__.rsplit(".", 2)[-2]
    found = [t for t in CONFIG_MAPPING_NAMES if t != model_type and CONFIG_MAPPING[t].__module__.rsplit(".", 2)[-2] == package
             and holds(CONFIG_MAPPING[t])]
    found += [t for t in CONFIG_MAPPING_NAMES if t != model_type and t not in found and holds(CONFIG_MAPPING[t])]
    return sorted(found[:8], key=len)


def _unrun_row(row: dict[str, Any], unrun: _Unrun) -> dict[str, Any]:
    """A model that built but does not run on ``input_ids`` alone: what patch_model says of it."""
    from liepos.interop import patch_model

    why = f"(its unpatched forward on every input tried raised, the first: {_short(unrun.error)[:200]}; not run)"
    try:
        patch_model(unrun.model)
    except Exception as err:  # noqa: BLE001 - patch_model's refusal is the row
        return dict(row, status="refused", reason=f"{_short(err)[:400]} {why}")
    return dict(row, status="not measured", reason=f"patch_model accepted it, but {why[1:-1]}")


def _output(out: Any) -> Any:
    """What is compared: the logits, else the last hidden state, else every float tensor of the output
    and of the outputs it nests (a contrastive model's embeddings and each tower's hidden states, a
    codec's audio), flattened and concatenated: integer codes are left out."""
    import torch

    if hasattr(out, "logits") and out.logits is not None:
        return out.logits
    if hasattr(out, "last_hidden_state") and out.last_hidden_state is not None:
        return out.last_hidden_state

    def floats(obj: Any, depth: int = 0) -> list[Any]:
        if isinstance(obj, torch.Tensor):
            return [obj.flatten()] if obj.is_floating_point() else []
        values = list(obj) if isinstance(obj, tuple | list) else list(obj.values()) if hasattr(obj, "values") else []
        return [t for v in values if depth < 2 for t in floats(v, depth + 1)]

    found = floats(out)
    if not found:
        raise TypeError(f"the model's output has no logits, hidden states or float tensors ({type(out).__name__})")
    return torch.cat(found)  # every float output, flattened


def run_one(model_type: str) -> dict[str, Any]:
    """One row: build, run unpatched, patch, run patched, compare."""
    row: dict[str, Any] = {"model_type": model_type}
    try:
        model, causal, inputs, want, want_tokens, gen = _reference(model_type)
        row["class"] = type(model).__name__
    except _Unrun as unrun:
        return _unrun_row(dict(row, **{"class": type(unrun.model).__name__}), unrun)
    except Exception as err:  # noqa: BLE001 - the row says what failed
        if not (m := _NO_CLASS.search(str(err))):
            return dict(row, status="could not build", reason=_short(err))
        if parent := _parent(model_type):
            why = f"no model class takes a {m.group(1)} alone: a sub-config of {parent}"
            done = _component_row(dict(row, status="component", parent=parent, reason=why))
            return done if done["status"] != "component" else _alone_row(done)
        return _alone_row(dict(row, status="could not build", reason=_short(err)))
    return _measured(row, model, causal, inputs, want, want_tokens, gen)


def _alone_row(row: dict[str, Any]) -> dict[str, Any]:
    """A type no auto class takes, built with its modeling module's own model class (``_model_class(alone=True)``)
    and measured as any row; kept as it was (a component, could not build) where that does not build or run,
    where patch_model refuses it, or where the unpatched output is not finite (nothing to compare)."""
    import torch

    try:
        model, causal, inputs, want, want_tokens, gen = _reference(row["model_type"], alone=True)
    except _Unrun as unrun:  # built, not run: a top-level type gets patch_model's word on it, a component stays one
        if row["status"] == "component":
            return row
        return _unrun_row({"model_type": row["model_type"], "class": type(unrun.model).__name__}, unrun)
    except Exception:  # noqa: BLE001 - the row as it was says why
        return row
    if not bool(torch.isfinite(want).all()):
        return dict(row, reason=f"{row['reason']}; built alone ({type(model).__name__}) its unpatched output is not finite")
    alone = dict(row, **{"class": type(model).__name__})
    for key in ("parent", "reason"):
        alone.pop(key, None)
    measured = _measured(alone, model, causal, inputs, want, want_tokens, gen)
    if measured["status"] == "refused" and row["status"] == "component":
        return dict(row, reason=f"{row['reason']}; built alone ({type(model).__name__}) patch_model refuses it: "
                                f"{measured['reason'][:200]}")
    return dict(measured, reason=f"no auto class takes it: built with its modeling module's {type(model).__name__}"
                + (f"; {measured['reason']}" if measured.get("reason") else ""))


def _measured(row: dict[str, Any], model: Any, causal: bool, inputs: dict[str, Any], want: Any, want_tokens: Any,
              gen: dict[str, Any], ran: Any = None) -> dict[str, Any]:
    """Patch ``model``, run it on ``inputs`` (``ran``: a context manager around that forward), compare."""
    import contextlib

    import torch
    from liepos.interop import patch_model

    try:
        patch_model(model)
    except Exception as err:  # noqa: BLE001
        return dict(row, status="refused", reason=_short(err))
    try:
        with torch.no_grad(), ran or contextlib.nullcontext():
            torch.manual_seed(3)
            got = _output(model(**inputs)).float()
        with torch.no_grad():
            got_tokens = model.generate(inputs["input_ids"], **gen) if causal else None
    except Exception as err:  # noqa: BLE001
        return dict(row, status="failed", reason=_short(err), trace=traceback.format_exc()[-1500:])
    rel = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
    greedy = None if want_tokens is None else bool(torch.equal(got_tokens, want_tokens))
    ok = rel <= TOL and greedy is not False
    return dict(row, status="exact" if ok else "mismatch", rel=rel, greedy=greedy)


# ---------------------------------------------------------------------- a component inside its parent
IN_PARENT = "exact (in parent)"
# what encodes positions: a rope function an attention calls (apply_rotary_pos_emb, rotate_half), ALiBi;
# a learned or fixed position embedding (a module or buffer named so)
_ROPE_CALL = re.compile(r"rotary|rope|rotate|alibi", re.I)
_POS_NAME = re.compile(r"pos(ition)?_?(emb|embed|embedding|bias)|relative_attention_bias", re.I)


def _component_modules(model: Any, config_class: type) -> list[tuple[str, Any]]:
    """The modules of ``model`` built from a config of ``config_class``: those whose ``config`` is one, and
    their descendants that hold no config of another class (a nested sub-config's modules are its own)."""
    found: list[tuple[str, Any]] = []

    def visit(name: str, module: Any, inside: bool) -> None:
        own = getattr(module, "config", None)
        mine = isinstance(own, config_class) or (inside and not _is_config(own))
        if mine:
            found.append((name, module))
        for child, sub in module.named_children():
            visit(f"{name}.{child}" if name else child, sub, mine)

    visit("", model, False)
    return found


def _rope_calls(module: Any) -> list[str]:
    """The module-level functions of its modeling file that the module's forward calls to encode positions."""
    import inspect

    forward = inspect.unwrap(getattr(type(module), "forward", None) or (lambda: None))
    code, env = getattr(forward, "__code__", None), getattr(forward, "__globals__", {})
    names = code.co_names if code is not None else ()
    return [n for n in names if _ROPE_CALL.search(n) and callable(env.get(n))]


def in_parent(model: Any, config_class: type, ran: set[int]) -> tuple[bool, str]:
    """Whether a patched, exact parent ``model`` is exact *of the component* of ``config_class``, and what says so.

    True only when modules of the component ran in the compared forward (``ran``: the ids of the modules
    that did) and either (a) its rope is liepos': every module of it whose forward calls a rope function
    carries liepos' patched forward and ran, every rotary module of it records positions for liepos, and
    it has no position embedding or ALiBi left upstream's; or (b) it encodes no positions at all (no
    rotary module, no rope call, no position embedding): nothing of it could have stayed upstream's."""
    mods = _component_modules(model, config_class)
    if not mods:
        return False, f"the parent {type(model).__name__} builds no module from a {config_class.__name__}"
    where = mods[0][0] or type(model).__name__
    if not any(id(m) in ran for _, m in mods):
        return False, f"none of its modules ({where}) ran in the parent's forward on the inputs compared"
    rotary = [n for n, m in mods if type(m).__name__.endswith("RotaryEmbedding") or "inv_freq" in m._buffers]
    calls = [(n, m) for n, m in mods if _rope_calls(m) and n not in rotary]
    embeds = [n for n, m in mods if _POS_NAME.search(n.rpartition(".")[2]) and n not in rotary]
    embeds += [f"{n}.{b}" for n, m in mods for b in m._buffers if _POS_NAME.search(b) and n not in rotary]
    if not (rotary or calls or embeds):
        return True, f"it encodes no positions (no rope, ALiBi or position embedding); {where} ran inside the exact parent"
    patched = [n for n, m in calls if "_liepos" in m.__dict__ and id(m) in ran]
    upstream = [n for n, m in calls if n not in patched] + embeds
    upstream += [n for n, m in mods if n in rotary and "_liepos_positions" not in m.__dict__]
    if upstream or not patched:
        return False, (f"its positions stay upstream's in {', '.join(upstream[:4])}" if upstream else
                       "liepos patched none of its attention modules")
    more = f" and {len(patched) - 4} more" if len(patched) > 4 else ""
    return True, f"liepos patched its attention {', '.join(patched[:4])}{more}, each of which ran"


def _component_row(row: dict[str, Any]) -> dict[str, Any]:
    """A component's row: its parents (the one named first, then up to two more whose configs hold it) built,
    patched and compared, with the component's modules watched; exact (in parent) in the first parent where
    :func:`in_parent` says it is true of the component, else the named parent's reason."""
    first: dict[str, Any] | None = None
    for parent in [row["parent"]] + [p for p in _parents(row["model_type"]) if p != row["parent"]][:2]:
        got = _in_one_parent(row, parent)
        if got["status"] == IN_PARENT:
            return got
        first = first or got
    return first or row


_UNBUILT: dict[str, Exception] = {}  # parents that did not build or run, by model type


def _in_one_parent(row: dict[str, Any], parent: str) -> dict[str, Any]:
    """The component ``row`` measured inside ``parent`` (see :func:`_component_row`)."""
    import contextlib

    from transformers import CONFIG_MAPPING

    try:
        if parent in _UNBUILT:
            raise _UNBUILT[parent]
        model, causal, inputs, want, want_tokens, gen = _reference(parent)
    except Exception as err:  # noqa: BLE001 - the parent's own row says why
        _UNBUILT[parent] = err  # the next component of this parent (in this worker) does not build it again
        return dict(row, reason=f"{row['reason']}; the parent {parent} does not build or run ({_short(err)[:160]})")
    ran: set[int] = set()
    cls = CONFIG_MAPPING[row["model_type"]]

    @contextlib.contextmanager
    def watching() -> Any:
        handles = [m.register_forward_hook(lambda mod, *_: ran.add(id(mod))) for _, m in _component_modules(model, cls)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    measured = _measured({"model_type": parent}, model, causal, inputs, want, want_tokens, gen, ran=watching())
    if measured["status"] != "exact":
        return dict(row, reason=f"{row['reason']}; the parent {parent} is {measured['status']} here")
    ok, why = in_parent(model, cls, ran)
    if not ok:
        return dict(row, reason=f"{row['reason']}; not exact of it in {parent}: {why}")
    return dict(row, rel=measured["rel"], greedy=measured["greedy"], status=IN_PARENT, parent=parent,
                reason=f"a sub-config of {parent}, measured in its exact {type(model).__name__}: {why}",
                **{"class": type(model).__name__})


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".replace("\n", " ")
    return text[:600]


def _worker(conn: Any) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers

    import liepos.interop.hf_model  # noqa: F401 - imported before the first model's clock starts

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    conn.send("ready")
    while True:
        model_type = conn.recv()
        if model_type is None:
            return
        conn.send(run_one(model_type))


class Pool:
    """One worker process at a time, restarted after a timeout."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.proc: Any = None

    def start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        if not self.conn.poll(600) or self.conn.recv() != "ready":  # imports (torch, transformers) untimed
            raise RuntimeError("the worker process did not start")

    def run(self, model_type: str, timeout: float) -> dict[str, Any]:
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.conn.send(model_type)
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass
            self.proc = None
            return {"model_type": model_type, "status": "could not build", "reason": "the worker process died"}
        self.proc.kill()
        self.proc.join()
        self.proc = None
        return {"model_type": model_type, "status": "could not build", "reason": f"timed out after {timeout:g} s"}

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(10)


STATUSES = ("exact", IN_PARENT, "refused", "mismatch", "failed", "not measured", "component", "could not build")


def summary(counts: dict[str, int], bold: bool = False) -> str:
    """The counts, the rows exact in their parent counted among the exact (and said how many)."""
    b = "**" if bold else ""
    head = f"{b}{counts['exact'] + counts[IN_PARENT]} exact{b} ({counts[IN_PARENT]} of them components exact in their parent)"
    return ", ".join([head] + [f"{b}{counts[s]} {s}{b}" for s in STATUSES[2:]])


def write(rows: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta, counts=counts, rows=rows), indent=1))
    lines = [
        "# patch_model over every rotary / ALiBi model type of transformers",
        "",
        f"`{meta['command']}` — transformers {meta['transformers']}, torch {meta['torch']}, "
        f"{meta['date']}, {meta['seconds']:.0f} s on a shared machine ({meta['machine']}).",
        "",
        f"{len(rows)} model types: {summary(counts, bold=True)}.",
        "",
        f"exact: max|Δlogit|/max|logit| ≤ {TOL:g} on {SEQ} tokens (hidden states for models without an LM head) "
        f"and, for causal LMs, the same {NEW} greedy tokens; tiny random models, nothing downloaded.",
        "",
        "| model type | model | result | max rel Δ | greedy equal | reason |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        rel = f"{r['rel']:.2g}" if "rel" in r else ""
        greedy = {None: "", True: "yes", False: "NO"}[r.get("greedy")]
        reason = r.get("reason", "")
        if r["status"] == "component":
            parent = next((q for q in rows if q["model_type"] == r.get("parent")), None)
            reason += (f"; only its parent builds it: parent row {parent['model_type']}: {parent['status']}" if parent
                       else "; its parent is not a row of this table")
        reason = reason.replace("|", "\\|")[:300]
        lines.append(f"| {r['model_type']} | {r.get('class', '')} | {r['status']} | {rel} | {greedy} | {reason} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    p.add_argument("--only", nargs="+", help="these model types")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per model (default 60)")
    p.add_argument("--out", type=Path, default=None, help="results path without suffix")
    p.add_argument("--update", action="store_true",
                   help="with --only: rerun those rows of the full results and write the full results again")
    args = p.parse_args(argv)
    import torch
    import transformers

    types = args.only or (QUICK if args.quick else model_types())
    default = "hf_coverage_quick" if (args.quick or args.only) and not args.update else "hf_coverage"
    out = args.out or HERE / "results" / default
    kept: list[dict[str, Any]] = []
    pool, rows, t0 = Pool(), [], time.time()
    if args.update:
        if not args.only:
            p.error("--update needs --only MODEL_TYPE ...")
        full = json.loads(out.with_suffix(".json").read_text())
        kept, t0 = full["rows"], t0 - full["seconds"]  # the time of the full run, plus this one's
    flags = (" --quick" if args.quick else "") + (f" --timeout {args.timeout:g}" if args.timeout != 60.0 else "")
    meta = dict(command="OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/hf_coverage.py" + flags,
                transformers=transformers.__version__, torch=torch.__version__,
                date=time.strftime("%Y-%m-%d", time.gmtime()), machine=f"{platform.machine()}, {os.cpu_count()} cores")
    try:
        for i, mt in enumerate(types, 1):
            t = time.time()
            row = pool.run(mt, args.timeout)
            row["seconds"] = round(time.time() - t, 2)
            rows.append(row)
            extra = f" {row['rel']:.2g}" if "rel" in row else f" — {row.get('reason', '')[:100]}"
            print(f"[{i}/{len(types)}] {mt}: {row['status']}{extra} ({row['seconds']:.1f} s)", flush=True)
            if (i % 20 == 0 or i == len(types)) and not args.update:
                write(rows, out, dict(meta, seconds=time.time() - t0))
    finally:
        pool.close()
    if args.update:  # the full table, these rows rerun in place
        fresh = {r["model_type"]: r for r in rows}
        rows = [fresh.get(r["model_type"], r) for r in kept]
        rows += [r for r in fresh.values() if r["model_type"] not in {k["model_type"] for k in kept}]
        before = re.search(r"\(rows (.*) rerun with", full["command"])  # earlier reruns stay named
        again = list(dict.fromkeys((before.group(1).split() if before else []) + list(args.only)))
        meta["command"] = full["command"].split(" (")[0] + f" (rows {' '.join(again)} rerun with --only … --update)"
    write(rows, out, dict(meta, seconds=time.time() - t0))
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    print(summary(counts), f"({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
