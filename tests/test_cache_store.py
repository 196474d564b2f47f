"""The cache's one store of encoded keys (:mod:`liepos.cache`): in-place growth that equals one append,
amortised reallocation, re-encoding at a new origin that keeps every score, rollback, autograd, and no
module writing another object's private fields."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

import liepos as lp
from liepos.attend import attention, attention_reference
from liepos.cache import GROW, EncodedKeys, KVCache, Rows

SRC = Path(__file__).resolve().parents[1] / "src" / "liepos"


def _rand(*shape: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---------------------------------------------------------------------------------------------- growth
def test_one_token_at_a_time_equals_one_append_bit_for_bit():
    n = 150  # past GROW, so the buffers were reallocated on the way
    k, v = _rand(2, 3, n, 8, seed=1), _rand(2, 3, n, 5, seed=2)
    times = torch.arange(n, dtype=torch.float64).expand(2, n) * 0.5
    keep, docs = torch.rand(2, n, generator=torch.Generator().manual_seed(3)) > 0.1, torch.arange(n).expand(2, n) // 7
    whole, steps = KVCache(), KVCache()
    whole.append(k, v, times, keep, docs)
    store_whole, store_steps = EncodedKeys("v", 3.0), EncodedKeys("v", 3.0)
    store_whole.append(k=k * 2, s=v[:, :1])
    for i in range(n):
        steps.append(k[:, :, i:i + 1], v[:, :, i:i + 1], times[:, i:i + 1], keep[:, i:i + 1], docs[:, i:i + 1])
        store_steps.append(k=k[:, :, i:i + 1] * 2, s=v[:, :1, i:i + 1])
    for name in ("k", "v", "times", "keep", "docs"):
        a, b = getattr(whole, name), getattr(steps, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert len(steps) == len(whole) == n and steps.finite
    for name in ("k", "s"):
        assert torch.equal(store_whole.get(name), store_steps.get(name)), name
    assert len(store_steps) == n


def test_growth_is_amortised():
    """1,000 single-token appends reallocate O(log n) times (the buffer at least doubles each time)."""
    cache, store = KVCache(), EncodedKeys()
    k = _rand(1, 2, 1, 4, dtype=torch.float32)
    moves, last = [0, 0], [None, None]
    for i in range(1000):
        cache.append(k, k, torch.full((1, 1), float(i), dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool), None)
        store.append(k=k)
        for j, ptr in enumerate((cache.k.data_ptr(), store.get("k").data_ptr())):
            moves[j] += ptr != last[j]  # a new buffer is allocated while the old one lives: another address
            last[j] = ptr
    bound = math.ceil(math.log2(1000 / GROW)) + 1  # 64 -> 128 -> ... -> 1024: 5 buffers
    assert moves[0] <= bound and moves[1] <= bound
    assert len(cache) == len(store) == 1000 and torch.equal(cache.k[0, :, 999], k[0, :, 0])


def test_decode_through_attention_reallocates_log_n_times():
    """A cached decode (RoPE: keys at absolute times; xPos: at the store's origin) appends one encoded key
    per step in place; the outputs equal the full forward."""
    n, pre = 200, 8
    q, k, v = (_rand(1, 2, n, 8, seed=s) for s in (4, 5, 6))
    for enc in (lp.rope(8), lp.xpos(8)):
        cache, outs, moves, last = KVCache(), [], 0, None
        outs.append(attention(q[:, :, :pre], k[:, :, :pre], v[:, :, :pre], enc, cache=cache))
        for i in range(pre, n):
            outs.append(attention(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], enc, cache=cache))
            ptr = cache.encoded.get("k").data_ptr()
            moves, last = moves + (ptr != last), ptr
        assert len(cache.encoded) == n
        assert moves <= math.ceil(math.log2(n / GROW)) + 2, enc.name  # a first buffer after prefill, then doubling
        assert torch.allclose(torch.cat(outs, 2), attention(q, k, v, enc), atol=1e-12, rtol=0)


def test_reencoding_at_a_new_origin_keeps_every_score():
    """Keys stored as A(o − s)·k meet a query encoded at t − o as A(t − s): the softmax weights over the
    keys, from the store at one origin and after :meth:`EncodedKeys.reencode` at another, equal the
    lag reference (float64)."""
    enc, n = lp.xpos(8, scale_base=32.0), 40
    q, k = _rand(1, 2, 1, 8, seed=7), _rand(1, 2, n, 8, seed=8)
    s = torch.arange(n, dtype=torch.float64)[None] + 1000.0  # (1, n)
    t = torch.tensor([[1000.0 + n + 5]])  # (1, 1): a query after every key
    ref = attention_reference(q, k, torch.eye(n, dtype=torch.float64).expand(1, 2, n, n), enc, t[0], s[0])
    store = EncodedKeys()
    for o in (1000.0 + n - 1, 1000.0 + n + 12):
        o_ = torch.tensor([o], dtype=torch.float64)
        store.reencode("xpos", o_, 60.0, k=enc.key(k, s - o))
        assert store.within(t) and store.origin is o_
        qe = enc.query(q, t - o)
        w = torch.softmax(qe @ store.get("k").transpose(-1, -2) / math.sqrt(8), -1)  # (1, 2, 1, n)
        assert (w - ref).abs().max() < 1e-13


def test_rows_refuse_other_shapes_and_widen_a_batch_of_one():
    r = Rows(2)
    r.write(0, torch.ones(1, 2, 3, 4))
    r.write(3, torch.full((3, 2, 1, 4), 2.0))  # a batch of one widens: the earlier rows broadcast
    assert r.view(4).shape == (3, 2, 4, 4) and torch.equal(r.view(4)[:, :, :3], torch.ones(3, 2, 3, 4))
    with pytest.raises(ValueError, match="do not extend"):
        r.write(4, torch.ones(3, 5, 1, 4))
    store = EncodedKeys()
    store.append(k=torch.ones(1, 1, 2, 3), v=torch.ones(1, 1, 2, 1))
    with pytest.raises(ValueError, match="holds the parts"):
        store.append(k=torch.ones(1, 1, 1, 3))
    with pytest.raises(ValueError, match="one number of positions"):
        store.append(k=torch.ones(1, 1, 1, 3), v=torch.ones(1, 1, 2, 1))


def test_fields_are_read_only_outside_the_cache():
    cache = KVCache()
    for name in ("k", "v", "times", "keep", "docs", "finite", "encoded"):
        with pytest.raises(AttributeError):
            setattr(cache, name, None)
    for name in ("version", "origin", "span"):
        with pytest.raises(AttributeError):
            setattr(cache.encoded, name, None)


def test_state_and_restore_undo_appends_and_reencodes():
    enc = lp.xpos(8)
    q, k, v = (_rand(1, 2, 12, 8, seed=s) for s in (9, 10, 11))
    cache = KVCache()
    attention(q[:, :, :6], k[:, :, :6], v[:, :, :6], enc, cache=cache)
    saved, keys, encoded = cache.state(), cache.k.clone(), cache.encoded.get("k").clone()
    attention(q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], enc, cache=cache)
    assert len(cache) == 12
    cache.restore(saved)
    assert len(cache) == 6 and torch.equal(cache.k, keys) and torch.equal(cache.encoded.get("k"), encoded)
    again = attention(q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], enc, cache=cache)
    assert torch.allclose(again, attention(q, k, v, enc)[:, :, 6:], atol=1e-12, rtol=0)


def test_gradients_through_a_cache_equal_the_full_forward():
    """Under autograd the cache concatenates instead of writing in place: no tensor an earlier step saved
    for its backward changes, and the gradients equal those of one call."""
    enc = lp.xpos(8)
    q, k, v = (_rand(1, 2, 70, 8, seed=s).requires_grad_() for s in (12, 13, 14))
    cache = KVCache()
    parts = [attention(q[:, :, :66], k[:, :, :66], v[:, :, :66], enc, cache=cache)]
    parts += [attention(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], enc, cache=cache) for i in range(66, 70)]
    g_steps = torch.autograd.grad(torch.cat(parts, 2).square().sum(), (q, k, v))
    g_full = torch.autograd.grad(attention(q, k, v, enc).square().sum(), (q, k, v))
    for a, b in zip(g_steps, g_full):
        assert torch.allclose(a, b, atol=1e-10, rtol=0)


# ------------------------------------------------------------------------------- no foreign private writes
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "remove", "add",
            "discard", "sort", "reverse", "__setitem__", "__delitem__", "copy_", "fill_", "zero_", "add_", "mul_",
            "masked_fill_", "index_copy_", "scatter_"}
# (module, attribute) pairs that write a private attribute of an object other than ``self``, each an
# annotation of another library's object, never a liepos class's state:
ALLOWED = {
    # torch's own marker protocol: a tensor dynamo must treat as a constant (torch reads the attribute)
    ("liepos._graph", "_dynamo_marked_constant"),
    # the patch of a Hugging Face model keeps what it replaced on HF's modules, under liepos' own prefix,
    # so that unpatching restores it
    ("liepos.interop.hf_model", "_liepos_positions"),
    ("liepos.interop.hf_model", "_liepos_block"),
    ("liepos.interop.hf_model", "_liepos_inner"),  # a rotary module inside an attention (DeepSeek-V4's compressors)
    ("liepos.interop.hf_model", "_liepos"),
    # a config's attention implementation, written per config as transformers' set_attn_implementation
    # writes it (without recursing into sub-configs), and written back by unpatch_model
    ("liepos.interop.hf_attention", "_attn_implementation_internal"),
    # beside HF's objects (not a liepos class): the per-forward times and each layer's encoded-key
    # store beside the cache, the implementation names found before patching on the model, under the
    # ``_liepos`` names the modules define; the layer numbers the family check gives an encoder's attention
    # modules, with what they had, under ``_liepos_numbered`` (taken back by unpatch_model and a refusal)
    ("liepos.interop.hf_verify", "__dict__"),
    ("liepos.interop.hf_model", "__dict__"),
    ("liepos.interop.hf_raw", "__dict__"),
    ("liepos.interop.hf_attention", "__dict__"),
    ("liepos.interop.hf_decode", "__dict__"),
    # a patched vision tower's attention modules carry their encoding under ``_liepos_vision`` and their
    # patched forward in the instance ``__dict__``, both taken back by unpatch_model
    ("liepos.interop.hf_vision", "_liepos_vision"),
    ("liepos.interop.hf_vision", "__dict__"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _written(node: ast.AST) -> list[ast.AST]:
    """The expressions ``node`` assigns to, deletes, augments or calls a mutating method on."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
        targets = [node.func.value]
    else:
        return []
    out: list[ast.AST] = []
    for t in targets:
        out += list(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
    return out


def _foreign_private_writes(module: str, tree: ast.AST) -> list[str]:
    bad = []
    for node in ast.walk(tree):
        hits: list[tuple[str, ast.AST]] = []
        for t in _written(node):
            while isinstance(t, (ast.Subscript, ast.Starred)):  # X._a[i] = …, X._a[i][j] += …
                t = t.value
            if isinstance(t, ast.Attribute):
                hits.append((t.attr, t.value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                hits.append((node.args[1].value, node.args[0]))
        for attr, owner in hits:
            if not (_private(attr) or attr == "__dict__"):
                continue
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if (module, attr) not in ALLOWED:
                bad.append(f"{module}:{node.lineno}: {ast.unparse(node)[:100]}")
    return bad


def test_no_module_writes_a_private_attribute_of_another_object():
    """No module assigns to (or augments, deletes, calls a mutating method on, ``setattr``s) a private
    attribute of an object other than ``self``: a KVCache's state changes through its methods only."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(p for p in rel.parts if p != "__init__")
        bad += _foreign_private_writes(module, ast.parse(path.read_text(encoding="utf-8")))
    assert not bad, "private attributes written from outside their object:\n" + "\n".join(bad)


def test_the_checker_sees_every_kind_of_write():
    src = """
cache._enc = {}
cache._enc["k"] = x
cache._n += 1
cache._enc, other = {}, 1
cache._enc.setdefault("k", x)
cache._enc["k"].copy_(x)
setattr(cache, "_origin", None)
c.__dict__.update(state)
del cache._enc
self._fine = 1
cache.public = 1
"""
    assert len(_foreign_private_writes("liepos.x", ast.parse(src))) == 9


def test_a_prefill_under_inference_mode_decodes_outside_it():
    enc = lp.rope(8)
    q, k, v = (_rand(1, 2, 10, 8, seed=s) for s in (15, 16, 17))
    cache = KVCache()
    with torch.inference_mode():
        pre = attention(q[:, :, :9], k[:, :, :9], v[:, :, :9], enc, cache=cache)
    with torch.no_grad():
        step = attention(q[:, :, 9:], k[:, :, 9:], v[:, :, 9:], enc, cache=cache)
    assert torch.allclose(torch.cat((pre, step), 2), attention(q, k, v, enc), atol=1e-12, rtol=0)


def test_held_and_part_give_what_is_there_and_refuse_what_is_not():
    cache = KVCache()
    with pytest.raises(ValueError, match="empty"):
        cache.held()
    with pytest.raises(ValueError, match="empty"):
        cache.last_times()
    k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 5)
    t = torch.tensor([[0.0, 1.0, 4.0]], dtype=torch.float64)
    cache.append(k, v, t, torch.ones(1, 3, dtype=torch.bool), None)
    hk, hv, ht, hkeep, hdocs = cache.held()
    assert torch.equal(hk, k) and torch.equal(hv, v) and torch.equal(ht, t) and bool(hkeep.all()) and hdocs is None
    assert cache.last_times().tolist() == [[4.0]]
    store = EncodedKeys()
    store.reencode("v", 0.0, math.inf, 0, k=k)
    assert torch.equal(store.part("k"), k)
    with pytest.raises(KeyError, match="'v'"):
        store.part("v")
