"""Bad input to the command line: one line naming the flag and the value, exit status 2, no traceback.

The cases for classify, catalogue, diagnose, bench and the dispatcher run the real entry
point (``python -m liepos.cli``) in a subprocess each (started together: each pays torch's import);
the rest run ``main`` in-process, and hypothesis feeds classify garbage argv.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import liepos.cli as cli
from liepos.cli import main

DEEP = "[" * 5000 + "]" * 5000  # far past the JSON parser's recursion limit
BIG = "[[1" + "0" * 400 + "]]"  # a 401-digit integer: beyond float64
# (argv, what the one stderr line must contain: the flag or argument and the value)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "catalogue-head-dim-0": (["catalogue", "--head-dim", "0"], ["--head-dim", "got 0"]),
    "catalogue-head-dim-3": (["catalogue", "--head-dim", "3"], ["--head-dim 3", "even"]),
    "catalogue-head-dim-2": (["catalogue", "--head-dim", "2"], ["--head-dim 2", "jordan"]),
    "catalogue-heads-0": (["catalogue", "--heads", "0"], ["--heads", "got 0"]),
    "diagnose-hf-head-dim-3": (["diagnose", "hf:llama", "--head-dim", "3"], ["--head-dim 3", "even"]),
    "diagnose-rope-bogus": (["diagnose", "hf:llama", "--rope", '{"rope_type":"bogus"}'],
                            ["--rope", "rope_type", "'bogus'", "yarn"]),
    "classify-deep": (["classify", DEEP], ["MATRIX", "nested too deeply"]),
    "classify-non-utf8-file": (["classify", "@{tmp}/latin1.json"], ["MATRIX", "UTF-8", "0xe9"]),
    "classify-non-utf8-argv": (["classify", os.fsdecode(b"[[0, 1], [-1, \xff]]")], ["MATRIX", "not valid JSON", "\\udcff"]),
    "classify-400-digits": (["classify", BIG], ["MATRIX", "401 digits", "float64"]),
    "classify-invalid-json": (["classify", "[[0, 1], ["], ["MATRIX", "not valid JSON"]),
    "classify-not-square": (["classify", "[[0, 1, 2], [3, 4, 5]]"], ["MATRIX", "square", "(2, 3)"]),
    "bench-threads-0": (["bench", "--threads", "0"], ["--threads", "got 0"]),
    "dispatcher-unknown-command": (["bogus"], ["COMMAND", "'bogus'"]),
    "dispatcher-missing-argument": (["classify"], ["MATRIX"]),
    "dispatcher-unknown-flag": (["catalogue", "--head-dims", "8"], ["--head-dims"]),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "latin1.json").write_bytes("[[0, 1], [-1, 0]] # é".encode("latin-1"))
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[2])}

    def one(argv: list[str]) -> subprocess.CompletedProcess:
        argv = [a.replace("{tmp}", str(tmp)) for a in argv]
        return subprocess.run([sys.executable, "-m", "liepos.cli", *argv], capture_output=True, text=True,
                              env=env, timeout=120)

    with ThreadPoolExecutor(max_workers=4) as pool:
        done = dict(zip(CASES, pool.map(one, [argv for argv, _ in CASES.values()])))
    return done


@pytest.mark.slow  # the everyday lane leaves it to CI (seconds to minutes on two cores)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2_from_the_console_entry_point(results, case):
    r = results[case]
    _, needles = CASES[case]
    assert r.returncode == 2, (case, r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, lines
    command = CASES[case][0][0] if CASES[case][0][0] in cli.SUBCOMMANDS else ""
    assert lines[0].startswith(f"liepos {command}".rstrip() + ": ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ---------------------------------------------------------------------- in-process: more bad values
def _refused(argv: list[str], capsys) -> str:
    """main(argv) refuses with status 2 (returned, or argparse's SystemExit) and one stderr line."""
    try:
        rc = main(argv)
    except SystemExit as exit_:
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc == 2, (argv, rc, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv,needle", [
    (["classify", "[[NaN]]"], "NaN"),
    (["classify", "[[1e400]]"], "1e400"),
    (["classify", "[]"], "non-empty"),
    (["classify", "{\"a\": 1}"], "list of rows"),
    (["classify", "[[true, 1], [0, 0]]"], "numbers"),
    (["classify", "[[0, 1], [1, \"__import__('os')\"]]"], "numbers"),
    (["classify", "[[0, 1], [1]]"], "square"),
    (["classify", "@/nonexistent/matrix.json"], "cannot read"),
    (["classify", "[[0]]", "--tol", "-1"], "--tol"),
    (["classify", "[[0]]", "--tol", "nan"], "--tol"),
    (["catalogue", "--head-dim", "x"], "'x'"),
    (["catalogue", "--head-dim", "1000000000"], "--head-dim"),
    (["diagnose", "hf:llama", "--rope", "{bad"], "not valid JSON"),
    (["diagnose", "hf:llama", "--rope", "[1]"], "JSON object"),
    (["diagnose", "hf:llama", "--rope", '{"rope_type": "yarn"}'], "factor"),
    (["diagnose", "hf:llama", "--rope", '{"rope_type": "yarn", "factor": 4, "fator": 2}'], "fator"),
    (["diagnose", "hf:llama", "--rope", '{"rope_type": "linear", "factor": 0.5}'], "factor"),
    (["diagnose", "hf:bert"], "BertRotaryEmbedding"),
    (["diagnose", "hf:nosuch"], "'nosuch'"),
    (["diagnose", "lp:nosuch"], "'nosuch'"),
    (["diagnose", "lp:rope", "--head-dim", "3"], "--head-dim 3"),
    (["diagnose", "lp:rope", "--rope", "{}"], "--rope"),
    (["diagnose", "llama"], "'llama'"),
    (["diagnose", "hf:llama", "--tol", "0"], "--tol"),
    (["diagnose", "hf:llama", "--max-position", "0"], "--max-position"),
    (["diagnose", "hf:llama", "--head-dim", "4096"], "--head-dim"),
    (["bench", "--suite", "/nonexistent/bench.py"], "--suite"),
])
def test_more_bad_values_are_refused_by_name(argv, needle, capsys):
    assert needle in _refused(argv, capsys)


