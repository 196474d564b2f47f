"""Test configuration: in CI (CI=true) a skipped test is a failure.

Every upstream package the parity tests compare against is installed by the README's test command,
so a skip there means a comparison silently did not happen.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

# tests/helpers.py holds helpers shared by several test files (import mode is importlib)
sys.path.insert(0, str(Path(__file__).resolve().parent))

# under pytest-xdist (-n auto) the workers share the cores: each gets its share of torch's threads, so that
# two workers on two cores do not run four threads (a test that needs one reduction order sets one thread)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"skipped in CI, where every test must run: {reason}"


@pytest.fixture
def tiling(monkeypatch):
    """The causal tiling's tiles for a fading encoding (its flash calls, arena, clearing and merges), where the
    native re-centring kernel (liepos.recentred_kernel) would otherwise take the call."""
    from liepos import causal_tiling

    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)


@pytest.fixture
def one_thread():
    """One intra-op thread: token-by-token decoding is thousands of tiny ops, where OpenMP barriers
    dominate, and exact-equality comparisons need one reduction order."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def deterministic():
    """torch's deterministic kernels for one test, then the setting the test found."""
    was, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(was, warn_only=warn)
