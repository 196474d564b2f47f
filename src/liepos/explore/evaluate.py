"""Paired evaluation: every length scores the same held-out documents, so a change with length is a paired difference.

``evaluate`` draws ``docs`` held-out documents of the longest evaluation length ``L_max`` once (a
fixed generator, :data:`EVAL_SEED`, the same for every encoding and seed). At a length ``L`` each
document is cut into ``L_max / L`` windows of ``L`` tokens and every window is scored; a token is
counted when it is scored *with the same target at every length* (the LM: every token; a synthetic
task: its targets recomputed from each window's tokens, :meth:`~liepos.explore.tasks.Task.targets`,
kept where every window length agrees). So the loss at ``L`` and at the training length ``T`` are
means over the same tokens of the same documents, and ``loss(L) − loss(T)`` per document is a paired
difference: a model whose prediction ignores the context (a bigram) has a difference of exactly 0.

Per length: ``loss``/``acc`` over the counted tokens; ``doc_loss``/``doc_correct`` their sums per
document and ``doc_tokens`` the counts (for the bootstrap over documents,
:mod:`liepos.explore.stats`); ``by_position``: the loss by position in the window, bucketed
``[0, T)``, ``[T, 2T)``, ``[2T, 4T)`` …; ``loss_tail``/``acc_tail``: over the last quarter of each
window. A length whose forward pass overflows (growth at long lags) or is not finite is recorded
with ``diverged: true`` and NaN figures.

``evaluate_passkey``: the passkey task draws its own sequences per length (its distances reach the
length) and records the accuracy by distance, bucketed as above (``by_distance``).
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
import torch.nn.functional as Fn

from liepos.explore.model import Transform
from liepos.explore.tasks import IGNORE, PasskeyTask, Task

__all__ = ["EVAL_SEED", "bucket_labels", "buckets", "evaluate", "evaluate_passkey"]

EVAL_SEED = 1234  # held-out documents are the same for every encoding and training seed


def buckets(pos: torch.Tensor, train_len: int) -> torch.Tensor:
    """Bucket index of positions or distances: 0 for ``[0, T)``, ``k ≥ 1`` for ``[2^(k−1)·T, 2^k·T)``.

    >>> buckets(torch.tensor([0, 31, 32, 63, 64, 511]), 32).tolist()
    [0, 0, 1, 1, 2, 4]
    """
    ratio = pos.double() / train_len
    return torch.where(ratio < 1, 0, torch.floor(torch.log2(ratio.clamp_min(1))).long() + 1).long()


def bucket_labels(train_len: int, longest: int) -> list[str]:
    """``['0-32', '32-64', '64-128', …]`` up to the bucket holding ``longest − 1``."""
    n = int(buckets(torch.tensor([longest - 1]), train_len)) + 1
    edges = [0] + [train_len * 2 ** k for k in range(n)]
    return [f"{a}-{b}" for a, b in pairwise(edges)]


def _scores(model, x, y, L: int, device, transform, batch_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and correctness ``(n, L)`` of windows ``x`` with targets ``y`` (IGNORE: 0)."""
    per = max(1, batch_tokens // L)
    ce_all, ok_all = [], []
    for i in range(0, len(x), per):
        xb, yb = x[i : i + per].to(device), y[i : i + per].to(device)
        logits = model(xb, transform).float()  # (n, L, vocab)
        ce = Fn.cross_entropy(logits.flatten(0, 1), yb.flatten(), ignore_index=IGNORE,
                              reduction="none").view_as(yb)  # (n, L)
        ce_all.append(ce.double().cpu())
        ok_all.append(((logits.argmax(-1) == yb) & (yb != IGNORE)).cpu())
    return torch.cat(ce_all), torch.cat(ok_all)


def _nan_entry(labels: list[str], docs: int) -> dict:
    nan = float("nan")
    return {"loss": nan, "acc": nan, "loss_tail": nan, "acc_tail": nan, "diverged": True,
            "doc_loss": [nan] * docs, "doc_correct": [nan] * docs, "by_position": dict.fromkeys(labels, nan)}


@torch.no_grad()
def evaluate(
    model, task: Task, lengths, docs: int, train_len: int, device=None, batch_tokens: int = 16384,
    transform: Transform | None = None, reference: list | None = None,
) -> dict:
    """Loss and accuracy at every length on the same ``docs`` documents of ``max(lengths ∪ reference)`` tokens.

    ``reference``: lengths that decide which tokens count (with ``lengths``) but are not scored
    here (a scaling map evaluated past the training length counts the same tokens as the plain
    run). ``transform(enc, length)`` changes every encoding (a scaling map)."""
    if isinstance(task, PasskeyTask):
        raise TypeError("the passkey task draws sequences per length: use evaluate_passkey")
    lengths = sorted(set(lengths))
    every = sorted(set(lengths) | set(reference or []))
    longest = every[-1]
    indivisible = [L for L in every if longest % L]
    if indivisible:
        raise ValueError(f"every evaluation length must divide the longest, {longest}: {indivisible} do not")
    model.eval()
    device = device or next(model.parameters()).device
    x, y = task.sample(torch.Generator().manual_seed(EVAL_SEED), docs, longest, "eval")  # (docs, L_max)
    targets = {}
    for L in every:
        xw = x.reshape(-1, L)  # (docs · L_max / L, L) windows
        t = task.targets(xw)
        targets[L] = y if t is None else t.reshape(docs, longest)
    ref = targets[every[0]]
    common = torch.ones_like(ref, dtype=torch.bool)
    for t in targets.values():
        common &= (t != IGNORE) & (t == ref)  # (docs, L_max): scored alike at every length
    labels = bucket_labels(train_len, longest)
    out = {}
    for L in lengths:
        try:
            ce, ok = _scores(model, x.reshape(-1, L), targets[L].reshape(-1, L), L, device, transform, batch_tokens)
            ce, ok = ce.reshape(docs, longest), ok.reshape(docs, longest)  # (docs, L_max)
            bad = not bool(torch.isfinite(ce[common]).all())
        except OverflowError:  # lp refuses tables past float range (growth at long lags): a result
            bad = True
        if bad:
            out[str(L)] = _nan_entry(labels, docs) | {"doc_tokens": common.sum(1).tolist()}
            continue
        pos = torch.arange(longest).remainder(L).expand(docs, longest)  # position within the window
        scored = targets[L] != IGNORE
        tail = scored & (pos >= L - L // 4)
        b = buckets(pos, train_len)
        n = common.sum()
        out[str(L)] = {
            "loss": float(ce[common].sum() / n), "acc": float(ok[common].sum() / n),
            "loss_tail": float(ce[tail].sum() / tail.sum().clamp_min(1)),
            "acc_tail": float(ok[tail].sum() / tail.sum().clamp_min(1)),
            "diverged": False, "docs": docs, "tokens_scored": int(n),
            "doc_loss": (ce * common).sum(1).tolist(), "doc_correct": (ok & common).sum(1).double().tolist(),
            "doc_tokens": common.sum(1).tolist(),
            "by_position": {lab: (float(ce[common & (b == k)].mean()) if bool((common & (b == k)).any())
                                  else float("nan")) for k, lab in enumerate(labels)},
        }
    model.train()
    return out


@torch.no_grad()
def evaluate_passkey(
    model, task: PasskeyTask, lengths, eval_tokens: int, train_len: int, device=None, batch_tokens: int = 16384,
    transform: Transform | None = None,
) -> dict:
    """Per length: loss and accuracy at the queries, and ``by_distance`` ``{bucket: [correct, count]}``."""
    model.eval()
    device = device or next(model.parameters()).device
    out = {}
    for L in sorted(set(lengths)):
        n = max(2, eval_tokens // L)
        x, y, d = task.sample_with_distance(torch.Generator().manual_seed(EVAL_SEED + L), n, L)
        labels = bucket_labels(train_len, L)
        try:
            ce, ok = _scores(model, x, y, L, device, transform, batch_tokens)
            m = y != IGNORE
            bad = not bool(torch.isfinite(ce[m]).all())
        except OverflowError:
            bad = True
        if bad:
            nan = float("nan")
            out[str(L)] = {"loss": nan, "acc": nan, "loss_tail": nan, "acc_tail": nan, "diverged": True,
                           "by_distance": {}}
            continue
        b = buckets(d, train_len)
        far = m & (d >= train_len)
        out[str(L)] = {
            "loss": float(ce[m].mean()), "acc": float(ok[m].double().mean()),
            "loss_tail": float(ce[far].mean()) if bool(far.any()) else math.nan,
            "acc_tail": float(ok[far].double().mean()) if bool(far.any()) else math.nan,
            "diverged": False, "sequences": n, "tokens_scored": int(m.sum()),
            "by_distance": {lab: [int((ok & m & (b == k)).sum()), int((m & (b == k)).sum())]
                            for k, lab in enumerate(labels)},
        }
    model.train()
    return out
