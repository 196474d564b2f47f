"""The build directory of the native kernels is private and verified: a directory of this user that nobody else
can write (created 0700, the cache and the build directory under it; a symlink, another owner or a group/world-
writable mode refused, with no fallback to a shared temporary directory), symlinks planted in it removed and
never followed, and the built library checked against its SHA-256 sidecar before it is loaded — a truncated,
foreign or symlinked library is rebuilt with one warning, never loaded (a truncated one would kill the
interpreter with SIGBUS). The build key covers the compiler (path and version) and torch; the library links no
OpenMP runtime of its own (its parallel loops run on torch's pool).

A process loads the ``liepos_native`` ops once; the cases that load a library from another directory (or could
crash the interpreter) run in a subprocess, so a crash fails the test, not pytest."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
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

pytestmark = pytest.mark.skipif(_kernels._missing() is not None, reason="no C++ compiler or ninja: nothing is built")

SRC = str(Path(__file__).resolve().parents[1] / "src")

# one process: a Jordan encoding through the native terms op, compared with the float64 reference
CHILD = r"""
import sys, warnings, torch, liepos as lp
from liepos import _kernels
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
    return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)


def _ran(r: subprocess.CompletedProcess) -> dict:
    """The child's report; fails (with its output) when it died, e.g. of SIGBUS (return code −7)."""
    assert r.returncode == 0, f"the interpreter died (return code {r.returncode}): {r.stderr[-2000:]}"
    words = r.stdout.split()
    return {"native": words[1] == "True", "err": float(words[3]), "warnings": int(words[5]), "stderr": r.stderr}


def _built() -> Path:
    """The library this process loaded (built once per build key)."""
    lib = _kernels.library()
    assert lib is not None, _kernels.status()
    return lib


def _copy_of_the_build(tmp_path: Path) -> Path:
    """A cache holding a copy of this process's build directory (times kept, so the copy is up to date and a
    child links at most): the library in it, at the path a child will load."""
    lib = _built()
    cache = tmp_path / "kernels"
    cache.mkdir(mode=0o700)
    shutil.copytree(lib.parent, cache / lib.parent.name, symlinks=True)
    return cache / lib.parent.name / lib.name


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache path (not yet created) and a kernel module that has built and said nothing yet."""
    for name in ("_said", "_failed", "_native", "_ran"):
        monkeypatch.setattr(_kernels, name, set() if name in ("_said", "_ran") else {})
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


def test_the_cache_and_the_build_directory_are_created_private(fresh):
    d = _kernels._build_dir(str(_kernels._compiler()))
    assert d.parent == fresh
    assert stat.S_IMODE(os.lstat(fresh).st_mode) == 0o700 and stat.S_IMODE(os.lstat(d).st_mode) == 0o700


def test_the_built_library_has_its_hash_and_a_private_directory():
    lib = _built()
    assert lib.with_suffix(".sha256").read_text() == hashlib.sha256(lib.read_bytes()).hexdigest()
    for d in (lib.parent, lib.parent.parent):
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def test_the_library_links_no_openmp_runtime_of_its_own():
    """Its parallel loops are torch's (at::parallel_for): the library needs no OpenMP runtime, and the process
    holds at most one, torch's."""
    lib = _built()
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", subprocess.run(
        [readelf, "-d", str(lib)], capture_output=True, text=True, check=True).stdout)
    assert needed and not [n for n in needed if re.search(r"gomp|libomp|iomp", n)], needed
    with open("/proc/self/maps", encoding="utf-8") as f:
        runtimes = {ln.split()[-1] for ln in f if re.search(r"/lib(gomp|omp|iomp5)[^/]*\.so", ln)}
    torch_lib = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib"))
    assert len(runtimes) <= 1 and all(os.path.realpath(p).startswith(torch_lib) for p in runtimes), runtimes


def test_the_ops_give_the_same_values_on_one_thread_and_on_several(monkeypatch):
    """The rows split over torch's threads (tiles of 7 positions, a ragged last one): the same bits as one thread."""
    monkeypatch.setattr(_kernels, "TILE", 7)
    monkeypatch.setattr(_kernels, "TILE_ABOVE_BYTES", 0)
    enc = lp.build("jordan", 64, rate=-1 / 8192)  # a small rate: 301 positions stay in float32's range
    x = torch.randn(3, 4, 301, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = enc.query(x, torch.arange(301))
        torch.set_num_threads(3)
        several = enc.query(x, torch.arange(301))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, several) and any("terms" in v for v in _kernels.status()["native"])


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
@pytest.mark.parametrize("level", ["cache", "build directory"])
def test_a_directory_others_can_write_into_is_refused(fresh, mode, level):
    target = fresh
    if level == "build directory":
        target = _kernels._build_dir(str(_kernels._compiler()))  # created private, then opened up
    else:
        fresh.mkdir(parents=True)
    os.chmod(target, mode)
    _refused("others can write into it")
    assert not list(target.iterdir())  # nothing built there


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
    assert not [n for n in new if n.startswith(("liepos", "torch_extensions"))], new


