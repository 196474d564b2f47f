"""One-pass elementwise kernels — compiled by Inductor, or native C++ ops — with the plain torch ops as their fallback.

The half layout rotates planes (k, k + P)::

    y₀ = c ⊙ x₀ − s ⊙ x₁        y₁ = s ⊙ x₀ + c ⊙ x₁        (x₀ = x[..., :P], x₁ = x[..., P:2P])

As torch ops that is four passes (two ``mul`` and two ``addcmul_``). Written as one expression,
``cat((x₀c − x₁s, x₀s + x₁c))``, ``torch.compile`` (Inductor) emits one loop over ``(…, P)`` with two
vector loads of x, two of the tables and two stores straight into the two halves of the output: one
read of x, one write of y — a vectorised C++ loop on the CPU, a Triton kernel on a GPU. Half-precision
x is upcast in registers and the low-precision output written directly (no float32 scratch pass); the
tables are float32 (or float64 for float64 inputs), as in the torch-op path, so the values are those of
the torch-op rotation (:func:`liepos._fast._rot`) up to the rounding of a fused multiply-add.

In place (``into`` is ``x``) the rotation is the native kernel below: one pass, both halves of a plane loaded and
both stored in one iteration. Inductor cannot write into the input it reads at another index without a full-size
temporary, so where the native kernel does not run (or ``into`` is a slice of a wider output) the compiled kernel
runs in L3-resident slabs of the leading axes (:data:`SLAB_BYTES`), a ``copy_`` putting each where it belongs.

Native kernels (CPU), ``torch.library`` ops of ``torch.ops.liepos_native`` from the C++ sources ``native_*.cpp`` (the
written tensor annotated ``Tensor(a!)``; the terms in ``native_terms*.cpp``): :func:`multiply` (``scale``/``planes``), a
run of real factors or interleaved rotation planes in one pass, clearing entries below a threshold in the same
pass; :func:`merge`, a flash tile's output merged into its rows' running output by log-sum-exp;
:func:`apply_terms` (``terms``/``terms_``), a Jordan-coupled transform as column-shifted terms
``y[d] = Σ_j [mask_j(d)] T_j[d] · x[d + o_j]`` (tables from :func:`liepos._fast._terms`; the offsets of blocks of
size 2 and 3, alone or beside rotation planes, and the widths 64 and 128 compiled as constants); the half-layout
rotation (``halves``/``halves_``, where the Inductor loop does not run it: CUDA, no C++ compiler);
:func:`clear_below` / :func:`absmax` / :func:`absrange`, which keep subnormal numbers out of the flash kernel's q
and k, and :func:`norms`, each one pass. Rows run on torch's own pool (``at::parallel_for``; no OpenMP runtime
of the library's own). ``torch.utils.cpp_extension`` builds them (a C++ compiler, ``$CXX`` else ``c++``, and ``ninja``)
once per source, torch, compiler and CPU at the first use (never at import; tens of seconds, under its file lock)
into a build directory of this user nobody else can write (:data:`CACHE_ENV`; 0700, the library checked against
its SHA-256 sidecar before it is loaded, a truncated or foreign file rebuilt with one warning); float32, float64,
bfloat16 and float16 are read and written directly (half precision in float32 registers, rounded as torch rounds).

The Inductor loop is compiled once per *variant* (kernel, dtypes, device, which axes have size 1) with dynamic
shapes, so a new sequence length, batch or head count never recompiles; lazily at first use, under a lock. Each
variant gets its own code object, hence its own dynamo cache and recompile limit.

The fallback (:func:`liepos._fast._rot`, the slab-wise torch ops) runs when ``LIEPOS_KERNELS=0`` (or
``false``/``off``/``no``; logged once at INFO); on a device neither CPU nor CUDA, or without
``torch._dynamo``/``torch._inductor``; when compiling a variant or building the native ops fails (no Triton, no
C++ compiler or ninja, an unwritable cache: warned once with the reason, never tried again; a kernel cache others
could write into, a symlink, another owner, group- or world-writable, is refused with one warning); for a small
input (under :data:`MIN_ELEMS` elements, where ~30 µs of a compiled call's guards cost more than the torch ops
on a decode step; the terms kernel, whose fallback is one ``addcmul_`` per coupling pair, runs at any size,
:data:`MIN_ELEMS_TERMS`) or a layout the kernel does not take. Either way the result is the same up to float
rounding (tests compare both against each other and the float64 dense reference).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import threading
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from liepos import _pages

__all__ = [
    "CACHE_ENV", "ENV", "MIN_ELEMS", "MIN_ELEMS_TERMS", "SLAB_BYTES", "absmax", "absrange", "apply_terms", "clear_below",
    "enabled", "flushed", "library", "merge", "multiply", "norms", "off", "rotate_halves", "status",
]

ENV = "LIEPOS_KERNELS"
# where the native ops are built (default: $XDG_CACHE_HOME/liepos/kernels or ~/.cache/…), one directory per build key
CACHE_ENV = "LIEPOS_KERNEL_CACHE"
# below this many elements of x the torch ops win: a compiled call costs ~30 µs of guards and wrappers (31 µs
# compiled against 16 µs eager for one (1, 1, 1, 128) row on the 2-core CPU)
MIN_ELEMS = 1 << 16
# the terms kernel runs at any size: its fallback is one addcmul_ per coupling pair (measured, one thread: a
# decode step of build("jordan", 64) on (1, 8, 1, 64) takes 139 µs with the kernel, 524 µs with the ops)
MIN_ELEMS_TERMS = 0
# slab of the in-place rotation (bytes of x), L3-resident: on the 2-core EPYC (2 MiB L2 per core, 32 MiB
# L3) at (1, 32, 4096, 128) float32 in place, one exploratory run gave 2.9 / 2.1 / 1.3 / 2.0× a warm copy
# for 1 / 2 / 4 / 8 MiB slabs, another (heavier load) 2.3 / 1.9 / 2.3 / 2.4×: the best is not sharp
SLAB_BYTES = 4 << 20
_DEVICES = ("cpu", "cuda")
_OFF = ("0", "false", "off", "no")

log = logging.getLogger("liepos")
_lock = threading.RLock()
_compiled: dict[tuple, Callable] = {}
_failed: dict[tuple, str] = {}
_said: set[str] = set()
_local = threading.local()


@contextlib.contextmanager
def off():
    """Within the block (this thread only) the torch ops run instead of the kernels: benchmarks and
    tests compare the two."""
    before = getattr(_local, "off", False)
    _local.off = True
    try:
        yield
    finally:
        _local.off = before


def _say_once(what: str, message: str, warn: bool) -> None:
    with _lock:
        if what in _said:
            return
        _said.add(what)
    if warn:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    else:
        log.info(message)


def enabled(device: torch.device, native: bool = False) -> bool:
    """Whether compiled kernels may run on ``device`` (:func:`off`, the environment variable, device, imports);
    ``native``: the C kernels (CPU only, no Inductor needed)."""
    if getattr(_local, "off", False):
        return False
    if os.environ.get(ENV, "1").strip().lower() in _OFF:
        _say_once("env", f"liepos: {ENV}={os.environ[ENV]!r}: compiled kernels off, using the torch ops", False)
        return False
    if native:
        if device.type != "cpu":
            _say_once(f"native:{device.type}", f"liepos: the native kernels are CPU-only: the torch ops on {device.type}",
                      False)
        return device.type == "cpu"
    if device.type not in _DEVICES:
        _say_once(f"device:{device.type}", f"liepos: no compiled kernels on {device.type}: using the torch ops", False)
        return False
    try:
        import torch._dynamo  # noqa: F401
        import torch._inductor  # noqa: F401
    except Exception as err:  # any import failure means: no Inductor here
        _say_once("import", f"liepos: torch._dynamo/_inductor unavailable ({err!r}): using the torch ops", True)
        return False
    return True


def status() -> dict:
    """The compiled variants (Inductor's, the native ones) and the failed ones (with their reasons), for
    reports and tests."""
    with _lock:
        return {"compiled": sorted(map(repr, _compiled)), "native": sorted(_ran),
                "failed": dict(_failed)}


# ---------------------------------------------------------------------- the kernels (traced by dynamo)
def _halves_expr(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``cat((c x₀ − s x₁, s x₀ + c x₁))`` computed in the tables' dtype, returned in x's dtype."""
    P = c.shape[-1]
    x0, x1 = x[..., :P].to(c.dtype), x[..., P : 2 * P].to(c.dtype)
    return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), -1).to(x.dtype)


