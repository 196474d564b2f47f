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
        ("{\"a\": 1}", "must be a JSON list of rows"),
        ("@/nonexistent/matrix.json", "cannot read"),
    ],
)
def test_classify_refuses_bad_input_without_evaluating_it(arg, message):
    with pytest.raises(SystemExit, match=message):
        main(["classify", arg])


def test_classify_non_square_names_the_shape(capsys):
    assert main(["classify", "[[0, 1, 2], [3, 4, 5]]"]) == 2
    assert "(2, 3)" in capsys.readouterr().err


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
