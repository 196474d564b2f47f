"""`liepos plot` and `liepos tour` on the command line: every figure alone, and bad input refused by name.

The subcommand modules are driven through their own contract (`configure(parser)`, `run(args)`, bad input
raised as `UsageError`), as the dispatcher `liepos.cli.main` drives them."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")

from liepos.cli import plot as plot_cli  # noqa: E402
from liepos.cli import tour as tour_cli  # noqa: E402
from liepos.cli._common import UsageError  # noqa: E402
from liepos.tour import figures as F  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def cli(module, *argv: str) -> tuple[int, str]:
    """(exit status, message) of ``liepos <module> argv``: 2 and the one-line message for bad input."""
    parser = argparse.ArgumentParser(prog=f"liepos {module.__name__.rsplit('.', 1)[-1]}", exit_on_error=False)
    module.configure(parser)
    try:
        return module.run(parser.parse_args(list(argv))), ""
    except (UsageError, argparse.ArgumentError) as err:
        return 2, str(err)


def test_every_subcommand_module_follows_the_contract():
    for module in (plot_cli, tour_cli):
        assert isinstance(module.HELP, str) and "\n" not in module.HELP
        assert module.EXAMPLES and all(e.startswith(f"liepos {module.__name__.rsplit('.', 1)[-1]}") for e in module.EXAMPLES)


def test_plot_writes_png_and_json(tmp_path):
    out, js = tmp_path / "spectrum.png", tmp_path / "spectrum.json"
    assert cli(plot_cli, "spectrum", "--out", str(out), "--json", str(js), "--dpi", "40") == (0, "")
    assert out.read_bytes()[:8] == PNG
    data = json.loads(js.read_text())
    assert "rope" in data["entries"]


def test_plot_writes_svg_for_an_svg_file(tmp_path):
    out = tmp_path / "fate.svg"
    assert cli(plot_cli, "fate", "--out", str(out))[0] == 0
    text = out.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text


@pytest.mark.slow  # the lane keeps the plot in test_plot_writes_png_and_json
def test_plot_passes_its_flags_to_the_figure(tmp_path):
    js = tmp_path / "s.json"
    assert cli(plot_cli, "scaling", "--factor", "4", "--base", "10000", "--out", str(tmp_path / "s.png"),
               "--json", str(js), "--dpi", "30")[0] == 0
    d = json.loads(js.read_text())
    assert (d["factor"], d["base"]) == (4.0, 10000.0)
    assert cli(plot_cli, "clocks", "--base", "1000", "--out", str(tmp_path / "c.png"), "--json", str(js), "--dpi", "30")[0] == 0
    assert json.loads(js.read_text())["bases"] == [1000.0]


@pytest.mark.parametrize("argv,needle", [
    (["spectrum", "--out", "{tmp}"], "is a folder"),
    (["spectrum", "--out", "{file}/x.png"], "{file}"),
    (["spectrum", "--out", "{tmp}/x.jpg"], "must end in .png or .svg"),
    (["clocks", "--dim", "-4", "--out", "{tmp}/x.png"], "must be >= 2, got -4"),
    (["clocks", "--dim", "7", "--out", "{tmp}/x.png"], "--dim must be even"),
    (["spectrum", "--dpi", "0", "--out", "{tmp}/x.png"], "must be >= 1, got 0"),
    (["spectrum", "--dpi", "100000", "--out", "{tmp}/x.png"], "must be <= 600, got 100000"),
    (["spectrum", "--factor", "4", "--out", "{tmp}/x.png"], "--factor is not a parameter of the 'spectrum' figure"),
    (["scaling", "--base", "nan", "--out", "{tmp}/x.png"], "must be finite"),
    (["no-such-figure", "--out", "{tmp}/x.png"], "invalid choice"),
])
def test_plot_refuses_bad_input_by_name(tmp_path, argv, needle):
    afile = tmp_path / "a-file"
    afile.write_text("")
    subst = {"{tmp}": str(tmp_path), "{file}": str(afile)}
    argv = [next((a.replace(k, v) for k, v in subst.items() if k in a), a) for a in argv]
    needle = subst.get(needle, needle)
    status, message = cli(plot_cli, *argv)
    assert status == 2 and needle in message and "\n" not in message, message
    assert not list(tmp_path.glob("x.*")), "a refused call wrote a file"


def test_figure_api_refuses_unknown_kinds_and_parameters():
    with pytest.raises(ValueError, match="`kind` must be one of"):
        F.figure("nope-not-a-kind")
    with pytest.raises(ValueError, match="takes no parameter factor"):
        F.figure("spectrum", factor=2.0)
    with pytest.raises(ValueError, match="must end in .png or .svg"):
        F.save(F.figure("fate"), "x.pdf")


def test_plot_help_lists_every_kind():
    parser = argparse.ArgumentParser(prog="liepos plot")
    plot_cli.configure(parser)
    text = parser.format_help()
    for kind in F.KINDS:
        assert f"liepos plot {kind}" in text


@pytest.mark.parametrize("under_a_file", [False, True])
def test_tour_refuses_an_output_that_is_a_file_or_cannot_be_created(tmp_path, under_a_file):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    # the page (one file) under a file cannot be created; a folder (--folder) where a file is, is refused
    target, form = (afile / "sub.html", []) if under_a_file else (afile, ["--folder"])
    status, message = cli(tour_cli, *form, "--out", str(target), "--quiet")
    assert status == 2 and f"'{afile}' is a file, not a folder" in message, message


def test_tour_refuses_bad_dpi(tmp_path):
    assert cli(tour_cli, "--dpi", "0", "--out", str(tmp_path))[0] == 2
    assert "<= 600" in cli(tour_cli, "--dpi", "100000", "--out", str(tmp_path))[1]


def test_tour_open_without_a_browser_says_so_before_any_work(tmp_path):
    """No $BROWSER, no display, no console browser on PATH: `--open` is refused at once, by name."""
    env = {"PATH": os.path.dirname(sys.executable), "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": str(tmp_path)}
    code = ("import argparse, sys; from liepos.cli import tour as t; from liepos.cli._common import UsageError\n"
            "p = argparse.ArgumentParser(); t.configure(p)\n"
            "try: t.run(p.parse_args(sys.argv[1:]))\n"
            "except UsageError as e: print(e); sys.exit(2)\n")
    r = subprocess.run([sys.executable, "-c", code, "--open", "--out", str(tmp_path / "t")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no web browser found" in r.stdout, (r.stdout, r.stderr)
    assert not (tmp_path / "t" / "index.html").exists()
