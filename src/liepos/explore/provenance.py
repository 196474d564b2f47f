"""Where a run came from: the command line, the liepos commit, torch, the CPU and the thread count.

Recorded in every run file, so that a difference between two machines (one float32 ulp early in
training grows to 1e-2 in a loss) can be traced to its cause.

>>> sorted(provenance())
['arguments', 'command', 'cpu', 'liepos', 'python', 'threads', 'torch']
"""

from __future__ import annotations

import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

__all__ = ["cpu_model", "liepos_version", "provenance"]


def liepos_version() -> str:
    """``git <commit>`` (``+dirty`` with uncommitted changes) when liepos runs from a checkout, else its version."""
    here = Path(__file__).resolve()
    root = here.parents[3]  # <checkout>/src/liepos/explore/provenance.py
    try:
        if here.parents[1] != root / "src" / "liepos":
            raise OSError("not a checkout's src layout")  # installed: an enclosing repository is not liepos'
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        if Path(top).resolve() != root:
            raise OSError("the enclosing repository is not this checkout")
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        if head:
            return f"git {head}{'+dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        pass
    from liepos._version import __version__

    return f"version {__version__}"


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else :func:`platform.processor`, else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def provenance(arguments: list[str] | None = None) -> dict:
    """The process' command line (as the shell would take it back), the explorer's ``arguments``
    (default: the process' own), liepos, torch, python, the CPU, torch's threads."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    args = sys.argv[1:] if arguments is None else list(arguments)
    return {"command": shlex.join(argv), "arguments": shlex.join(args), "liepos": liepos_version(),
            "torch": torch.__version__,
            "python": platform.python_version(), "cpu": cpu_model(), "threads": torch.get_num_threads()}