def _variant(x: torch.Tensor, c: torch.Tensor) -> tuple:
    # size-1 axes are specialised by dynamo (0/1 specialisation): one variant per pattern, no recompiles
    return ("halves", x.device.type, x.dtype, c.dtype, tuple(n == 1 for n in x.shape), tuple(n == 1 for n in c.shape))


def _compile(key: tuple) -> Callable | None:
    """The compiled kernel of ``key`` (compiled at its first call, under the lock), or None if it failed."""
    with _lock:
        if key in _failed:
            return None
        fn = _compiled.get(key)
        if fn is not None:
            return fn
        # a fresh code object per variant: its own dynamo cache entries and recompile limit
        code = _halves_expr.__code__.replace(co_name=f"_halves_{len(_compiled)}")
        fresh = types.FunctionType(code, _halves_expr.__globals__, code.co_name)
        fn = torch.compile(fresh, dynamic=True, fullgraph=True)
        _compiled[key] = fn
        return fn


def _call(fn: Callable, key: tuple, x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor | None:
    try:
        with torch.no_grad():
            return fn(x, c, s)
    except Exception as err:  # a compiler that is missing or fails: the torch ops give the same values
        with _lock:
            _failed[key] = repr(err)[:500]
            _compiled.pop(key, None)
        _say_once(f"fail:{key}", f"liepos: compiling the half-layout rotation {key} failed, using the torch ops: "
                  f"{repr(err)[:300]}", True)
        return None


def _slab_ranges(x: torch.Tensor) -> list[tuple[int, int, int, int, int, int]]:
    """Slabs ``(b, b+1, i0, i1, j0, j1)`` of a contiguous 4-D x: whole items of axis 1 when one fits in
    :data:`SLAB_BYTES`, else ranges of axis 2 within one item."""
    B, A1, A2, D = x.shape
    item = A2 * D * x.element_size()
    out = []
    if item <= SLAB_BYTES:
        step = max(1, SLAB_BYTES // max(1, item))
        for b in range(B):
            out += [(b, b + 1, i, min(A1, i + step), 0, A2) for i in range(0, A1, step)]
        return out
    step = max(1, SLAB_BYTES // max(1, D * x.element_size()))
    for b in range(B):
        for i in range(A1):
            out += [(b, b + 1, i, i + 1, j, min(A2, j + step)) for j in range(0, A2, step)]
    return out


def _part(t: torch.Tensor, b0: int, b1: int, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
    """The slab of a 4-D tensor broadcast against x (a size-1 axis stays whole)."""
    t = t if t.shape[0] == 1 else t[b0:b1]
    t = t if t.shape[1] == 1 else t[:, i0:i1]
    return t if t.shape[2] == 1 else t[:, :, j0:j1]


def _contiguous_view(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor):
    """``(x, c, s, swapped)`` with x contiguous: as given, or BSHD (heads and positions swapped)."""
    if x.is_contiguous():
        return x, c, s, False
    xt = x.transpose(1, 2)
    if xt.is_contiguous():
        return xt, c.transpose(1, 2), s.transpose(1, 2), True
    return None


def rotate_halves(
    x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, into: torch.Tensor | None = None
) -> torch.Tensor | None:
    """The half-layout rotation of the 4-D ``x`` (width 2P) by the 4-D tables ``c``, ``s`` (…, P).

    ``into=None``: a fresh output in x's memory order; ``into`` (x itself, or a view of a wider output
    of x's shape): written there. Returns the result, or ``None`` when the compiled kernel does not
    apply (see the module docstring) and the caller must use the torch ops.
    """
    # one native pass (a fresh output in tiles of positions, :func:`_tile`), in place, into a view or fresh: at (1, 32,
    # 4096, 128) 1.03-1.04x a clone against the Inductor loop's 1.08-1.14x on two threads, 1.09x / 1.17-1.20x on one
    y = _pages.huge(torch.empty_like(x)) if into is None and _native_ok(x, None, c, s) else into
    if y is not None and _rotate_halves_native(x, c, s, y, into is None) is not None:
        return y
    if x.numel() < MIN_ELEMS or not enabled(x.device):
        return None
    view = _contiguous_view(x, c, s)
    if view is None or (into is not None and into.dtype != x.dtype):
        return None
    xv, cv, sv, swapped = view
    cv, sv = cv.contiguous(), sv.contiguous()
    key = _variant(xv, cv)
    fn = _compile(key)
    if fn is None:
        return None
    if into is None:
        y = _call(fn, key, xv, cv, sv)
        return None if y is None else (y.transpose(1, 2) if swapped else y)
    ov = into.transpose(1, 2) if swapped else into
    for b0, b1, i0, i1, j0, j1 in _slab_ranges(xv):
        part = _call(fn, key, xv[b0:b1, i0:i1, j0:j1], *(_part(t, b0, b1, i0, i1, j0, j1) for t in (cv, sv)))
        if part is None:
            if b0 or i0 or j0:  # a later slab cannot fail after the first compiled: same variant
                raise RuntimeError("liepos: the compiled rotation failed part-way; this is a bug")
            return None
        ov[b0:b1, i0:i1, j0:j1].copy_(part)
    return into


# ---------------------------------------------------------------------- native kernels (C++, torch.library ops)
# loops Inductor does not write well: column-shifted terms (it masks every vector, ~2× the loads of a row), the half-layout
# rotation in place (a full-size temporary); the terms in two sources by dtype, built side by side (AVX2 EPYC: 52 s, not 73)
SOURCES = tuple(Path(__file__).with_name(n) for n in ("native_terms_half.cpp", "native_terms.cpp", "native_kernels.cpp",
                                                      "native_flash.cpp"))
HEADERS = tuple(Path(__file__).with_name(n) for n in ("native_common.h", "native_terms.h"))  # in the build key
_NAME = "liepos_native"
# -fopenmp is a compile flag only: at::parallel_for's OpenMP backend is inline in torch's headers and needs
# _OPENMP; the library links no runtime (its GOMP symbols bind to the one torch loaded). Tried in this order;
# 256-bit vectors measured ~10% faster than 512-bit for the terms kernel on a 2-core EPYC
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686")
_FLAGS = ((("-O3", "-march=native", "-mprefer-vector-width=256") if _X86 else ("-O3", "-mcpu=native")) + ("-fopenmp",),
          ("-O3",))
STALE_LOCK_S = 1800  # a build lock older than this was left by a killed build
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_MAX_WIDTH = 4096  # the kernels keep a row on the stack
# a fresh output is written in tiles of TILE positions (all heads of a tile in turn) when x is larger than
# TILE_ABOVE_BYTES: at every size (a Xeon with AMX, the half-layout rotation of an L3-resident (1, 8, 4096, 64): 0.98 ms
# in tiles, 1.73 ms head after head, a clone 0.59; the re-centred tiles gained 2-5 %); in place head after head
TILE, TILE_ABOVE_BYTES = 32, 0
# a fresh float32 half-layout output of this many bytes or more, into pages already mapped, is streamed (the kernel's
# non-temporal stores): it leaves the cache before it is read; fresh pages are zeroed into the cache by their first
# touch, where writing through wins (figures in the performance guide)
STREAM_ABOVE_BYTES = 8 << 20
_native: dict[str, Path] = {}  # "library": the loaded library, once per process
_ran: set[str] = set()  # the native ops called in this process, with x's dtype ("terms float32")
_fakes: set[str] = set()  # the ops whose fake implementation is registered
_masks: dict[tuple, torch.Tensor] = {}  # the structural masks of a terms variant as a uint8 (J, D) tensor


def _cache_dir() -> Path:
    """The directory of the built native library: ``$LIEPOS_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/liepos/kernels``
    (``~/.cache/…``), created with mode 0700 and checked before every use (:func:`_check_private`). There is no
    fallback to a shared temporary directory: where it cannot be made private, the native kernels are not built
    (one warning) and the torch ops run."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "liepos", "kernels")
    return _private_dir(Path(base))


def _private_dir(d: Path) -> Path:
    if not os.path.lexists(d):
        d.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another process may create it first: checked below
            os.mkdir(d, 0o700)
    _check_private(d)
    return d


class UnsafeCacheError(OSError):
    """The kernel cache is a directory another user could write into (or not a directory of this user)."""


def _check_private(d: Path) -> None:
    """Refuse (:class:`UnsafeCacheError`) a cache directory another user could write into: it must be a real directory (not a
    symlink), owned by this user, writable by neither group nor others."""
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheError(f"the kernel cache {str(d)!r} is a symbolic link: refused (set {CACHE_ENV} to a private directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(f"the kernel cache {str(d)!r} is not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeCacheError(f"the kernel cache {str(d)!r} is owned by uid {st.st_uid}, not by this user ({os.getuid()}): "
                      f"refused")
    if st.st_mode & 0o022:
        raise UnsafeCacheError(f"the kernel cache {str(d)!r} has mode {stat.S_IMODE(st.st_mode):o}: others can write into it; "
                      f"refused (chmod 700 it, or set {CACHE_ENV} to a private directory)")


def _machine() -> str:
    """What -march=native depends on: the CPU's flags (or the machine name), for the build key."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return next((ln for ln in f if ln.startswith(("flags", "Features"))), platform.machine())
    except OSError:
        return platform.machine() + platform.processor()


def _compiler() -> str | None:
    """The C++ compiler torch.utils.cpp_extension builds with (``$CXX``, else ``c++``) as a path, or None."""
    from torch.utils import cpp_extension

    return shutil.which(cpp_extension.get_cxx_compiler())


@functools.lru_cache(maxsize=8)
def _compiler_id(cc: str) -> str:
    """The compiler as the build key knows it: its resolved path and the first line of ``--version``."""
    try:
        r = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        version = (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else ""
    except (OSError, subprocess.SubprocessError) as err:
        version = f"unknown ({err!r})"
    return f"{os.path.realpath(cc)}\0{version}"


def _missing() -> str | None:
    """What the build needs and this machine lacks (a C++ compiler, ninja), in words; None when nothing."""
    from torch.utils import cpp_extension

    lacks = []
    if _compiler() is None:
        lacks.append(f"no C++ compiler ({cpp_extension.get_cxx_compiler()!r} is not a program; set CXX)")
    if not cpp_extension.is_ninja_available():
        lacks.append("no ninja (pip install ninja)")
    return "; ".join(lacks) or None


def _build_dir(cc: str) -> Path:
    """The private build directory of these sources, torch, compiler (path and version), CPU and flag sets."""
    key = "\0".join((*(hashlib.sha256(f.read_bytes()).hexdigest() for f in SOURCES + HEADERS), torch.__version__,
                     repr(_FLAGS), _machine(), _compiler_id(cc), str(torch._C._GLIBCXX_USE_CXX11_ABI)))
    return _private_dir(_cache_dir() / hashlib.sha256(key.encode()).hexdigest()[:20])


def _sha256(path: Path) -> str:
    with open(path, "rb", opener=_nofollow) as f:
        return hashlib.sha256(f.read()).hexdigest()


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


def _verified(lib: Path) -> bool | None:
    """Whether the built ``lib`` may be loaded: None when there is none; True when it is a regular file of this
    user whose bytes hash to its sidecar (``lib.sha256``, written after the build); False for anything else (a
    symlink, a truncated or foreign file, no sidecar): it is then removed and rebuilt."""
    if not os.path.lexists(lib):
        return None
    side = lib.with_suffix(".sha256")
    try:
        st = os.lstat(lib)
        if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()) or os.path.islink(side):
            return False
        with open(side, encoding="ascii", opener=_nofollow) as f:
            return f.read().strip() == _sha256(lib)
    except (OSError, UnicodeDecodeError):
        return False


def _build() -> Path:
    """Build (at most once per build key; cpp_extension's own file lock serialises concurrent processes) and
    load the native ops; raises with the reason when they cannot be built. A library in the build directory
    that is not the one liepos built (truncated, foreign, a symlink) is removed and rebuilt with one warning,
    never loaded; symlinks planted in the directory are removed, never followed."""
    from torch.utils import cpp_extension

    lacks = _missing()
    if lacks:
        raise RuntimeError(lacks)
    d = _build_dir(str(_compiler()))
    with _exclusive(d / "build.lock"):  # check, build and sidecar as one step: a second process waits, then finds it
        return _build_locked(d, cpp_extension)


@contextlib.contextmanager
def _exclusive(path: Path):
    """An exclusive lock on ``path`` (created 0600 in the private build directory) held by this process while the
    block runs: concurrent processes (pytest-xdist's workers, a user's data loaders) build, verify and write the
    sidecar one at a time. The operating system drops it when the process dies: it never goes stale. Without
    ``fcntl`` (not POSIX) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - the native kernels are built on POSIX systems
        yield
        return
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _build_locked(d: Path, cpp_extension: Any) -> Path:
    """:func:`_build`'s work in the build directory ``d``, under its lock."""
    errors = []
    for i, flags in enumerate(_FLAGS):
        lib = d / (f"{_NAME}.so" if i == 0 else f"{_NAME}_v{i}.so")
        for entry in os.scandir(d):
            if entry.is_symlink() and entry.path != str(lib):
                os.unlink(entry.path)  # the directory is private: a link is never followed
        _clear_stale_lock(d)
        if _verified(lib) is False:
            _say_once(f"rebuilt:{lib}", f"liepos: the built kernel library {str(lib)!r} is not the library liepos built "
                      f"(a truncated, foreign or unverifiable file): rebuilt", True)
            os.unlink(lib)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # cpp_extension's notes on compiler versions: the build decides
                path = cpp_extension.load(_NAME, [str(f) for f in SOURCES], extra_cflags=list(flags),
                                          build_directory=str(d), is_python_module=False, verbose=False)
        except Exception as err:  # a compiler error: the next flag set, then the torch ops
            errors.append(f"{' '.join(flags)}: {str(err).strip()[-300:]}")
            continue
        lib = Path(path)
        side = d / f"{_NAME}.sha256.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(side)
        with open(side, "x", encoding="ascii", opener=_nofollow) as f:
            f.write(_sha256(lib))
        os.replace(side, lib.with_suffix(".sha256"))
        return lib
    raise RuntimeError("building the native kernels failed: " + " | ".join(errors))


def _clear_stale_lock(d: Path) -> None:
    """cpp_extension's lock file left by a build that was killed (a live build holds it for well under
    :data:`STALE_LOCK_S`) makes every later process wait for it forever: removed, with one warning."""
    lock = d / "lock"
    with contextlib.suppress(FileNotFoundError):
        age = time.time() - os.lstat(lock).st_mtime
        if age > STALE_LOCK_S:
            _say_once(f"lock:{d}", f"liepos: removed the build lock {str(lock)!r}, {age:.0f} s old (a build was killed)",
                      True)
            os.unlink(lock)


def _ops() -> Any:
    """The ``liepos_native`` ops (built and loaded at their first use, under the lock), or None when they cannot
    be built (warned once with the reason, never tried again)."""
    if "library" in _native:
        return torch.ops.liepos_native
    with _lock:
        if "library" in _native or ("native",) in _failed:
            return torch.ops.liepos_native if "library" in _native else None
        try:
            lib = _build()
            _register_fakes()
            _native["library"] = lib
        except Exception as err:  # no compiler or ninja, a compiler error, an unsafe or unwritable cache
            _failed[("native",)] = repr(err)[:500]
            if isinstance(err, UnsafeCacheError):
                _say_once("cache", f"liepos: no native kernels, using the torch ops: {err}", True)
            else:
                _say_once("native", f"liepos: the native kernels cannot be built, using the torch ops: {str(err)[:400]}",
                          True)
            return None
        return torch.ops.liepos_native


def library() -> Path | None:
    """The path of the loaded native library (None when it is not built or cannot be)."""
    _ops()
    return _native.get("library")


def _native_ok(x: torch.Tensor, into: torch.Tensor | None, *tables: torch.Tensor, least: int | None = None) -> bool:
    """The native kernels take 4-D x (last stride 1, at least ``least`` elements, default :data:`MIN_ELEMS`) of
    a supported dtype, tables of the work dtype."""
    least = MIN_ELEMS if least is None else least
    if x.numel() < least or x.dim() != 4 or x.dtype not in _DTYPES or not enabled(x.device, native=True):
        return False
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    if any(t.dtype != work or t.stride(-1) != 1 or t.device != x.device for t in tables):
        return False
    if x.shape[-1] > _MAX_WIDTH or x.stride(-1) != 1:
        return False
    return into is None or (into.dtype == x.dtype and into.shape == x.shape and into.stride(-1) == 1)


def _mask_tensor(masks: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    m = _masks.get(masks)
    if m is None:
        m = _masks.setdefault(masks, torch.tensor(masks, dtype=torch.uint8))  # (J, D)
    return m


def apply_terms(
    x: torch.Tensor, T: torch.Tensor, offsets: tuple[int, ...], masks: tuple[tuple[int, ...], ...],
    into: torch.Tensor | None = None, clear: float = 0.0,
) -> torch.Tensor | None:
    """``y[…, d] = Σ_j [masks[j][d]] T[…, j, d] · x[…, d + offsets[j]]`` in one pass (the native terms op).

    ``x``: (B, H, S, D) with any strides but the last; ``T``: (B|1, H|1, S, J, D), the tables in the work
    dtype, **zero where** ``masks[j][d]`` **is 0** (as :func:`liepos._fast._terms` builds them: a row of
    finite x adds every term); ``masks[j][d]``: whether term j exists at column d (in a row holding an inf or
    a NaN a structural zero is skipped, so a non-finite neighbour never leaks into a column); ``into``: x
    itself, a view of a wider output, or None (a fresh output in x's memory order). ``clear`` (out of place):
    in the same pass every output below it in magnitude in x's dtype is +0, as :func:`clear_below` writes it.
    None when the kernel does not run (small input, kernels off, no compiler, another device): use the torch ops.
    """
    if T.dim() != 5 or not _native_ok(x, into, T, least=MIN_ELEMS_TERMS):
        return None
    if clear and into is not None and into.data_ptr() == x.data_ptr():
        raise ValueError(f"terms: clear={clear!r} needs an output of its own (the in-place op clears nothing)")
    (B, H, S, D), J = x.shape, len(offsets)
    if T.shape[-2:] != (J, D) or len(masks) != J or any(len(m) != D for m in masks):
        raise ValueError(f"terms: tables {tuple(T.shape)} do not match {J} offsets and width {D}")
    if (ops := _ops()) is None:
        return None
    y = _pages.huge(torch.empty_like(x)) if into is None else into
    T = T.expand(B, H, S, J, D)  # (B|1, H|1, S, J, D) -> (B, H, S, J, D), stride 0 where broadcast
    # a fresh output in tiles of positions, whose page faults evict the tables between heads (at (1, 32, 4096, 128):
    # 1.2x a clone in tiles of 32, 1.6x head after head); in place head after head (1.1x against 2.1x a warm copy)
    tile, m = _tile(x, y, S), _mask_tensor(masks)
    _ran.add(f"terms {x.dtype}" + (" cleared" if clear else ""))
    if y.data_ptr() == x.data_ptr():
        ops.terms_(x, T, list(offsets), m, tile)
    else:
        ops.terms(x, T, list(offsets), m, tile, y, clear)
    return y


def multiply(x: torch.Tensor, t: torch.Tensor, into: torch.Tensor, conj: bool = False,
             clear: float = 0.0) -> torch.Tensor | None:
    """``into = t · x`` in one pass (the native scale op), or for a complex ``t`` the interleaved rotation
    planes ``into[2i] + i·into[2i+1] = t[i] · (x[2i] + i·x[2i+1])`` (the native planes op; ``conj``: by
    ``conj(t[i])``), half precision computed in float32 in registers. ``clear``: in the same pass, every
    output whose value in x's dtype is below it in magnitude is written as +0, as :func:`clear_below` of the
    result would write it (NaN kept).

    ``x``: (B, H, S, W) with unit-stride rows; ``t``: a table broadcastable to ``(B, H, S, W)`` (real, of the
    work dtype) or to ``(B, H, S, W / 2)`` (complex, of the work dtype's complex type), its last axis
    contiguous; ``into``: x itself or a tensor of x's shape and dtype not overlapping it. Returns None when
    the kernel does not run (small input, kernels off, no compiler, another device, a table of another
    dtype) and the caller must use the torch ops."""
    pairs = t.is_complex()
    if pairs and t.is_conj():  # a lazy conjugate: its own values, the conjugation done here
        t, conj = t.conj(), not conj
    tr = torch.view_as_real(t).flatten(-2) if pairs and t.stride(-1) == 1 else t  # (…, S, W/2) -> (…, S, W)
    while tr.dim() < 4:
        tr = tr.unsqueeze(0)
    if tr.is_complex() or not _native_ok(x, into, tr) or (pairs and x.shape[-1] % 2):
        return None
    same = into.data_ptr() == x.data_ptr()
    if (same and into.stride() != x.stride()) or (not same and _overlap(x, into)):
        return None  # in place only as x itself: a view of x in another order would be read after it is written
    try:
        tr = tr.expand(x.shape)  # (B|1, H|1, S, W) -> (B, H, S, W), stride 0 where broadcast
    except RuntimeError:
        return None
    if (ops := _ops()) is None:
        return None
    name = "planes" if pairs else "scale"
    _ran.add(f"{name} {x.dtype}")
    if pairs:
        ops.planes(x, tr, conj, _tile(x, into, x.shape[2]), into, clear)
    else:
        ops.scale(x, tr, _tile(x, into, x.shape[2]), into, clear)
    return into


def merge(O: torch.Tensor, L: torch.Tensor, o: torch.Tensor, Li: torch.Tensor, first: bool) -> bool:
    """One tile's output ``o`` and log-sum-exp ``Li`` merged into the running ``(O, L)`` of its rows in one
    pass (the native merge op): ``L' = log(e^L + e^{Li})``, ``O' = O + e^{Li − L'} (o − O)`` per row (a row
    with ``Li = −inf`` unchanged); ``first``: ``O = o``, ``L = Li``. ``O``, ``o``: (N0, N1, N2, N3, D) views
    with unit-stride rows; ``L``, ``Li``: (N0, N1, N2, N3); ``O``, ``L``, ``Li`` float32 (or float64), ``o``
    of that type or half precision. Returns False when the op does not run (small input, kernels off, no
    compiler, another device or layout) and the caller must use the torch ops."""
    if not (O.dim() == 5 and o.shape == O.shape and L.dim() == 4 and Li.shape == L.shape == O.shape[:4]
            and O.numel() >= MIN_ELEMS and O.stride(-1) == 1 and o.stride(-1) == 1 and O.dtype == L.dtype == Li.dtype
            and O.dtype in (torch.float32, torch.float64) and o.dtype in _DTYPES
            and (o.dtype == O.dtype or O.dtype == torch.float32)
            and enabled(O.device, native=True) and o.device == O.device):
        return False
    if _overlap(O, o) or _overlap(L, Li) or _overlap(O, L):
        return False
    if (ops := _ops()) is None:
        return False
    _ran.add(f"merge {o.dtype}")
    ops.merge(O, L, o, Li, first)
    return True


@contextlib.contextmanager
def flushed(device: torch.device):
    """Subnormal numbers flushed to zero (FTZ and DAZ) on the calling thread and every thread of torch's intra-op
    pool while the block runs, each thread's own setting put back after (the native denormals ops; x86 CPUs).

    For liepos's own flash calls only: their probabilities ``e^{s − L}`` of far or steeply biased keys fall
    into the subnormal range (below 2^-126 of the row), where an x86 core takes a microcode assist per
    operation (ALiBi's forward + backward: 3× SDPA's with them, 1.3× flushed); flushed, such a probability
    becomes 0, which moves no output or gradient by more than 2^-126 of its scale. Nothing is changed for
    the caller's code: the previous bits are restored on every thread, an exception included. Does nothing
    where the native ops do not run (another device, kernels off, no compiler). Only kernels may run inside:
    Python code would too (denormals-are-zero makes ``hash()`` of a subnormal float 0, so a dict key holding one
    is not found again)."""
    ops = _ops() if device.type == "cpu" and enabled(device, native=True) else None
    prev = None if ops is None else ops.denormals(True)
    try:
        yield
    finally:
        if ops is not None and prev is not None:
            ops.restore_denormals(prev)


def _rows_ok(x: torch.Tensor) -> bool:
    """clear and absmax take 4-D x of a supported dtype, at least :data:`MIN_ELEMS` elements, unit-stride rows."""
    return (x.dim() == 4 and x.numel() >= MIN_ELEMS and x.dtype in _DTYPES and (x.stride(-1) == 1 or x.shape[-1] == 1)
            and enabled(x.device, native=True))


def _dense(x: torch.Tensor) -> bool:
    """Whether ``x``'s elements are distinct places of memory laid out without gaps in some order of its axes (a
    permutation of a contiguous tensor): an in-place pass over its rows writes every element once."""
    strides, shape = x.stride(), x.shape
    order = sorted(range(x.dim()), key=lambda i: (-strides[i], -shape[i]))
    return x.permute(order).is_contiguous()


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[first, last)`` a non-empty tensor's elements span in memory."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two non-empty tensors' spans of memory intersect."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def clear_below(x: torch.Tensor, tau: float, into: torch.Tensor | None = None) -> torch.Tensor | None:
    """A fresh contiguous copy of 4-D ``x`` (unit-stride rows, any other strides) with every entry of magnitude
    below ``tau`` set to +0 (every other entry, NaN included, keeps its bits): ``x.masked_fill(x.abs() < tau,
    0)`` in one pass (the native clear op), the comparison in float32 for float32 and half-precision x
    (float64 for float64); ``into``: a contiguous tensor of x's shape and dtype to write it into (not
    overlapping x), or x itself (cleared in place: its elements distinct, any order of its axes). Returns
    None when the op does not run (small input, rows not of unit stride, kernels off, no compiler, another
    device) and the caller must use the torch ops."""
    if not _rows_ok(x):
        return None
    if not tau >= 0:
        raise ValueError(f"clear_below: tau must be at least 0, got {tau!r}")
    if (ops := _ops()) is None:
        return None
    if into is x:  # in place: rows of any strides, none overlapping another
        if not _dense(x):
            raise ValueError(f"clear_below: in place needs x's elements to be distinct, got strides {x.stride()} "
                             f"for shape {tuple(x.shape)}")
        _ran.add(f"clear_ {x.dtype}")
        ops.clear_(x, float(tau))
        return x
    if into is not None and not (into.is_contiguous() and into.shape == x.shape and into.dtype == x.dtype
                                 and into.device == x.device):
        raise ValueError(f"clear_below: into must be a contiguous tensor of x's shape {tuple(x.shape)} and dtype "
                         f"{x.dtype}, got {tuple(into.shape)} {into.dtype} (contiguous: {into.is_contiguous()})")
    if into is not None and into is not x and _overlap(x, into):
        raise ValueError("clear_below: into overlaps x (the op reads x while it writes into)")
    y = torch.empty_like(x, memory_format=torch.contiguous_format) if into is None else into
    _ran.add(f"clear {x.dtype}")
    ops.clear(x, float(tau), y)
    return y


def _reduced(op: str, x: torch.Tensor) -> Any:
    """The native one-pass reduction ``op`` of 4-D ``x`` (unit-stride rows, no temporary), or None where it does
    not run (small input, rows not of unit stride, kernels off, no compiler, another device)."""
    ops = _ops() if _rows_ok(x) else None
    if ops is None:
        return None
    _ran.add(f"{op} {x.dtype}")
    return getattr(ops, op)(x)


def absmax(x: torch.Tensor) -> float | None:
    """``max |x|`` (the native absmax op; NaN when x holds one, as ``float(x.abs().amax())``), or None (:func:`_reduced`)."""
    m = _reduced("absmax", x)
    return None if m is None else float(m)


def absrange(x: torch.Tensor) -> tuple[float, float] | None:
    """``(max |x|, min |x| over nonzero entries)``: the first as :func:`absmax` gives it, the second ``inf`` when every
    entry is 0 (a NaN is no magnitude), in one pass (the native absrange op); None where :func:`_reduced` is."""
    r = _reduced("absrange", x)
    return None if r is None else (float(r[0]), float(r[1]))


def norms(x: torch.Tensor) -> torch.Tensor | None:
    """Every row's ``‖x[b, h, s, :]‖``, (B, H, S) in the work dtype, x read as stored (native norms), or None."""
    return _reduced("norms", x)


def _rotate_halves_native(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, into: torch.Tensor,
                          stream: bool = False) -> torch.Tensor | None:
    """The half-layout rotation of 4-D ``x`` (width 2P) into ``into`` (x, or fresh: ``stream``): one native pass."""
    if not _native_ok(x, into, c, s) or c.shape != s.shape or x.shape[-1] != 2 * c.shape[-1]:
        return None
    (B, H, S), P = x.shape[:3], x.shape[3] // 2
    c, s = c.expand(B, H, S, P), s.expand(B, H, S, P)  # (B|1, H|1, S, P) -> (B, H, S, P)
    if any((c.stride(i) if c.shape[i] > 1 else 0) != (s.stride(i) if s.shape[i] > 1 else 0) for i in range(3)):
        return None
    if (ops := _ops()) is None:
        return None
    _ran.add(f"halves {x.dtype}")
    if into.data_ptr() == x.data_ptr():
        ops.halves_(x, c, s, _tile(x, into, S))
    else:  # a fresh output, streamed from STREAM_ABOVE_BYTES on (the op checks its pages and rows)
        ops.halves(x, c, s, _tile(x, into, S), into, stream and into.nbytes >= STREAM_ABOVE_BYTES)
    return into


def _tile(x: torch.Tensor, y: torch.Tensor, S: int) -> int:
    """Positions per tile of the row loop: :data:`TILE` for a fresh output above :data:`TILE_ABOVE_BYTES` (every
    size: the output's page faults and the other heads' rows evict the tables between heads; the half-layout
    rotation at (1, 32, 4096, 128): 1.03–1.04× a clone in tiles of 32, 1.10–1.18× head after head); in place
    head after head."""
    fresh = y.data_ptr() != x.data_ptr()
    return max(1, TILE if fresh and x.numel() * x.element_size() > TILE_ABOVE_BYTES else S)


def _register_fakes() -> None:
    """Fake implementations of the native ops (they write into a given tensor and return nothing), for
    torch.compile and ``torch.library.opcheck``."""
    for op in ("terms", "terms_", "halves", "halves_", "clear"):
        if op not in _fakes:
            torch.library.register_fake(f"{_NAME}::{op}")(_no_output)
            _fakes.add(op)
    for op, fake in (("absmax", lambda x: x.new_empty((), dtype=torch.float64)),
                     ("absrange", lambda x: x.new_empty((2,), dtype=torch.float64)),
                     ("norms", lambda x: x.new_empty(x.shape[:3], dtype=torch.float64 if x.dtype == torch.float64
                                                     else torch.float32))):
        if op not in _fakes:
            torch.library.register_fake(f"{_NAME}::{op}")(fake)
            _fakes.add(op)


def _no_output(*args: Any) -> None:
    return None

