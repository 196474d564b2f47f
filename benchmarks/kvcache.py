"""Decode through ``lp.attention`` with a ``KVCache``: ``python benchmarks/kvcache.py [--quick]``.

A prefill of ``--prefill`` tokens, then ``--steps`` single-token steps (batch 1, 8 heads, head dim 64,
float32, one thread), for RoPE (keys kept encoded at absolute times) and xPos (keys kept encoded at the
store's origin). Prints the mean time per step and how often the cache's buffers moved (the encoded
keys' ``data_ptr`` changed from one step to the next: a reallocation): the cache writes each step in place into buffers that double,
so a generation copies O(n) positions, not the whole cache per step. Writes nothing.
"""

from __future__ import annotations

import argparse
import time

import torch

import liepos as lp
from liepos.attend import attention


def run(enc: lp.Encoding, prefill: int, steps: int) -> tuple[float, int]:
    """Seconds per decode step and how many steps moved the encoded keys to a new buffer."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, prefill + steps, 64, generator=g) for _ in range(3))
    cache, moves, last = lp.KVCache(), 0, None
    with torch.no_grad():
        attention(q[:, :, :prefill], k[:, :, :prefill], v[:, :, :prefill], enc, cache=cache)
        t0 = time.perf_counter()
        for i in range(prefill, prefill + steps):
            attention(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], enc, cache=cache)
            ptr = cache.encoded.get("k").data_ptr()
            moves, last = moves + (ptr != last), ptr
        return (time.perf_counter() - t0) / steps, moves


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a 64-token prefill and 200 steps")
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--steps", type=int, default=1000)
    args = p.parse_args(argv)
    prefill, steps = (64, 200) if args.quick else (args.prefill, args.steps)
    torch.set_num_threads(1)
    for name, enc in (("rope", lp.rope(64)), ("xpos", lp.xpos(64))):
        dt, moves = run(enc, prefill, steps)
        print(f"{name}: {dt * 1e3:.3f} ms per step, the encoded keys moved {moves} times in {steps} steps "
              f"(prefill {prefill})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
