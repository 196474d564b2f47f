"""One-pass elementwise kernels — compiled by Inductor, or native C — with the plain torch ops as their fallback.

The half layout rotates planes (k, k + P)::

    y₀ = c ⊙ x₀ − s ⊙ x₁        y₁ = s ⊙ x₀ + c ⊙ x₁        (x₀ = x[..., :P], x₁ = x[..., P:2P])

As torch ops that is four passes (two ``mul`` and two ``addcmul_``). Written as one expression,
``cat((x₀c − x₁s, x₀s + x₁c))``, ``torch.compile`` (Inductor) emits one loop over ``(…, P)`` with two
vector loads of x, two of the tables and two stores straight into the two halves of the output: one
read of x, one write of y — a vectorised C++ loop on the CPU, a Triton kernel on a GPU. Half-precision
x is upcast in registers and the low-precision output written directly (no float32 scratch pass); the
tables are float32 (or float64 for float64 inputs), as in the torch-op path, so the values are those of
the torch-op rotation (:func:`liepos._fast._rot`) up to the rounding of a fused multiply-add.

In place (``into`` is ``x``) the rotation is the native kernel below: one pass, both halves of a plane
loaded and both stored in one iteration. Inductor cannot write into the input it reads at another index
without a full-size temporary, so where the native kernel does not run (or ``into`` is a slice of a
wider output) the compiled kernel runs in slabs of the leading axes of about :data:`SLAB_BYTES`
(L3-resident), writing a fresh slab that a ``copy_`` puts where it belongs.

Native kernels (CPU): :func:`apply_terms`, the whole transform of a Jordan-coupled encoding as a sum of
column-shifted terms ``y[d] = Σ_j [mask_j(d)] T_j[d] · x[d + o_j]`` (tables from
:func:`liepos._fast._terms`), and the half-layout rotation (in place and out of place; the Inductor loop
runs it where the native kernels do not: CUDA, no C compiler). Each variant is a small C file
generated with its constants (dtype, width, offsets, masks), compiled by the system C compiler at its
first use (about 0.15 s; never at import), cached on disk (:data:`CACHE_ENV`: a directory of this user
that nobody else can write, created 0700; every library verified against its SHA-256 sidecar before it
is loaded, a truncated or foreign file rebuilt with one warning) and called through ``ctypes``; x of
float32, float64, bfloat16 or float16 is read and written directly (half precision
computed in float32 in registers and rounded as torch rounds).

Compiled once per *variant* (kernel, dtypes, device, which axes have size 1) with dynamic shapes, so a
new sequence length, batch or head count never recompiles; lazily at first use, under a lock. Each
variant gets its own code object, hence its own dynamo cache and recompile limit.

The fallback (:func:`liepos._fast._rot`, the slab-wise torch ops) runs when

* ``LIEPOS_KERNELS=0`` (also ``false``/``off``/``no``) is set — logged once at INFO;
* the device is neither CPU nor CUDA, or ``torch._dynamo``/``torch._inductor`` cannot be imported;
* compiling a variant fails (no C/C++ compiler, no Triton, an unwritable cache, …) — warned once with
  the reason, and that variant is never tried again; a kernel cache others could write into (a symlink,
  another owner, group- or world-writable) is refused with one warning, never used;
* the input is small (under :data:`MIN_ELEMS` elements: a compiled call costs ~30 µs of guards and
  wrappers, more than the torch ops on a decode step; the terms kernel, whose fallback is one
  ``addcmul_`` per coupling pair, runs at any size, :data:`MIN_ELEMS_TERMS`) or not in a layout the
  kernel takes.

Either way the result is the same rotation up to float rounding (tests compare both against each other
and the float64 dense reference).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
import types
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = [
    "CACHE_ENV", "ENV", "MIN_ELEMS", "MIN_ELEMS_TERMS", "SLAB_BYTES", "apply_terms", "enabled", "off", "rotate_halves",
    "status",
]

ENV = "LIEPOS_KERNELS"
# where the native (C) kernels are cached on disk (default: $XDG_CACHE_HOME/liepos/kernels or ~/.cache/…)
CACHE_ENV = "LIEPOS_KERNEL_CACHE"
# below this many elements of x the torch ops win: a compiled call costs ~30 µs of guards and wrappers
# (measured: 31 µs compiled vs 16 µs eager for one (1, 1, 1, 128) row on the 2-core CPU)
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
        return {"compiled": sorted(map(repr, _compiled)), "native": sorted(repr(k[:3]) for k in _native),
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
    # one native pass (both halves loaded, both stored; a fresh output in tiles of positions, :func:`_tile`):
    # in place, into a view, or fresh (measured at (1, 32, 4096, 128) against the Inductor loop below:
    # 1.03-1.04x a clone against 1.08-1.14x on two threads, 1.09x against 1.17-1.20x on one)
    y = torch.empty_like(x) if into is None and _native_ok(x, None, c, s) else into
    if y is not None and _rotate_halves_native(x, c, s, y) is not None:
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


# ---------------------------------------------------------------------- native kernels (C, the system compiler)
# Two loops Inductor does not write well: a sum of column-shifted terms (Jordan coupling: each output column
# reads its neighbours, which Inductor guards with a computed mask per vector, ~2× the loads of the row) and
# the half-layout rotation *in place* (both halves loaded, both stored, in one iteration: Inductor needs a
# full-size temporary for a store into the tensor it reads at another index). Each variant (dtypes, width,
# offsets, the structural mask) is generated as a small C file without torch headers, compiled by the
# system C compiler (~0.2 s), cached on disk (CACHE_ENV) and loaded with ctypes, which releases the GIL.
_PRELUDE = r"""
#include <stdint.h>
#include <string.h>
static inline float bf2f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {  /* round to nearest even, NaN -> 0x7fc0: torch's rounding */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* rows in tiles of `tile` positions, every head of a tile before the next: a table row shared by the heads
   is read from memory once and from L1/L2 by the others (tile = S: head after head) */
#define TILED_ROWS \
    _Pragma("omp parallel for collapse(3) schedule(static) num_threads(nthreads)") \
    for (int64_t b = 0; b < B; b++) for (int64_t s0 = 0; s0 < S; s0 += tile) for (int64_t h = 0; h < H; h++) \
    for (int64_t s = s0; s < (s0 + tile < S ? s0 + tile : S); s++)
"""
# y[d] = Σ_j [mask_j(d)] T_j[d] · x[d + o_j] per row, accumulated in the tables' type by fused multiply-adds
# (one rounding per term; a masked lane keeps the sum); x is copied into a zero-padded row first, so y may
# be x (in place) and no read leaves the row
_TERMS = r"""
#define D {D}
#define J {J}
#define PL {PL}
static const int64_t OFF[J] = {{{OFF}}};
static const unsigned char MASK[J][D] = {{{MASK}}};
void run(const X* x, X* y, const W* t, int64_t B, int64_t H, int64_t S, int64_t xb, int64_t xh, int64_t xs,
         int64_t yb, int64_t yh, int64_t ys, int64_t tb, int64_t th, int64_t ts, int64_t tj, int64_t nthreads,
         int64_t tile) {{
    TILED_ROWS {{
        const X* xr = x + b * xb + h * xh + s * xs;
        X* yr = y + b * yb + h * yh + s * ys;
        const W* tr = t + b * tb + h * th + s * ts;
        W xp[PL + D + {PR} + 1];
        for (int d = 0; d < PL; d++) xp[d] = 0;
        for (int d = 0; d < {PR} + 1; d++) xp[PL + D + d] = 0;
        for (int d = 0; d < D; d++) xp[PL + d] = LD(xr[d]);
        for (int d = 0; d < D; d++) {{
            W acc = 0;
            #pragma GCC unroll 16
            for (int j = 0; j < J; j++) {{ W v = acc + tr[j * tj + d] * xp[PL + d + OFF[j]]; acc = MASK[j][d] ? v : acc; }}
            yr[d] = ST(acc);
        }}
    }}
}}
"""
# y₀ = c x₀ − s x₁, y₁ = s x₀ + c x₁ on (k, k + P): iteration k reads and writes only k and k + P, so the
# loop has no carried dependence even when y is x (ivdep)
_HALVES = r"""
#define P {P}
void run(const X* x, X* y, const W* c, const W* sn, int64_t B, int64_t H, int64_t S, int64_t xb, int64_t xh,
         int64_t xs, int64_t yb, int64_t yh, int64_t ys, int64_t tb, int64_t th, int64_t ts, int64_t tj,
         int64_t nthreads, int64_t tile) {{
    TILED_ROWS {{
        const X* xr = x + b * xb + h * xh + s * xs;
        X* yr = y + b * yb + h * yh + s * ys;
        const W* cr = c + b * tb + h * th + s * ts;
        const W* sr = sn + b * tb + h * th + s * ts;
        #pragma GCC ivdep
        for (int k = 0; k < P; k++) {{
            W x0 = LD(xr[k]), x1 = LD(xr[k + P]);
            yr[k] = ST(cr[k] * x0 - sr[k] * x1);
            yr[k + P] = ST(sr[k] * x0 + cr[k] * x1);
        }}
    }}
}}
"""
# x's dtype -> (C type of x, C type of the tables, load, store); half precision is computed in float
_CTYPES = {
    torch.float32: ("float", "float", "", ""),
    torch.float64: ("double", "double", "", ""),
    torch.bfloat16: ("uint16_t", "float", "bf2f", "f2bf"),
    torch.float16: ("_Float16", "float", "(float)", "(_Float16)"),
}
# tried in this order; 256-bit vectors measured ~10% faster than 512-bit for the terms kernel on the 2-core EPYC
_FLAGS = (("-O3", "-march=native", "-mprefer-vector-width=256", "-fopenmp"), ("-O3", "-march=native", "-fopenmp"),
          ("-O3", "-march=native"), ("-O3",))
_MAX_WIDTH = 4096  # the kernels keep a row on the stack
# the terms kernel runs in tiles of TILE positions (all heads of a tile in turn) when x is larger than this
TILE, TILE_ABOVE_BYTES = 32, 16 << 20
_native: dict[tuple, Callable] = {}


def _cache_dir() -> Path:
    """The on-disk cache of compiled native kernels: ``$LIEPOS_KERNEL_CACHE``, else
    ``$XDG_CACHE_HOME/liepos/kernels`` (``~/.cache/…``), created with mode 0700 and checked before every use
    (:func:`_check_private`). There is no fallback to a shared temporary directory: where the cache cannot be
    made private, the native kernels are not built (one warning) and the torch ops run."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "liepos", "kernels")
    d = Path(base)
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
    """What -march=native depends on: the CPU's flags (or the machine name), for the cache key."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return next((ln for ln in f if ln.startswith(("flags", "Features"))), platform.machine())
    except OSError:
        return platform.machine() + platform.processor()


def _compiler() -> str | None:
    """The C compiler the native kernels are built with: ``$CC`` when set (None if it is not a program),
    else the first of cc, gcc, clang on PATH."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@functools.lru_cache(maxsize=8)
def _compiler_id(cc: str) -> str:
    """The compiler as the cache key knows it: its resolved path and the first line of ``--version``."""
    try:
        r = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        version = (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else ""
    except (OSError, subprocess.SubprocessError) as err:
        version = f"unknown ({err!r})"
    return f"{os.path.realpath(cc)}\0{version}"


def _sha256(path: Path) -> str:
    with open(path, "rb", opener=_nofollow) as f:
        return hashlib.sha256(f.read()).hexdigest()


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


def _verified(lib: Path) -> bool | None:
    """Whether the cached ``lib`` may be loaded: None when there is none; True when it is a regular file of
    this user whose bytes hash to its sidecar (``lib.sha256``, written after the library's atomic rename);
    False for anything else (a symlink, a truncated or foreign file, no sidecar): it is then rebuilt and
    renamed over it (nothing is deleted first, so a process loading a good copy never finds it gone)."""
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


def _build(name: str, source: str) -> Path:
    """``source`` compiled to a shared library in the cache (reused when it exists and its hash checks out;
    rebuilt, with one warning, when it does not); raises with the compiler's message when no flag set
    compiles it. The key covers the source, the flags, the CPU and the compiler (path and version)."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError(f"no C compiler: CC={os.environ.get('CC')!r}, and no cc, gcc or clang on PATH")
    key = hashlib.sha256("\0".join((source, repr(_FLAGS), _machine(), _compiler_id(cc))).encode()).hexdigest()[:20]
    d = _cache_dir()
    lib = d / f"{name}_{key}.so"
    ok = _verified(lib)
    if ok:
        return lib
    if ok is False:
        _say_once(f"rebuilt:{lib.name}", f"liepos: the cached kernel {str(lib)!r} is not the library liepos built "
                  f"(a truncated, foreign or unverifiable file): rebuilt", True)
    # a fresh private directory (mkdtemp: 0700, created exclusively) for the source and the output: no name in
    # it can be a planted symlink, and the source's fixed name keeps the built bytes the same in every process
    work = Path(tempfile.mkdtemp(prefix="build_", dir=d))
    src, tmp = work / f"{name}_{key}.c", work / f"{name}_{key}.so"
    errors = []
    try:
        with open(src, "x", encoding="utf-8", opener=_nofollow) as f:
            f.write(source)
        for flags in _FLAGS:
            r = _run_compiler([cc, *flags, "-fPIC", "-shared", str(src), "-o", str(tmp)])
            if r.returncode == 0:
                digest = _sha256(tmp)
                os.replace(tmp, lib)  # atomic: concurrent processes compile the same bytes
                side = work / "sha256"
                with open(side, "x", encoding="ascii", opener=_nofollow) as f:
                    f.write(digest)
                os.replace(side, lib.with_suffix(".sha256"))  # the sidecar after the library
                return lib
            errors.append(f"{' '.join(flags)}: {r.stderr.strip()[-300:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raise RuntimeError(f"{cc} failed: " + " | ".join(errors))


def _run_compiler(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _native_fn(name: str, dtype: torch.dtype, params: tuple, body: Callable[[], str], pointers: int) -> Callable | None:
    """The compiled ``run`` of the variant ``(name, dtype, params)``, ``body()`` its C code (built at its first
    use, under the lock), or None when it cannot be built (warned once with the reason, never tried again)."""
    key = ("native", name, dtype, params)
    fn = _native.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _native.get(key)
        if fn is not None or key in _failed:
            return fn
        xt, wt, ld, st = _CTYPES[dtype]
        source = f"{_PRELUDE}typedef {xt} X;\ntypedef {wt} W;\n#define LD(v) {ld}(v)\n#define ST(v) {st}(v)\n{body()}"
        try:
            fn = ctypes.CDLL(str(_build(name, source))).run
        except Exception as err:  # no compiler, a compiler error, an unsafe or unwritable cache: the torch ops
            _failed[key] = f"{name} {dtype}: {err!r}"[:500]
            if isinstance(err, UnsafeCacheError):  # one warning for the cache, whatever the kernel
                _say_once("cache", f"liepos: no native kernels, using the torch ops: {err}", True)
            else:
                _say_once(f"native:{name}:{dtype}", f"liepos: building the native {name} kernel for {dtype} failed, "
                          f"using the torch ops: {repr(err)[:300]}", True)
            return None
        fn.argtypes, fn.restype = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * 15, None
        _native[key] = fn
        return fn


def _strides(t: torch.Tensor, n: int) -> list[int]:
    return [t.stride(i) if t.shape[i] > 1 else 0 for i in range(n)]


def _native_ok(x: torch.Tensor, into: torch.Tensor | None, *tables: torch.Tensor, least: int | None = None) -> bool:
    """The native kernels take 4-D x (last stride 1, at least ``least`` elements, default :data:`MIN_ELEMS`) of
    a supported dtype, tables of the work dtype."""
    least = MIN_ELEMS if least is None else least
    if x.numel() < least or x.dim() != 4 or x.dtype not in _CTYPES or not enabled(x.device, native=True):
        return False
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    if any(t.dtype != work or t.stride(-1) != 1 or t.device != x.device for t in tables):
        return False
    if x.shape[-1] > _MAX_WIDTH or x.stride(-1) != 1:
        return False
    return into is None or (into.dtype == x.dtype and into.shape == x.shape and into.stride(-1) == 1)


def apply_terms(
    x: torch.Tensor, T: torch.Tensor, offsets: tuple[int, ...], masks: tuple[tuple[int, ...], ...],
    into: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``y[…, d] = Σ_j [masks[j][d]] T[…, j, d] · x[…, d + offsets[j]]`` in one pass (native C kernel).

    ``x``: (B, H, S, D) with any strides but the last; ``T``: (B|1, H|1, S, J, D), the tables in the work
    dtype; ``masks[j][d]``: whether term j exists at column d (a structural zero is skipped, so a
    non-finite neighbour never leaks into a column); ``into``: x itself, a view of a wider output, or
    None (a fresh output in x's memory order). Returns None when the kernel does not run (small input,
    kernels off, no compiler, another device) and the caller must use the torch ops.
    """
    if T.dim() != 5 or not _native_ok(x, into, T, least=MIN_ELEMS_TERMS):
        return None
    B, H, S, D = x.shape
    J = len(offsets)
    if T.shape[-2:] != (J, D) or len(masks) != J or any(len(m) != D for m in masks):
        raise ValueError(f"terms: tables {tuple(T.shape)} do not match {J} offsets and width {D}")
    body = lambda: _TERMS.format(  # noqa: E731
        D=D, J=J, PL=max(0, -min(offsets)), PR=max(0, max(offsets)), OFF=", ".join(map(str, offsets)),
        MASK=", ".join("{" + ",".join(map(str, m)) + "}" for m in masks))
    fn = _native_fn("terms", x.dtype, (D, tuple(offsets), tuple(masks)), body, 3)
    if fn is None:
        return None
    y = torch.empty_like(x) if into is None else into
    T = T.expand(B, H, S, J, D)  # (B|1, H|1, S, J, D) -> (B, H, S, J, D), stride 0 where broadcast
    # tiles of positions for a large fresh output, whose page faults evict the tables between heads (measured
    # at (1, 32, 4096, 128): 1.2x a clone in tiles of 32, 1.6x head after head); in place and below
    # TILE_ABOVE_BYTES (L3-resident) head after head is faster (in place 1.1x against 2.1x a warm copy)
    with _profiled("liepos::apply_terms"):
        fn(x.data_ptr(), y.data_ptr(), T.data_ptr(), B, H, S, *_strides(x, 3), *_strides(y, 3), *_strides(T, 3),
           T.stride(3), torch.get_num_threads(), _tile(x, y, S))
    return y


def _profiled(name: str):
    """A profiler range around a native call (invisible to torch's profiler otherwise), only while one records."""
    if getattr(torch.autograd.profiler, "_is_profiler_enabled", False):
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


def _rotate_halves_native(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, into: torch.Tensor) -> torch.Tensor | None:
    """The half-layout rotation of 4-D ``x`` (width 2P) into ``into`` (may be x): one native pass."""
    if not _native_ok(x, into, c, s) or c.shape != s.shape or x.shape[-1] != 2 * c.shape[-1]:
        return None
    B, H, S, D = x.shape
    P = D // 2
    c, s = c.expand(B, H, S, P), s.expand(B, H, S, P)  # (B|1, H|1, S, P) -> (B, H, S, P)
    if _strides(c, 3) != _strides(s, 3):
        return None
    fn = _native_fn("halves", x.dtype, (P,), lambda: _HALVES.format(P=P), 4)
    if fn is None:
        return None
    with _profiled("liepos::rotate_halves"):
        fn(x.data_ptr(), into.data_ptr(), c.data_ptr(), s.data_ptr(), B, H, S, *_strides(x, 3), *_strides(into, 3),
           *_strides(c, 3), 0, torch.get_num_threads(), _tile(x, into, S))
    return into


def _tile(x: torch.Tensor, y: torch.Tensor, S: int) -> int:
    """Positions per tile of :data:`TILED_ROWS`: :data:`TILE` for a large fresh output, whose page faults evict
    the tables between heads (the half-layout rotation at (1, 32, 4096, 128): 1.03–1.04× a clone in tiles of
    32, 1.10–1.18× head after head); in place and below :data:`TILE_ABOVE_BYTES` (L3-resident) head after head."""
    fresh = y.data_ptr() != x.data_ptr()
    return max(1, TILE if fresh and x.numel() * x.element_size() > TILE_ABOVE_BYTES else S)
