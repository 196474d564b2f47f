"""A mutation run over liepos's core modules: does the fast test lane notice a wrong line?

Each *mutant* is the module with one classic change, generated from its syntax tree (``ast``):

- a comparison flipped (``<`` ↔ ``<=``, ``>`` ↔ ``>=``, ``==`` ↔ ``!=``, ``is`` ↔ ``is not``, ``in`` ↔ ``not in``);
- an arithmetic operator swapped (``+`` ↔ ``-``, ``*`` ↔ ``/``, ``//`` → ``/``, ``%`` → ``/``, ``**`` → ``*``,
  ``<<`` ↔ ``>>``, ``&`` ↔ ``|``, ``^`` → ``&``), also in augmented assignments;
- ``and`` ↔ ``or``; a ``not`` or a unary minus dropped;
- a number off by one (``n`` → ``n + 1``), ``True`` ↔ ``False``;
- a check removed: a ``raise`` replaced by ``pass``, an early ``return`` inside an ``if`` replaced by ``pass``;
  ``break`` ↔ ``continue``.

Strings (docstrings, messages), annotations, ``__all__`` and f-strings are never mutated. The mutant replaces
the module in a temporary copy of ``src/`` and the module's *targeted* test files (:data:`TARGETS`, the fast
lane: ``-m "not slow"``) run against that copy with ``-x -q`` and a timeout (three times the unmutated run plus
30 s). A mutant is **killed** when the tests fail (any non-zero exit: a failed assertion, an error at import),
**survived** when they pass, **timeout** when they hang (counted as killed, as mutmut does). When a module has
more mutants than ``--sample``, a seeded random sample of them runs (``random.Random(seed).sample``).

A surviving mutant that cannot change any output is *equivalent*; the reasons are kept in
``benchmarks/results/mutation/equivalent.json`` (by module, keyed by the mutant's signature
``function: original -> mutated #occurrence``, stable when other lines move) and shown in the report.

Writes ``benchmarks/results/mutation/<module>.json`` and ``.md``. Run (one core, in the background)::

    OMP_NUM_THREADS=1 python benchmarks/mutation.py _angles --sample 40 --seed 2026
    python benchmarks/mutation.py _angles --list              # every mutant with its id, nothing runs
    python benchmarks/mutation.py _angles --only 12 31        # re-run two mutants (after a new test)
    python benchmarks/mutation.py faded_keys --from recentre --report   # results that moved with their code
    python benchmarks/mutation.py --summary                   # the score over every module's last results

Results follow the code: a re-run (``--only``, ``--report``) keeps the earlier results whose signature is
still a mutant of the module, and counts the others as *moved* (their signature is now a mutant of another
module of :data:`TARGETS`, where ``--from`` picks them up) or *gone* (the code they changed is no more);
neither is counted in the score.
"""

from __future__ import annotations

import argparse
import ast
import copy
import datetime
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "liepos"
RESULTS = ROOT / "benchmarks" / "results" / "mutation"

# the fast, targeted test files of each core module (a mutant costs seconds, not the whole suite)
TARGETS: dict[str, list[str]] = {
    "_angles": ["tests/test_angles.py"],
    "tables": ["tests/test_tables.py", "tests/test_core_inputs.py", "tests/test_angles.py", "tests/test_algebra.py",
               "tests/test_jordan.py"],
    "_fast": ["tests/test_fast.py"],
    "recentre": ["tests/test_recentre.py", "tests/test_window_safety.py", "tests/test_attention.py"],
    # the re-centred path's parts, cut out of recentre (their results before the cut are under recentre)
    **dict.fromkeys(["origin_budget", "causal_tiling", "faded_keys", "lag_bias", "key_windows"],
                    ["tests/test_recentre.py", "tests/test_window_safety.py", "tests/test_attention.py"]),
    "encoding": ["tests/test_encoding.py", "tests/test_algebra.py", "tests/test_core_inputs.py"],
    # lp.attention's module (its results before the module's rename are under attention)
    "attend": ["tests/test_attention_edges.py", "tests/test_attention.py", "tests/test_oracle.py",
               "tests/test_sinks.py"],
    # tests/test_attention_fused.py (about 3 minutes on 2 loaded cores) is too slow to run per mutant; the
    # clearing of entries no score can see is tested with the subnormal counts
    "attention_pieces": ["tests/test_attention_edges.py", "tests/test_attention.py", "tests/test_sinks.py",
                         "tests/test_subnormal.py"],
    "attention_call": ["tests/test_attention_edges.py", "tests/test_attention.py", "tests/test_sinks.py"],
    # the one call into SDPA: its sinks, its edges and its select-masked form for non-finite keys
    "attention_sdpa": ["tests/test_attention.py", "tests/test_sinks.py", "tests/test_attention_edges.py",
                       "tests/test_attention_inputs.py"],
    "attention_graph": ["tests/test_compile_attention.py"],
    "attention_flex": ["tests/test_attention_flex.py"],
}

