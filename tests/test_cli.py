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


def test_a_reader_that_leaves_ends_the_command_quietly():
    """`liepos catalogue | head -0`: no BrokenPipeError traceback, the shell's SIGPIPE status."""
    p = subprocess.Popen([sys.executable, "-m", "liepos.cli", "catalogue"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err
