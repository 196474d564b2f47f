"""One process = ``torchrun --nproc_per_node 2`` (gloo), for every catalogue encoding and a learned one.

The global batch is cut into the same micro-batches on one process as over two, so the gradients are
the same float32 sums in the same order: the losses, the weights and the evaluation agree bit for bit
(the contract is 1e-5; before the micro-batches jordan3 was 0.041 apart after 40 quick steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from liepos.explore.spec import decoder_entries
from liepos.explore.sweep import run_path

# every registry entry that runs on one position axis (the decoder's), a learned generator, and the schedule
# rows (windows across the heads of the one layer; Scalable-Softmax's s learned per head)
ENCODINGS = [*decoder_entries(), "learn", "schedule:rnope_swa:window=4", "schedule:ssmax"]
ARGS = ["--task", "lookup", "--steps", "12", "--batch-size", "8", "--d-model", "16", "--layers", "1",
        "--heads", "2", "--train-len", "16", "--eval-lens", "16,32", "--eval-tokens", "256", "--lr", "1e-2",
        "--warmup", "2", "--no-progress", "--save-model", "--threads", "1", "--encodings", ",".join(ENCODINGS)]


@pytest.mark.slow  # the everyday lane leaves it to CI (seconds to minutes on two cores)
def test_every_catalogue_encoding_trains_the_same_on_two_processes(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one = subprocess.run([sys.executable, "-m", "liepos.explore", *ARGS, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "liepos.explore", *ARGS, "--out", str(tmp_path / "two")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert {"rope", "alibi", "jordan", "growth", "decay", "xpos", "retnet", "nope"} <= set(ENCODINGS)
    for enc in ENCODINGS:
        p1, p2 = run_path(tmp_path / "one", enc, 0), run_path(tmp_path / "two", enc, 0)
        r1, r2 = json.loads(p1.read_text()), json.loads(p2.read_text())
        assert (r1["world_size"], r2["world_size"]) == (1, 2)
        assert r1["train_loss"] == r2["train_loss"], enc  # equal, not merely close
        assert r1["eval"] == r2["eval"], enc
        s1, s2 = torch.load(p1.with_suffix(".pt")), torch.load(p2.with_suffix(".pt"))
        assert s1.keys() == s2.keys()
        for name in s1:
            assert torch.equal(s1[name], s2[name]), (enc, name)
    learned = json.loads(run_path(tmp_path / "two", "learn", 0).read_text())["learned_generator"]
    assert sum(learned["counts"].values()) > 0
