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
* ``lm``: byte-level language model on a fixed list of the running interpreter's standard-library
  source files (recorded with a SHA-256), or on a user's text file.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["IGNORE", "Task", "LookupTask", "CopyTask", "RecallTask", "CountTask", "TextTask", "make_task", "TASKS", "STDLIB_FILES"]

IGNORE = -100


class Task:
    name: str = "task"
    vocab_size: int = 0

    def sample(self, gen: torch.Generator, batch: int, length: int, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "vocab_size": self.vocab_size}


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

    def describe(self):
        return {"name": self.name, "vocab_size": self.vocab_size, "window": self.window, "symbols": self.symbols}


# a fixed list of standard-library files, present from Python 3.9 to 3.13; missing ones are skipped
STDLIB_FILES = (
    "argparse.py", "ast.py", "bisect.py", "calendar.py", "collections/__init__.py", "configparser.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py", "fractions.py",
    "functools.py", "gettext.py", "heapq.py", "inspect.py", "json/decoder.py", "json/encoder.py",
    "logging/__init__.py", "os.py", "pprint.py", "random.py", "shutil.py", "statistics.py", "string.py",
    "subprocess.py", "tempfile.py", "textwrap.py", "threading.py", "tokenize.py", "typing.py", "uuid.py",
    "zipfile.py", "_pydecimal.py",
)


def _bytes(data: bytes) -> torch.Tensor:
    """The bytes as a long tensor (an empty one for no bytes, which ``torch.frombuffer`` refuses)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long() if data else torch.zeros(0, dtype=torch.long)


@dataclass
class TextTask(Task):
    """Byte-level LM. Every file is split 90/10 into train/eval, so both see every file's style."""

    path: str | None = None
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
            "name": self.name, "vocab_size": self.vocab_size, "source": self.path or "python-stdlib",
            "files": self.files, "sha256": self.sha256,
            "train_bytes": len(self._data["train"]), "eval_bytes": len(self._data["eval"]),
        }


TASKS = {"lm": TextTask, "lookup": LookupTask, "copy": CopyTask, "recall": RecallTask, "count": CountTask}


def make_task(name: str, text_file: str | None = None) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    if name == "lm":
        return TextTask(path=text_file)
    return TASKS[name]()
