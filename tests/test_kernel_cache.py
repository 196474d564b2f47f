"""The on-disk cache of the native kernels is private and verified: a directory of this user that nobody else
can write (created 0700; a symlink, another owner or a group/world-writable mode refused, with no fallback to
a shared temporary directory), sources and outputs created without following a symlink, and every library
checked against its SHA-256 sidecar before it is loaded — a truncated, foreign or symlinked library is
rebuilt with one warning, never loaded (a truncated one used to kill the interpreter with SIGBUS).

The cases that could crash the interpreter run in a subprocess, so a crash fails the test, not pytest."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

import liepos as lp
from liepos import _kernels

pytestmark = pytest.mark.skipif(_kernels._compiler() is None, reason="no C compiler: nothing is built or cached")

SRC = str(Path(__file__).resolve().parents[1] / "src")

# one process: a Jordan encoding through the native terms kernel, compared with the float64 reference
CHILD = r"""
import sys, warnings, torch, liepos as lp
from liepos import _kernels
_kernels.MIN_ELEMS = 0
warnings.simplefilter("always")
enc = lp.build("jordan", 16)
x = torch.randn(2, 4, 9, 16, dtype=torch.float64)
with warnings.catch_warnings(record=True) as seen:
    y = enc.query(x, torch.arange(9))
err = float((y - enc.query_reference(x, torch.arange(9))).abs().max())
print("native", bool(_kernels.status()["native"]), "err", err,
      "warnings", len([w for w in seen if "liepos" in str(w.message)]))
for w in seen:
    print("WARN", w.message, file=sys.stderr)