def test_the_compiler_and_torch_are_part_of_the_key(fresh, tmp_path, monkeypatch):
    """Another compiler (path or version) or another torch gets its own build directory instead of the first
    one's library."""
    real = str(_kernels._compiler())
    first = _kernels._build_dir(real)
    wrapper = tmp_path / "bin" / "c++"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    assert _kernels._compiler_id(str(wrapper)) != _kernels._compiler_id(real)
    assert _kernels._build_dir(str(wrapper)) != first
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    assert _kernels._build_dir(real) != first
    monkeypatch.setenv("CXX", str(wrapper))
    assert _kernels._compiler() == str(wrapper)  # the compiler cpp_extension builds with is the one in the key


@pytest.mark.slow  # two fresh interpreters, one links
def test_a_truncated_library_is_rebuilt_never_loaded_and_planted_links_are_not_followed(tmp_path):
    lib = _copy_of_the_build(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    for name in ("build.ninja", f"{lib.stem}.sha256.tmp"):  # names the build writes: links planted there
        (lib.parent / name).unlink(missing_ok=True)
        (lib.parent / name).symlink_to(victim)
    with open(lib, "r+b") as f:
        f.truncate(lib.stat().st_size // 3)  # what a full disk or a killed writer leaves (SIGBUS when mapped)
    first = _ran(_child(lib.parent.parent))
    assert first["native"] and first["err"] < 1e-12
    assert first["warnings"] == 1 and "rebuilt" in first["stderr"], first
    assert lib.with_suffix(".sha256").read_text() == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert victim.read_text() == "untouched" and not any(p.is_symlink() for p in lib.parent.iterdir())
    assert _ran(_child(lib.parent.parent))["warnings"] == 0  # rebuilt once: verified from then on


FOREIGN = "void run(void) {}\n"  # a library that registers no ops: loaded, the ops would not exist


def _foreign_library(path: Path) -> None:
    c = path.with_suffix(".c")
    c.write_text(FOREIGN)
    subprocess.run([str(_kernels._compiler()), "-shared", "-fPIC", "-x", "c", str(c), "-o", str(path)], check=True,
                   timeout=120)
    c.unlink()


@pytest.mark.slow  # a fresh interpreter each, which links
@pytest.mark.parametrize("how", ["replaced", "no_sidecar", "symlink"])
def test_a_foreign_library_is_never_loaded(tmp_path, how):
    """A library at the built name that liepos did not build: with the old sidecar (wrong hash), with none,
    or a symlink to a foreign library whose own hash is given — rebuilt, the right values, one warning."""
    lib = _copy_of_the_build(tmp_path)
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
    r = _ran(_child(lib.parent.parent))
    assert r["native"] and r["err"] < 1e-12 and r["warnings"] == 1, r
    assert not lib.is_symlink() and side.read_text() == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert foreign.exists() and lib.read_bytes() != foreign.read_bytes()


def test_a_stale_build_lock_is_removed_with_one_warning_a_live_one_kept(fresh):
    """cpp_extension waits forever for a lock a killed build left: one older than STALE_LOCK_S is removed."""
    d = _kernels._build_dir(str(_kernels._compiler()))
    lock = d / "lock"
    lock.write_text("")
    _kernels._clear_stale_lock(d)
    assert lock.exists()  # a build may be running: kept
    old = lock.stat().st_mtime - _kernels.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="removed the build lock"):
        _kernels._clear_stale_lock(d)
    assert not lock.exists()



@pytest.mark.skipif(_kernels._missing() is not None, reason="no C++ compiler or ninja: nothing is built")
def test_a_second_process_waits_for_the_build_lock(tmp_path):
    """Checking the library, building it and writing its sidecar are one step under the build directory's lock:
    while another process holds the lock a process asking for the ops waits (it neither sees a library without
    its sidecar as foreign nor races the sidecar's write), and once the lock is let go it loads the library."""
    lib = _kernels.library()  # built (or found) in this process's cache
    assert lib is not None
    script = "from liepos import _kernels\nprint(_kernels.library())\n"
    with _kernels._exclusive(lib.parent / "build.lock"):
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=8)  # blocked on the lock (the import and the check take about 2 s)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and out.strip() == str(lib), err
