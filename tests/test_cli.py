"""The command line: `liepos classify` and `liepos catalogue` (the other subcommands have their own tests)."""

import json
import subprocess
import sys

import pytest

import liepos as lp
from liepos.cli import main


def test_classify_prints_the_table(capsys):
    assert main(["classify", "[[-0.1, 1], [-1, -0.1]]"]) == 0
    out = capsys.readouterr().out
    assert "damped_rotation" in out and "spins + fades" in out


def test_classify_json_and_file(tmp_path, capsys):
    f = tmp_path / "x.json"
    f.write_text(json.dumps([[0, 1, 0], [0, 0, 1], [0, 0, 0]]))
    assert main(["classify", f"@{f}", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"]["polynomial"] == 1
    assert data["blocks"] == [[0.0, 0.0, 3]]


@pytest.mark.parametrize(
    "arg,message",
    [
        ("[[0, 1], [", "not valid JSON"),
        ("[[0, 1], [1, \"__import__('os')\"]]", "entries must be numbers"),
        ("{\"a\": 1}", "must be a non-empty JSON list of rows"),
        ("@/nonexistent/matrix.json", "cannot read"),
    ],
)
def test_classify_refuses_bad_input_without_evaluating_it(arg, message, capsys):
    assert main(["classify", arg]) == 2
    assert message in capsys.readouterr().err


def test_classify_non_square_names_the_shape(capsys):
    assert main(["classify", "[[0, 1, 2], [3, 4, 5]]"]) == 2
    assert "(2, 3)" in capsys.readouterr().err


def test_classify_keeps_integer_entries_exact(capsys):
    """An integer JSON matrix reaches classify as Python ints (its exact path), not rounded floats."""
    big = 2**60 + 1  # not a float64
    assert main(["classify", json.dumps([[0, big], [0, 0]]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["polynomial"] == 1


def test_catalogue_lists_every_entry_with_its_classification(capsys):
    assert main(["catalogue", "--head-dim", "8", "--heads", "2"]) == 0
    out = capsys.readouterr().out
    for name, entry in lp.CATALOGUE.items():
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert entry.identity in line
        assert entry.row in line


def test_console_script_help_lists_examples():
    out = subprocess.run([sys.executable, "-m", "liepos.cli", "--help"], capture_output=True, text=True, check=True)
    for sub in ("tour", "classify", "catalogue", "plot", "bench", "diagnose", "explore"):
        assert f"liepos {sub}" in out.stdout


def test_catalogue_prints_nothing_when_an_entry_refuses_the_head_dim(capsys):
    assert main(["catalogue", "--head-dim", "8", "--heads", "2"]) == 0
    capsys.readouterr()
    assert main(["catalogue", "--head-dim", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--head-dim 2" in err


def test_diagnose_lp_json(capsys):
    assert main(["diagnose", "lp:xpos", "--head-dim", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["relative"] is True and data["violations"] == []
    want = sorted((round(r, 6), round(abs(w), 6)) for r, w, _ in lp.xpos(8).generator.blocks)
    assert sorted((round(r, 6), round(abs(w), 6)) for r, w, _ in data["blocks"]) == want


@pytest.mark.slow
def test_a_reader_that_leaves_ends_the_command_quietly():
    """`liepos catalogue | head -0`: no BrokenPipeError traceback, the shell's SIGPIPE status."""
    p = subprocess.Popen([sys.executable, "-m", "liepos.cli", "catalogue"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err


# ---------------------------------------------------------------------- help: fast, no torch, pasteable
_HELP_PROBE = """
import contextlib, io, sys, time
t0 = time.perf_counter()
from liepos.cli import SUBCOMMANDS, main
for argv in ([], *([name] for name in SUBCOMMANDS)):
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    assert "usage: liepos" in out.getvalue(), argv
seconds = time.perf_counter() - t0
heavy = sorted(m for m in ("torch", "numpy", "matplotlib", "transformers") if m in sys.modules)
print(heavy, seconds)
"""


def test_every_help_loads_no_torch_and_takes_under_a_second():
    """`liepos --help` and each subcommand's help build the parser and print it with torch never imported;
    the whole loop (import included, interpreter start excluded) takes under a second."""
    proc = subprocess.run([sys.executable, "-c", _HELP_PROBE], capture_output=True, text=True, check=True)
    heavy, seconds = proc.stdout.rsplit(" ", 1)
    assert heavy == "[]", heavy
    assert float(seconds) < 1.0, seconds


def test_help_quotes_the_head_group_bar_so_it_pastes_into_a_shell(capsys):
    """Every example line of every help, pasted into a shell, is one command: no `|` outside quotes."""
    from liepos.cli import SUBCOMMANDS

    lines = []
    for argv in ([], *([name] for name in SUBCOMMANDS)):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        lines += [ln.strip() for ln in capsys.readouterr().out.splitlines()
                  if ln.strip().startswith(("liepos ", "torchrun ", "python "))]
    assert any("'rope,alibi,decay:0.01,jordan4,rope+decay,rope|alibi'" in ln for ln in lines)
    for line in lines:
        assert not _pipes_outside_quotes(line), line


def _pipes_outside_quotes(line: str) -> bool:
    quote = None
    for ch in line:
        if quote is None and ch in "'\"":
            quote = ch
        elif ch == quote:
            quote = None
        elif quote is None and ch == "|":
            return True
    return False


def test_the_task_names_of_the_help_are_the_tasks():
    from liepos.cli.explore import TASK_NAMES
    from liepos.explore.tasks import TASKS

    assert TASK_NAMES == tuple(sorted(TASKS))


def test_the_lazy_facade_table_is_the_type_checkers_imports():
    """`liepos/__init__.py` runs its name table; its `if TYPE_CHECKING:` imports (what mypy and the API
    reference read) name the same modules for the same names."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(lp.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {a.asname: (None if n.module == "liepos" else n.module) for n in block.body
                if isinstance(n, ast.ImportFrom) for a in n.names}
    lazy = {k: v for k, v in lp._LAZY.items() if k not in ("from_hf", "to_hf", "interop", "diagnose", "Diagnosis")}
    assert imported == lazy
    for name in lp.__all__:
        assert getattr(lp, name) is not None, name


# ---------------------------------------------------------------------- bench: the user's folder, a plain verdict
def test_bench_writes_outside_the_checkout_and_exits_1_on_a_missed_target(tmp_path, monkeypatch, capsys):
    """`liepos bench --quick` with the timing replaced by one met and one missed target: the results land in
    the user's cache folder, `git status` of the checkout is unchanged, the exit status is 1 and the
    output says MISSED. (The timing itself is the benchmark's business, not a unit test's.)"""
    from pathlib import Path

    import liepos.cli.bench as bench_cli

    root = Path(__file__).resolve().parents[1]
    git = ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"]
    before = subprocess.run(git, capture_output=True, text=True).stdout
    suite = bench_cli.load_suite()
    targets = [{"target": "fast enough", "value": 2.0, "bound": 1.0, "met": True},
               {"target": "lean enough", "value": 3.0, "bound": 1.5, "met": False}]
    fake = {"meta": {"torch": "x", "threads": 1, "cpu_count": 2, "capability": "x", "wall_s": 0.0},
            "rows": [], "targets": targets}
    monkeypatch.setattr(suite, "run_suite", lambda quick, log: fake)
    monkeypatch.setattr(bench_cli, "load_suite", lambda *a: suite)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["bench", "--quick"]) == 1
    out = capsys.readouterr()
    written = tmp_path / "cache" / "liepos-bench"
    assert sorted(p.name for p in written.iterdir()) == ["quick.json", "quick.md"]
    assert "MISSED" in out.out and "lean enough" in out.out.split("MISSED on this machine")[1]
    assert str(written) in out.err
    assert subprocess.run(git, capture_output=True, text=True).stdout == before
    fake["targets"] = targets[:1]
    assert main(["bench", "--quick"]) == 0
    assert bench_cli.default_out().resolve().is_relative_to(tmp_path)


@pytest.mark.slow  # the everyday lane leaves it to CI (seconds to minutes on two cores)
def test_the_messages_the_cli_guide_quotes_are_the_ones_printed():
    """Each `$ liepos …` line of docs/guide/cli.md's bad-input block, run, prints the line quoted under it."""
    import re
    import shlex
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "cli.md").read_text(encoding="utf-8")
    block = guide.split("## Bad input", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    pairs = re.findall(r"^\$ liepos (.*)\n(liepos .*)$", block, flags=re.M)
    assert len(pairs) >= 4
    for argv, quoted in pairs:
        r = subprocess.run([sys.executable, "-m", "liepos.cli", *shlex.split(argv)], capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.strip() == quoted, (argv, r.stderr)


def test_a_facade_function_named_like_its_module_stays_the_function():
    """`lp.classify`, `lp.attention`, `lp.diagnose` are functions even after the modules that define them
    (`liepos.classification`, `liepos.attend`, `liepos.diagnosis`) are imported, in a fresh interpreter."""
    code = ("import importlib, liepos as lp\n"
            "for name, module in (('classify', 'classification'), ('attention', 'attend'), ('diagnose', 'diagnosis')):\n"
            "    importlib.import_module('liepos.' + module)\n"
            "    assert callable(getattr(lp, name)) and getattr(lp, name).__name__ == name, name\n"
            "    assert type(lp) is type(importlib), type(lp)  # a plain module: no class of its own\n")
    subprocess.run([sys.executable, "-c", code], check=True)
