"""Packed sequences in a patched model (liepos.interop.hf_packed): padding-free batches from
transformers' own ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``, with and without
``position_ids``, give bit for bit the logits of their documents run one by one, on the encoded-key
path (RoPE, the model's sdpa or eager backend) and on the raw-key path (xPos, ALiBi, an explicit
dynamic-NTK encoding), with and without a cache; upstream's sdpa backend ignores the boundaries."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import DataCollatorWithFlattening  # noqa: E402

from liepos.interop import patch_model  # noqa: E402
from test_hf_model import RAW, ids, tiny  # noqa: E402

pytestmark = pytest.mark.upstream
DOCS = [ids(batch=1, seq=n, seed=n)[0].tolist() for n in (20, 7, 33)]


def packed_batch(position_ids: bool) -> dict:
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=position_ids)(
        [{"input_ids": d} for d in DOCS])
    batch.pop("labels")
    return batch


def packed_and_separate(model, position_ids: bool, cache: bool):
    with torch.no_grad():
        packed = model(**packed_batch(position_ids), use_cache=cache).logits[0]
        separate = torch.cat([model(torch.tensor([d]), use_cache=cache).logits[0] for d in DOCS])
    return packed, separate


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("position_ids", [False, True])
@pytest.mark.parametrize("attn, name", [("sdpa", None), ("eager", None)] + [("sdpa", n) for n in RAW])
def test_packed_equals_separate_bit_for_bit(attn, name, position_ids, cache, one_thread, deterministic):
    """Upstream's backend (RoPE) or liepos' attention (the raw-key path, whatever the backend). Bit for
    bit needs one reduction order: one thread and torch's deterministic kernels (a matrix product of
    one document's rows split across threads otherwise sums them in another order than the packed row's)."""
    model = patch_model(tiny(attn=attn), None if name is None else RAW[name]())
    packed, separate = packed_and_separate(model, position_ids, cache)
    assert torch.equal(packed, separate)


def test_upstream_sdpa_ignores_the_boundaries():
    """The test above can fail: unpatched, the sdpa backend lets each document see the earlier ones
    (and even the first document, which has nothing before it, is equal only to rounding there)."""
    packed, separate = packed_and_separate(tiny(), position_ids=False, cache=False)
    n = len(DOCS[0])
    assert (packed[:n] - separate[:n]).abs().max() < 1e-5
    assert (packed[n:] - separate[n:]).abs().max() > 1e-2


def test_packed_training_step():
    """Padding-free training: the loss of the packed row is the token-weighted mean of the documents'
    losses and the gradients agree with theirs (to rounding: the sums over tokens run in another order)."""
    model = patch_model(tiny())
    model.train()
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=False)(
        [{"input_ids": d} for d in DOCS])
    loss = model(**batch).loss
    grads = torch.autograd.grad(loss, list(model.parameters()))
    n = sum(len(d) - 1 for d in DOCS)  # the collator's separator label drops each document's first target
    sep = sum(model(torch.tensor([d]), labels=torch.tensor([d])).loss * (len(d) - 1) for d in DOCS) / n
    want = torch.autograd.grad(sep, list(model.parameters()))
    assert (loss - sep).abs() < 1e-5
    for g, w in zip(grads, want):
        assert (g - w).abs().max() <= 1e-4 * (w.abs().max() + 1e-12)


def test_packed_errors():
    model = patch_model(tiny())
    batch = packed_batch(position_ids=False)
    N = batch["input_ids"].shape[1]
    with pytest.raises(ValueError, match="cu_seq_lens ends at"):
        model(**{**batch, "cu_seq_lens_q": torch.tensor([0, 5, N - 1]), "cu_seq_lens_k": torch.tensor([0, 5, N - 1])})
    with pytest.raises(NotImplementedError, match="differs from cu_seq_lens_k"):
        model(**{**batch, "cu_seq_lens_k": torch.tensor([0, 5, N])})
    with pytest.raises(ValueError, match="both cu_seq_lens_q and cu_seq_lens_k"):
        model(**{**batch, "cu_seq_lens_k": None})
    with pytest.raises(ValueError, match="increase strictly"):
        model(**{**batch, "cu_seq_lens_q": torch.tensor([0, 0, N]), "cu_seq_lens_k": torch.tensor([0, 0, N])})
    with pytest.raises(ValueError, match="one flattened row"):
        model(batch["input_ids"].expand(2, -1), cu_seq_lens_q=batch["cu_seq_lens_q"],
              cu_seq_lens_k=batch["cu_seq_lens_k"])
    dyn = patch_model(tiny(rope={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=16))
    with pytest.raises(NotImplementedError, match="length of the whole row"):
        dyn(**batch)