def test_bench_out_under_a_file_fails_before_any_work(tmp_path, capsys, monkeypatch):
    import liepos.cli.bench as bench_cli

    (tmp_path / "f").write_text("x")
    monkeypatch.setattr(bench_cli, "load_suite", lambda *a: pytest.fail("the suite was loaded"))
    assert "--out" in _refused(["bench", "--quick", "--out", str(tmp_path / "f")], capsys)


def test_invalid_json_and_a_non_square_matrix_share_the_exit_code(capsys):
    codes = {main(["classify", text]) for text in ("[[0, 1], [", "[[0, 1, 2], [3, 4, 5]]", "[[0, 1], [1]]")}
    assert codes == {2}


# ---------------------------------------------------------------------- the dispatcher
def test_a_bug_inside_a_subcommand_keeps_its_traceback(monkeypatch):
    import liepos.cli.catalogue as catalogue

    for error in (ImportError("no module named liepos._gone"), AttributeError("'X' object has no attribute 'y'")):
        def broken(args, error=error):
            raise error

        monkeypatch.setattr(catalogue, "run", broken)
        with pytest.raises(type(error)):
            main(["catalogue"])


def test_a_missing_optional_package_is_named_with_its_extra(monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else
                        find_spec(name, *a))
    err = _refused(["diagnose", "hf:llama"], capsys)
    assert "'transformers'" in err and "[hf]" in err and "plot" not in err


def test_every_subcommand_module_has_the_contract():
    import importlib

    for name, path in cli.SUBCOMMANDS.items():
        mod = importlib.import_module(path)
        assert callable(mod.configure) and callable(mod.run), name
        if path.startswith("liepos.cli."):
            assert isinstance(mod.HELP, str) and "\n" not in mod.HELP
            assert all(e.startswith(("liepos ", "python ", "torchrun ")) for e in mod.EXAMPLES)


# ---------------------------------------------------------------------- hypothesis: garbage argv
_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | _TEXT,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_TEXT, kids, max_size=3), max_leaves=12,
).map(lambda v: json.dumps(v))
_SQUARE = st.integers(1, 4).flatmap(lambda n: st.lists(
    st.lists(st.floats(-1e3, 1e3) | st.integers(-9, 9), min_size=n, max_size=n), min_size=n, max_size=n,
)).map(json.dumps)
_MATRIX = _TEXT | _JSONISH | _SQUARE | _SQUARE.map(lambda s: s[: len(s) // 2])
_FLAGS = st.lists(st.sampled_from(["--tol", "--json", "-1", "0", "1e-3", "nan", "x", "--", "-h"]), max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(matrix=_MATRIX, flags=_FLAGS)
def test_garbage_argv_for_classify_never_shows_a_traceback(matrix, flags, capsys):
    argv = ["classify", matrix, *flags] if not matrix.startswith("-") else ["classify", "--", matrix]
    try:
        rc = main(argv)
    except SystemExit as exit_:
        rc = exit_.code
    out, err = capsys.readouterr()
    assert rc in (0, 2), (argv, rc, err)
    if rc == 2:
        assert len(err.splitlines()) == 1 and err.startswith("liepos classify: "), err
    else:
        assert err == "" and out
