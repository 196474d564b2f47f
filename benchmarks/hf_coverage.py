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
* **refused**: patch_model raised, with its reason;
* **mismatch**: patch_model accepted the model and the outputs differ (a silent divergence: a bug);
* **failed**: the patched model raised while running;
* **could not build**: the tiny config, the model or its unpatched forward raised (the exception).

Each model runs in a worker process with a time limit (``--timeout``); a worker that hangs is
killed and the next model gets a fresh one. Writes ``benchmarks/results/hf_coverage.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
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
    # other spellings of the same sizes
    d_model=64, n_heads=4, n_layers=2, n_layer=2, n_head=4, n_embd=64, num_layers=2, num_heads=4,
    ffn_hidden_size=128, n_positions=128, max_seq_len=128,
)
# per-family facts a tiny model needs beyond SMALL
_MLA = dict(num_key_value_heads=4, head_dim=8, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=16)
EXTRA: dict[str, dict[str, Any]] = {
    "gptj": dict(rotary_dim=8), "codegen": dict(rotary_dim=8),
    **{t: _MLA for t in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "glm4_moe_lite", "glm_moe_dsa",
                         "longcat_flash", "minicpm3", "mistral4", "mistral_large4", "mistral_large4_text", "youtu",
                         "kimi_k25")},
    "dots1": dict(n_shared_experts=1),
    "dbrx": dict(attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                 ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}),
    "qwen3_next": dict(num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"]),
}
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


def _shrunk(config: Any, small: dict[str, Any], extra: dict[str, Any]) -> Any:
    """``config`` with ``small`` (and ``extra``) over every sub-config that has those fields."""
    for name in list(vars(config)):
        sub = getattr(config, name, None)
        if hasattr(sub, "to_dict") and hasattr(sub, "model_type") and name.endswith("config"):
            setattr(config, name, _shrunk(sub, small, {}))
    d = config.to_dict()
    for key in _PER_LAYER:
        d.pop(key, None)
    d.update({k: v for k, v in small.items() if k in d})
    d.update(extra)
    d.pop("model_type", None)
    for name in list(d):
        sub = getattr(config, name, None)
        if hasattr(sub, "to_dict") and hasattr(sub, "model_type"):
            d[name] = sub  # keep the shrunk sub-config object
    return type(config)(**d)


def _attempts(model_type: str) -> list[dict[str, Any]]:
    """The tiny sizes to try, in order: SMALL, then what strict configs ask for (no grouped-query
    attention, a derived head_dim, M-RoPE sections that fit the head)."""
    small = {**SMALL, **EXTRA.get(model_type, {})}
    mha = dict(small, num_key_value_heads=small["num_attention_heads"])
    derived = {k: v for k, v in small.items() if k != "head_dim"}
    mrope = dict(small, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    half = dict(small, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]})
    return [small, mha, derived, dict(derived, num_key_value_heads=small["num_attention_heads"]), mrope, half]


def _model_class(config: Any, causal: bool) -> Any:
    """The auto class for ``config``, else the modeling module's own class whose config_class it is."""
    import importlib

    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    if causal:
        return AutoModelForCausalLM
    if config.model_type in MODEL_MAPPING_NAMES:
        return AutoModel
    modeling = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    own = [c for c in vars(modeling).values() if isinstance(c, type) and getattr(c, "config_class", None) is type(config)
           and hasattr(c, "from_config") and c.__module__ == modeling.__name__]
    own.sort(key=lambda c: (not c.__name__.endswith("ForCausalLM"), not c.__name__.endswith("Model"), c.__name__))
    if not own:
        raise ValueError(f"no model class of {modeling.__name__} takes a {type(config).__name__}")
    return own[0]


def build(model_type: str, small: dict[str, Any]) -> tuple[Any, bool]:
    """A tiny random model of ``model_type`` and whether it is a causal LM (greedy decoding compared)."""
    import torch
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    torch.manual_seed(0)
    small = dict(small)
    config = _shrunk(AutoConfig.for_model(model_type, **small), small, EXTRA.get(model_type, {}))
    types = getattr(config, "layer_types", None)
    if isinstance(types, list) and "linear_attention" in types and "full_attention" not in types:
        # a hybrid shrunk to linear-attention layers only: one full-attention layer, which the rope is for
        small["layer_types"] = ["linear_attention"] * (len(types) - 1) + ["full_attention"]
        config = _shrunk(AutoConfig.for_model(model_type, **small), small, {"layer_types": small["layer_types"]})
    config._attn_implementation = "eager"
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    model = _model_class(config, causal).from_config(config)
    return model.eval(), causal


def _reference(model_type: str) -> tuple[Any, bool, Any, Any, Any, dict[str, Any]]:
    """The first attempt that builds and runs unpatched: (model, causal, input, output, greedy tokens, gen)."""
    import torch

    x = torch.randint(3, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1))
    gen = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    first: Exception | None = None
    for small in _attempts(model_type):
        try:
            model, causal = build(model_type, small)
            with torch.no_grad():
                want = _output(model(input_ids=x)).float()
                tokens = model.generate(x, **gen) if causal else None
            return model, causal, x, want, tokens, gen
        except Exception as err:  # noqa: BLE001 - the next attempt; the first error is the row's reason
            first = first or err
    raise first  # type: ignore[misc]


def _output(out: Any) -> Any:
    import torch

    if hasattr(out, "logits") and out.logits is not None:
        return out.logits
    if hasattr(out, "last_hidden_state") and out.last_hidden_state is not None:
        return out.last_hidden_state
    first = out[0] if isinstance(out, tuple | list) else next(iter(out.values()))
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"the model's output has no logits or hidden states ({type(out).__name__})")
    return first


def run_one(model_type: str) -> dict[str, Any]:
    """One row: build, run unpatched, patch, run patched, compare."""
    import torch
    from liepos.interop import patch_model

    row: dict[str, Any] = {"model_type": model_type}
    try:
        model, causal, x, want, want_tokens, gen = _reference(model_type)
        row["class"] = type(model).__name__
    except Exception as err:  # noqa: BLE001 - the row says what failed
        return dict(row, status="could not build", reason=_short(err))
    try:
        patch_model(model)
    except Exception as err:  # noqa: BLE001
        return dict(row, status="refused", reason=_short(err))
    try:
        with torch.no_grad():
            got = _output(model(input_ids=x)).float()
            got_tokens = model.generate(x, **gen) if causal else None
    except Exception as err:  # noqa: BLE001
        return dict(row, status="failed", reason=_short(err), trace=traceback.format_exc()[-1500:])
    rel = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
    greedy = None if want_tokens is None else bool(torch.equal(got_tokens, want_tokens))
    ok = rel <= TOL and greedy is not False
    return dict(row, status="exact" if ok else "mismatch", rel=rel, greedy=greedy)


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


STATUSES = ("exact", "refused", "mismatch", "failed", "could not build")


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
        f"{len(rows)} model types: " + ", ".join(f"**{counts[s]} {s}**" for s in STATUSES) + ".",
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
        reason = r.get("reason", "").replace("|", "\\|")[:300]
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
    meta = dict(command="OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/hf_coverage.py" + (" --quick" if args.quick else ""),
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
        meta["command"] = full["command"].split(" (")[0] + f" (rows {' '.join(args.only)} rerun with --only … --update)"
    write(rows, out, dict(meta, seconds=time.time() - t0))
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    print(", ".join(f"{n} {s}" for s, n in counts.items()), f"({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
