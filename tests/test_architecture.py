"""The map of ARCHITECTURE.md, enforced: every import of every module of src/liepos (top-level, inside
functions, and ``importlib.import_module`` of a constant name) is read with ``ast``; there is no cycle,
no module imports a higher layer, the data path from ``Encoding.query`` to the kernels only goes down,
no module passes 800 lines and no function 80 lines outside a short list of numerical kernels."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "liepos"
ARCHITECTURE = Path(__file__).resolve().parents[1] / "ARCHITECTURE.md"

MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80
# numerical kernels allowed past MAX_FUNCTION_LINES (one pass written out for speed): none today
# numerical kernels allowed past the 80-line limit: one algorithm each, whose steps share their state
# (Schur form -> clustering -> reordering -> Jordan chains of each cluster)
KERNELS: set[str] = {"liepos._jordan._numeric_path"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The liepos module a dotted name refers to (its longest prefix that is a module), or None."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in MODULES:
            return cand
        parts.pop()
    return None


def _imports(module: str) -> set[str]:
    """Every liepos module that ``module`` imports, wherever the import statement sits."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        elif module == "liepos" and isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if re.fullmatch(r"liepos(\.\w+)+", node.value) else []  # the lazy table
        for n in names:
            if n.split(".")[0] != "liepos":
                continue
            # `from liepos.a import b`: b is a module when liepos/a/b.py exists, else a name in liepos.a
            target = _resolve(n)
            if target is not None and target != module:
                out.add(target)
    # `from liepos.a import b` also listed liepos.a itself; drop the package facade's self-reference
    return out


GRAPH = {m: _imports(m) for m in MODULES}

# the layers of ARCHITECTURE.md, lowest first; a module may import its own layer or lower ones
LAYERS: list[tuple[str, ...]] = [
    ("liepos._checks", "liepos._progress", "liepos._angles", "liepos.structure"),
    ("liepos._jordan", "liepos.generator"),
    ("liepos.classify", "liepos.tables"),
    ("liepos.apply",),
    ("liepos._fast", "liepos._kernels", "liepos._triton"),
    ("liepos.encoding", "liepos._graph"),
    ("liepos.catalogue", "liepos.scaling", "liepos.nn", "liepos.coordinates", "liepos._graph_key"),
    ("liepos.cache", "liepos.masks", "liepos.recentre", "liepos.attention_call", "liepos.attention_sdpa",
     "liepos.attention_pieces", "liepos.temperature", "liepos.attention_flex"),
    ("liepos.attention", "liepos.attention_graph", "liepos.per_request"),
    ("liepos", "liepos.schedule", "liepos.interop", "liepos.diagnose", "liepos.explore", "liepos.tour", "liepos.cli"),
]


def layer_of(module: str) -> int:
    best, where = -1, None
    for i, members in enumerate(LAYERS):
        for m in members:
            if (module == m or module.startswith(m + ".")) and len(m) > best:
                best, where = len(m), i
    if where is None:
        raise AssertionError(f"{module} is in no layer of ARCHITECTURE.md: add it to LAYERS and the page")
    return where


def test_architecture_page_names_every_layer():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    for members in LAYERS:
        for m in members:
            short = m.removeprefix("liepos.") if m != "liepos" else "__init__"
            assert short in text, f"ARCHITECTURE.md does not mention {short}"


def test_every_module_sits_in_a_layer():
    for m in MODULES:
        layer_of(m)


def test_no_import_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(GRAPH[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def test_no_module_imports_a_higher_layer():
    bad = [f"{m} (layer {layer_of(m)}) imports {n} (layer {layer_of(n)})"
           for m, deps in GRAPH.items() for n in sorted(deps) if layer_of(n) > layer_of(m)]
    assert not bad, "\n".join(bad)


def test_positions_only_go_down_from_the_encoding_to_the_kernels():
    assert GRAPH["liepos._fast"] <= {"liepos.tables", "liepos.apply", "liepos._kernels", "liepos._triton"}, GRAPH["liepos._fast"]
    assert not GRAPH["liepos._kernels"], GRAPH["liepos._kernels"]  # the compiled kernels import torch only
    assert not GRAPH["liepos._triton"], GRAPH["liepos._triton"]  # torch and (lazily) triton only
    assert GRAPH["liepos.apply"] <= {"liepos.tables", "liepos.generator", "liepos.structure"}, GRAPH["liepos.apply"]
    assert "liepos.encoding" not in GRAPH["liepos.tables"] | GRAPH["liepos.generator"]


def test_no_module_over_800_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, long


def _functions(module: str):
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


def test_no_function_over_80_lines_outside_the_kernels():
    long = {f"{m}.{name}": n for m in MODULES for name, n in _functions(m)
            if n > MAX_FUNCTION_LINES and f"{m}.{name}" not in KERNELS}
    assert not long, long


def test_the_kernel_list_is_current():
    for kernel in sorted(KERNELS):
        module, _, name = kernel.rpartition(".")
        assert any(n == name and length > MAX_FUNCTION_LINES for n, length in _functions(module)), kernel