_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
           ast.Mod: ast.Div, ast.Pow: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
           ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitAnd}


@dataclass
class Mutant:
    """One change: the bytes ``[start, end)`` of the module replaced by ``text``."""

    id: int
    line: int
    function: str
    kind: str
    original: str
    mutated: str
    start: int
    end: int
    text: str
    signature: str = ""
    status: str = "not run"
    seconds: float = 0.0
    detail: str = ""
    after: str = ""  # the mutated line
    before: str = ""  # the result of an earlier run (``--only``), before the tests that were added since


class _Finder(ast.NodeVisitor):
    """Walks a module and records every mutation point (skipping strings, annotations, ``__all__``)."""

    def __init__(self, source: bytes):
        self.source = source
        self.offsets = [0]
        for line in source.splitlines(keepends=True):
            self.offsets.append(self.offsets[-1] + len(line))
        self.scope: list[str] = []
        self.found: list[tuple[ast.AST, str, str, str]] = []  # (node, kind, replacement text, function)

    def _at(self, line: int, col: int) -> int:
        return self.offsets[line - 1] + col

    def segment(self, node: ast.AST) -> tuple[int, int]:
        return self._at(node.lineno, node.col_offset), self._at(node.end_lineno, node.end_col_offset)

    def _add(self, node: ast.AST, kind: str, text: str) -> None:
        self.found.append((node, kind, text, ".".join(self.scope) or "<module>"))

    def _scoped(self, node) -> None:
        for d in node.decorator_list:
            self.visit(d)
        if not isinstance(node, ast.ClassDef):
            for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                self.visit(d)
        self.scope.append(node.name)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]  # the docstring
        for stmt in body:
            self.visit(stmt)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        for stmt in node.body:
            if isinstance(stmt, ast.Return):
                self._add(stmt, "early return removed", "pass")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for i, op in enumerate(node.ops):
            if type(op) in _COMPARE:
                m = copy.deepcopy(node)
                m.ops[i] = _COMPARE[type(op)]()
                self._add(node, "comparison", f"({ast.unparse(m)})")
        self.generic_visit(node)

    def _swap_operator(self, node: ast.BinOp | ast.AugAssign, form: str) -> None:
        if type(node.op) in _BINARY:
            m = copy.deepcopy(node)
            m.op = _BINARY[type(node.op)]()
            self._add(node, "operator", form.format(ast.unparse(m)))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self._swap_operator(node, "({})")  # an expression: parenthesised in place

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._swap_operator(node, "{}")  # a statement

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        m = copy.deepcopy(node)
        m.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self._add(node, "and/or", f"({ast.unparse(m)})")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, (ast.Not, ast.USub)):
            self._add(node, "unary dropped", f"({ast.unparse(node.operand)})")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        v = node.value
        if isinstance(v, bool):
            self._add(node, "constant", repr(not v))
        elif isinstance(v, (int, float)):
            self._add(node, "constant", f"({v + 1!r})")

    def visit_Raise(self, node: ast.Raise) -> None:
        self._add(node, "raise removed", "pass")
        self.generic_visit(node)

    def visit_Break(self, node: ast.Break) -> None:
        self._add(node, "break/continue", "continue")

    def visit_Continue(self, node: ast.Continue) -> None:
        self._add(node, "break/continue", "break")