"""


def _child(cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1", **{_kernels.CACHE_ENV: str(cache)})
    return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=240)


def _ran(r: subprocess.CompletedProcess) -> dict:
    """The child's report; fails (with its output) when it died, e.g. of SIGBUS (return code −7)."""
    assert r.returncode == 0, f"the interpreter died (return code {r.returncode}): {r.stderr[-2000:]}"
    words = r.stdout.split()
    return {"native": words[1] == "True", "err": float(words[3]), "warnings": int(words[5]), "stderr": r.stderr}


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache path (not yet created) and a kernel module that has built and said nothing yet."""
    for name in ("_said", "_failed", "_native"):
        monkeypatch.setattr(_kernels, name, set() if name == "_said" else {})
    monkeypatch.setattr(_kernels, "MIN_ELEMS", 0)
    cache = tmp_path / "cache" / "kernels"
    monkeypatch.setenv(_kernels.CACHE_ENV, str(cache))
    return cache


def _jordan_call():
    enc = lp.build("jordan", 16)
    x = torch.randn(2, 4, 9, 16, dtype=torch.float64)
    y = enc.query(x, torch.arange(9))
    assert torch.allclose(y, enc.query_reference(x, torch.arange(9)), atol=1e-12)  # right, whichever path ran
    return y


def _refused(match: str) -> None:
    """One call warns once (matching ``match``) and runs the torch ops; a second call says nothing."""
    with pytest.warns(RuntimeWarning, match=match) as seen:
        _jordan_call()
    assert len([w for w in seen if "liepos" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _jordan_call()
    assert not _kernels.status()["native"] and _kernels.status()["failed"]


def test_the_cache_is_created_private_and_every_library_has_its_hash(fresh):
    _jordan_call()
    assert _kernels.status()["native"]
    assert stat.S_IMODE(os.lstat(fresh).st_mode) == 0o700
    (lib,) = fresh.glob("terms_*.so")
    side = lib.with_suffix(".sha256")
    assert side.read_text() == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert not list(fresh.glob("*.c")) and not list(fresh.glob("build_*"))  # no source or partial output left


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_cache_others_can_write_into_is_refused(fresh, mode):
    fresh.mkdir(parents=True)
    os.chmod(fresh, mode)
    _refused("others can write into it")
    assert not list(fresh.iterdir())  # nothing built there


def test_a_cache_of_another_owner_is_refused(fresh, monkeypatch):
    fresh.mkdir(parents=True, mode=0o700)
    me = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me + 1)  # as if the directory had been planted by another user
    _refused("owned by uid")
    assert not list(fresh.iterdir())


def test_a_symlink_in_place_of_the_cache_is_refused(fresh, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    fresh.parent.mkdir(parents=True)
    fresh.symlink_to(target)
    _refused("symbolic link")
    assert not list(target.iterdir())


def test_no_fallback_to_the_temporary_directory(fresh, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(_kernels.CACHE_ENV, str(blocker / "kernels"))  # cannot be created
    before = set(os.listdir(tempfile.gettempdir()))
    with pytest.warns(RuntimeWarning, match="using the torch ops"):
        _jordan_call()
    new = set(os.listdir(tempfile.gettempdir())) - before
    assert not [n for n in new if n.startswith("liepos")], new


def test_the_source_is_never_written_through_a_symlink(fresh, tmp_path, monkeypatch):
    """A planted symlink at the name the build would pick for its private work directory: that directory is
    created exclusively (mkdtemp), so another name is taken and nothing is written where the link points."""
    victim = tmp_path / "victim"
    victim.mkdir()
    fresh.mkdir(parents=True, mode=0o700)
    (fresh / "build_planted").symlink_to(victim)
    names = iter(["planted"])
    real = tempfile._get_candidate_names()

    class Names:
        def __iter__(self):
            return self

        def __next__(self):
            return next(names, None) or next(real)

    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: Names())
    _jordan_call()
    assert _kernels.status()["native"] and not list(victim.iterdir())
    assert (fresh / "build_planted").is_symlink()  # left alone, never followed


@pytest.mark.slow  # three fresh interpreters
def test_a_truncated_library_is_rebuilt_in_a_fresh_process_never_loaded(tmp_path):
    cache = tmp_path / "kernels"
    first = _ran(_child(cache))
    assert first["native"] and first["err"] < 1e-12 and first["warnings"] == 0
    (lib,) = cache.glob("terms_*.so")
    with open(lib, "r+b") as f:
        f.truncate(lib.stat().st_size // 3)  # what a full disk or a killed writer leaves (SIGBUS when mapped)
    second = _ran(_child(cache))
    assert second["native"] and second["err"] < 1e-12
    assert second["warnings"] == 1 and "rebuilt" in second["stderr"]
    assert lib.with_suffix(".sha256").read_text() == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert _ran(_child(cache))["warnings"] == 0  # rebuilt once: verified from then on


FOREIGN = "void run(void) {}\n"  # exports `run` and does nothing: loaded, it would leave y unwritten


def _foreign_library(path: Path) -> None:
    c = path.with_suffix(".c")
    c.write_text(FOREIGN)
    subprocess.run([_kernels._compiler(), "-shared", "-fPIC", str(c), "-o", str(path)], check=True, timeout=120)
    c.unlink()


@pytest.mark.slow  # two fresh interpreters each
@pytest.mark.parametrize("how", ["replaced", "no_sidecar", "symlink"])
def test_a_foreign_library_is_never_loaded(tmp_path, how):
    """A library at the cached name that liepos did not build: with the old sidecar (wrong hash), with none,
    or a symlink to a foreign library whose own hash is given — rebuilt, the right values, one warning."""
    cache = tmp_path / "kernels"
    assert _ran(_child(cache))["native"]
    (lib,) = cache.glob("terms_*.so")
    side = lib.with_suffix(".sha256")
    foreign = tmp_path / "foreign.so"
    _foreign_library(foreign)
    if how == "symlink":
        lib.unlink()
        lib.symlink_to(foreign)
        side.write_text(hashlib.sha256(foreign.read_bytes()).hexdigest())
    else:
        lib.write_bytes(foreign.read_bytes())
        if how == "no_sidecar":
            side.unlink()
    r = _ran(_child(cache))
    assert r["native"] and r["err"] < 1e-12 and r["warnings"] == 1, r
    assert not lib.is_symlink() and side.read_text() == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert foreign.exists() and FOREIGN.encode() not in lib.read_bytes()


def test_the_compiler_is_part_of_the_key(fresh, tmp_path, monkeypatch):
    """Another compiler (path or version) builds its own library instead of loading the first one's."""
    _jordan_call()
    first = set(fresh.glob("terms_*.so"))
    real = _kernels._compiler()
    wrapper = tmp_path / "bin" / "cc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    monkeypatch.setattr(_kernels, "_native", {})
    _jordan_call()
    assert len(set(fresh.glob("terms_*.so")) - first) == 1
    assert _kernels._compiler_id(str(wrapper)) != _kernels._compiler_id(real)
