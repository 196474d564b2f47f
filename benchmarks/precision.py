"""Table precision and ALiBi memory, the figures of the "exact at any length" capability.

1. cos/sin of a float32 RoPE table against a 40-digit mpmath reference (the float64 frequency
   ``base^(-2k/d)`` taken as exact), at positions up to 2^31 - 1, for bases 1e4 and 5e5:
   liepos (float64 angles with exact range reduction, cast once) against Hugging Face's float32
   pipeline (``LlamaRotaryEmbedding``: inv_freq in float32, ``inv_freq @ position_ids`` in float32,
   cos/sin in float32).
2. ALiBi at 8 192 tokens, 8 heads, dim 64: ``lp.attention`` through the slots against SDPA with a
   materialised float bias, time and peak allocated memory (``bench_alibi`` of ``benchmarks/bench.py``: glibc
   ``mallinfo2`` sampled after every aten op).

Writes ``benchmarks/results/precision.{json,md}``. Run: ``python benchmarks/precision.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import mpmath
import torch

import liepos as lp
from bench import bench_alibi  # benchmarks/bench.py: this script's folder is on sys.path

POSITIONS = [0, 40, 2047, 16383, 131071, 262143, 1048575, 16777215, 2**31 - 1]
DIM = 128


def reference(w: float, t: int) -> tuple[float, float]:
    mpmath.mp.dps = 40
    a = mpmath.mpf(w) * t
    return float(mpmath.cos(a)), float(mpmath.sin(a))


def hf_tables(base: float, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=DIM * 2, num_attention_heads=2, head_dim=DIM, rope_theta=base,
                      max_position_embeddings=2**31)
    rot = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, 1, len(positions), DIM)
    cos, sin = rot(x, torch.tensor(positions, dtype=torch.long)[None])
    return cos[0, :, : DIM // 2], sin[0, :, : DIM // 2]  # (positions, planes)


def liepos_tables(base: float, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = lp.rope(DIM, base=base)
    tab = enc.tables(torch.tensor(positions, dtype=torch.float64), "query").to(torch.float32)
    return tab.a[:, 0::2], tab.b[:, 1::2]


def precision() -> list[dict]:
    rows = []
    for base in (1e4, 5e5):
        w = lp.rope_freqs(DIM, base)
        ours, hf = liepos_tables(base, POSITIONS), hf_tables(base, POSITIONS)
        for i, t in enumerate(POSITIONS):
            ref = [reference(float(w[k]), t) for k in range(DIM // 2)]
            rc = torch.tensor([c for c, _ in ref], dtype=torch.float64)
            rs = torch.tensor([s for _, s in ref], dtype=torch.float64)
            err = lambda c, s, rc=rc, rs=rs: float(torch.maximum((c.double() - rc).abs(), (s.double() - rs).abs()).max())  # noqa: E731
            rows.append({"base": base, "position": t, "liepos": err(ours[0][i], ours[1][i]),
                         "hf_float32": err(hf[0][i], hf[1][i])})
    return rows


def alibi_memory(S: int = 8192, H: int = 8, D: int = 64) -> list[dict]:
    """Time and peak allocation of ``bench.bench_alibi``, plus the largest output difference."""
    rows = bench_alibi(S=S, H=H, D=D)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, H, 512, D, generator=g) for _ in range(3))
    t = torch.arange(512, dtype=torch.float32)
    lag = t[:, None] - t[None, :]
    bias = (-lp.alibi_slopes(H).float()[:, None, None] * lag).masked_fill(lag < 0, -math.inf)
    with torch.no_grad():
        diff = float((lp.attention(q, k, v, lp.alibi(D, num_heads=H))
                      - torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])).abs().max())
    for r in rows:
        r["max_abs_diff_vs_bias_512_tokens"] = diff if r["provider"] == "liepos_alibi_slots" else 0.0
    return rows


def main() -> None:
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    prec = precision()
    alibi = alibi_memory()
    (out / "precision.json").write_text(json.dumps({"precision": prec, "alibi": alibi}, indent=2))
    lines = ["# Table precision (float32 cos/sin vs 40-digit mpmath; max abs error over 64 planes)", "",
             "| base | position | liepos | Hugging Face float32 pipeline |", "|---|---|---|---|"]
    lines += [f"| {r['base']:g} | {r['position']} | {r['liepos']:.2e} | {r['hf_float32']:.2e} |" for r in prec]
    a, b = alibi
    lines += ["", "# ALiBi at 8 192 tokens, 8 heads, dim 64 (causal, float32)", "",
              "| provider | median time | peak allocated | max abs diff vs bias (512 tokens) |", "|---|---|---|---|"]
    lines += [f"| {r['provider']} | {r['median_s'] * 1e3:.0f} ms | {r['peak_bytes'] / 2**20:.1f} MiB | "
              f"{r['max_abs_diff_vs_bias_512_tokens']:.1e} |" for r in alibi]
    lines += ["", f"ratios (slots / bias): time {a['median_s'] / b['median_s']:.2f}x, "
              f"peak memory {a['peak_bytes'] / b['peak_bytes']:.3f}x"]
    (out / "precision.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