def find_mutants(source: bytes) -> list[Mutant]:
    """Every mutant of ``source``, in order of position; each compiles (the others are dropped)."""
    finder = _Finder(source)
    finder.visit(ast.parse(source))
    found = sorted(finder.found, key=lambda f: (finder.segment(f[0]), f[1], f[2]))
    mutants, seen = [], {}
    for node, kind, text, function in found:
        start, end = finder.segment(node)
        original = source[start:end].decode()
        mutated = source[:start] + text.encode() + source[end:]
        try:
            compile(mutated, "<mutant>", "exec")
        except SyntaxError:
            continue
        first = " ".join(original.split())
        short = first if len(first) <= 90 else first[:87] + "..."
        key = f"{function}: {short} -> {text}"
        seen[key] = seen.get(key, 0) + 1
        line = source[:start].count(b"\n") + 1
        after = mutated.decode().splitlines()[line - 1].strip()
        mutants.append(Mutant(len(mutants), line, function, kind, short, text, start, end, text,
                              signature=f"{key} #{seen[key]}", after=after if len(after) <= 120 else after[:117] + "..."))
    return mutants


def _run_tests(src: Path, tests: list[str], timeout: float) -> tuple[str, float, str]:
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", time.perf_counter() - t0, f"over {timeout:.0f} s"
    dt = time.perf_counter() - t0
    lines = [ln for ln in out.splitlines() if ln.strip()]
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    detail = (failed[0] if failed else (lines[-1] if lines else ""))[:200]
    return ("survived" if proc.returncode == 0 else "killed"), dt, f"rc={proc.returncode} {detail}"


def _copy_src(tmp: Path, module: str) -> Path:
    src = tmp / "src"
    shutil.copytree(ROOT / "src", src, symlinks=True)  # copy2: the .pyc of the other modules stay valid
    for pyc in (src / "liepos" / "__pycache__").glob(f"{module}.*.pyc"):
        pyc.unlink()
    probe = subprocess.run([sys.executable, "-c", "import liepos; print(liepos.__file__)"], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=str(src)), cwd=ROOT, check=True)
    if not probe.stdout.strip().startswith(str(src)):
        raise RuntimeError(f"the mutated copy is not the one imported: liepos from {probe.stdout.strip()!r}")
    return src


def _moved(signatures: list[str], module: str) -> dict[str, int]:
    """How many of these signatures are now mutants of each other module of TARGETS (code that moved)."""
    # a module-level signature ("<module>: 2.0 -> (3.0)") names no function: it does not move with its code
    left, out = {s for s in signatures if not s.startswith("<module>:")}, {}
    for other in sorted(TARGETS):
        path = PACKAGE / f"{other}.py"
        if other == module or not left or not path.exists():
            continue
        found = left & {m.signature for m in find_mutants(path.read_bytes())}
        if found:
            out[other] = len(found)
            left -= found
    return out


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _report(module: str, info: dict, mutants: list[Mutant], equivalent: dict) -> None:
    ran = [m for m in mutants if m.status != "not run"]
    killed = [m for m in ran if m.status in ("killed", "timeout")]
    survived = [m for m in ran if m.status == "survived"]
    eq = [m for m in survived if m.signature in equivalent]
    first = [m.before or m.status for m in ran]
    info["killed_before_new_tests"] = sum(s in ("killed", "timeout") for s in first)
    info.update(ran=len(ran), killed=len(killed), survived=len(survived), equivalent=len(eq),
                score=round(len(killed) / max(len(ran), 1), 4),
                score_without_equivalent=round(len(killed) / max(len(ran) - len(eq), 1), 4))
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = [asdict(m) | {"equivalent": equivalent.get(m.signature, "")} for m in ran]
    for r in rows:
        del r["start"], r["end"], r["text"]
    (RESULTS / f"{module}.json").write_text(json.dumps({"run": info, "mutants": rows}, indent=1) + "\n")
    lines = [f"# Mutation run: `liepos.{module}`", "",
             f"{info['date']} on {info['machine']}; tests: {', '.join(f'`{t}`' for t in info['tests'])} "
             f"(`-m 'not slow' -x`), timeout {info['timeout_s']} s; {info['total']} mutants, "
             f"sample {info['sample']} (seed {info['seed']}).", "",
             f"**Killed {len(killed)} / {len(ran)} ({100 * info['score']:.1f} %)**; survived {len(survived)}, "
             f"of which {len(eq)} equivalent (score over the non-equivalent: "
             f"{100 * info['score_without_equivalent']:.1f} %). Before the tests written for the survivors: "
             f"{info['killed_before_new_tests']} / {len(ran)} killed"
             + (f" (that first run with {', '.join(f'`{t}`' for t in info['first_run_tests'])} only; the new test "
                f"files were written for the survivors)" if info.get("first_run_tests") else "") + "."
             + (f" These mutants were sampled from `liepos.{info['moved_from']}` before their code moved here."
                if info.get("moved_from") else "")
             + (f" Of the first sample, not counted here: {', '.join(f'{n} moved to `{k}`' for k, n in info['moved'].items())}"
                f"{', ' if info.get('moved') and info.get('gone') else ''}"
                f"{str(info['gone']) + ' gone (the code they changed is no more)' if info.get('gone') else ''}."
                if info.get("moved") or info.get("gone") else ""), "",
             "| id | line | function | mutation | result | first run | seconds | equivalent because |",
             "|---|---|---|---|---|---|---|---|"]
    for m in ran:
        change = f"`{m.original}` → `{m.mutated}`: `{m.after}`".replace("|", "\\|")
        why = equivalent.get(m.signature, "").replace("|", "\\|")
        lines.append(f"| {m.id} | {m.line} | `{m.function}` | {change} | {m.status} | {m.before or m.status} "
                     f"| {m.seconds:.1f} | {why} |")
    (RESULTS / f"{module}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module", nargs="?", choices=sorted(TARGETS))
    ap.add_argument("--sample", type=int, default=40, help="mutants to run (a seeded random sample); 0: all")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--tests", nargs="+", help="test files (default: the module's targeted files)")
    ap.add_argument("--only", type=int, nargs="+", help="re-run these mutant ids, keeping the other results")
    ap.add_argument("--list", action="store_true", help="print every mutant and exit")
    ap.add_argument("--report", action="store_true", help="rewrite the report from the last results (equivalents)")
    ap.add_argument("--from", dest="origin", choices=sorted(TARGETS) + ["attention"],
                    help="with --only/--report: take the earlier results from this module's file (code that moved)")
    ap.add_argument("--summary", action="store_true",
                    help="the table of every module's last results and the overall score (summary.md); nothing runs")
    args = ap.parse_args(argv)
    if args.summary:
        return _summary()
    if args.module is None:
        ap.error("a module is needed (or --summary)")
    path = PACKAGE / f"{args.module}.py"
    source = path.read_bytes()
    mutants = find_mutants(source)
    if args.list:
        for m in mutants:
            print(f"{m.id:4d} {m.line:4d} {m.kind:20s} {m.signature}")
        return 0
    tests = args.tests or TARGETS[args.module]
    if args.origin and not (args.only or args.report):
        ap.error("--from goes with --only or --report")
    old = _load(RESULTS / f"{args.origin or args.module}.json")
    equivalent = _load(RESULTS / "equivalent.json").get(args.module, {})
    if args.only or args.report:
        chosen = sorted(args.only or [])
        done = {r["signature"]: r for r in old.get("mutants", [])}
        here = {m.signature for m in mutants}
        left = [s for s in done if s not in here]
        run = old.setdefault("run", {})
        if args.origin:  # the others of that sample are counted in its own module's report
            run.update(moved_from=args.origin, moved={}, gone=0)
        else:  # added to what earlier re-runs counted
            moved = _moved(left, args.module)
            run["moved"] = {k: run.get("moved", {}).get(k, 0) + moved.get(k, 0)
                            for k in sorted({*run.get("moved", {}), *moved})}
            run["gone"] = run.get("gone", 0) + len(left) - sum(moved.values())
        run["sample"] = sum(s in here for s in done)
        for m in mutants:
            r = done.get(m.signature)
            if r is not None and m.id not in chosen:
                m.status, m.seconds, m.detail, m.before = r["status"], r["seconds"], r["detail"], r.get("before", "")
            elif r is not None:
                m.before = r.get("before") or r["status"]
    else:
        n = len(mutants) if args.sample <= 0 else min(args.sample, len(mutants))
        chosen = sorted(random.Random(args.seed).sample(range(len(mutants)), n))
    timeout = old.get("run", {}).get("timeout_s", 0)
    with tempfile.TemporaryDirectory(prefix="liepos-mutation-") as tmp:
        if not chosen:
            return _finish(args, old, mutants, tests, chosen, timeout, equivalent)
        src = _copy_src(Path(tmp), args.module)
        target = src / "liepos" / f"{args.module}.py"
        status, base, detail = _run_tests(src, tests, 600)
        if status != "survived":
            raise SystemExit(f"the unmutated tests do not pass ({detail}): no mutation run")
        timeout = round(3 * base + 30)
        print(f"{args.module}: {len(mutants)} mutants, running {len(chosen)}; unmutated tests {base:.1f} s", flush=True)
        for k, i in enumerate(chosen):
            m = mutants[i]
            target.write_bytes(source[:m.start] + m.text.encode() + source[m.end:])
            m.status, m.seconds, m.detail = _run_tests(src, tests, timeout)
            print(f"[{k + 1}/{len(chosen)}] #{m.id} line {m.line} {m.signature}: {m.status} ({m.seconds:.1f} s)",
                  flush=True)
        target.write_bytes(source)
    return _finish(args, old, mutants, tests, chosen, timeout, equivalent)


def _summary() -> int:
    """Killed / sampled per module and over all of them (equivalent survivors count as survived)."""
    rows, total = [], dict(ran=0, killed=0, survived=0, equivalent=0, killed_before_new_tests=0)
    for module in sorted(TARGETS):
        run = _load(RESULTS / f"{module}.json").get("run")
        if not run or not run.get("ran"):
            continue
        for key in total:
            total[key] += run[key]
        rows.append(f"| `{module}` | {run['ran']} of {run['total']} | {run['killed']} ({100 * run['score']:.0f} %) | "
                    f"{run['survived']} | {run['equivalent']} | {run['killed_before_new_tests']} | {run['date']} |")
    score = total["killed"] / max(total["ran"], 1)
    lines = ["| module | sampled | killed | survived | of them equivalent | killed before the new tests | run |",
             "|---|---|---|---|---|---|---|", *rows,
             f"| **all** | {total['ran']} | **{total['killed']} ({100 * score:.1f} %)** | {total['survived']} | "
             f"{total['equivalent']} | {total['killed_before_new_tests']} | |"]
    text = "\n".join(lines) + "\n"
    (RESULTS / "summary.md").write_text(text)
    print(text, end="")
    return 0


def _finish(args, old: dict, mutants: list[Mutant], tests: list[str], chosen: list[int], timeout: float,
            equivalent: dict) -> int:
    again = bool(args.only or args.report)
    info = dict(old.get("run", {})) if again else {}
    info.update(module=args.module, tests=tests, total=len(mutants), seed=old.get("run", {}).get("seed", args.seed)
                if again else args.seed, sample=info.get("sample", len(chosen)) if again else len(chosen),
                timeout_s=timeout, date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                machine=f"{platform.machine()}, {os.cpu_count()} cores (load {os.getloadavg()[0]:.1f}), "
                        f"OMP_NUM_THREADS=1")
    if not chosen:  # --report: the date and machine of the last run stay
        info.update({k: old["run"][k] for k in ("date", "machine", "timeout_s") if k in old.get("run", {})})
    _report(args.module, info, mutants, equivalent)
    print(f"killed {info['killed']} / {info['ran']} ({100 * info['score']:.1f} %), survived {info['survived']}, "
          f"equivalent {info['equivalent']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
