"""The map of ARCHITECTURE.md, enforced: every import of every module of src/liepos (top-level, inside
functions, and ``importlib.import_module`` of a constant name) is read with ``ast``; there is no cycle,
no module imports a higher layer, the data path from ``Encoding.query`` to the kernels only goes down,
no module passes 800 lines and no function 80 lines outside a short list of numerical kernels; no module
of the package imports the facade, none uses another's private name, what one imports of another is in
that one's ``__all__``, and the page's layer table is ``LAYERS`` row for row."""

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
KERNELS: set[str] = {"liepos._jordan_numeric._numeric_path"}


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
            names = [f"{base}.{a.name}" for a in node.names]
            if any(n not in MODULES for n in names):  # a name of the package itself, not only its submodules
                names.append(base)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        elif path.name == "__init__.py" and isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if re.fullmatch(r"liepos(\.\w+)+", node.value) else []  # a package's lazy table
        for n in names:
            if n.split(".")[0] != "liepos":
                continue
            # `from liepos.a import b`: b is a module when liepos/a/b.py exists, else a name in liepos.a
            target = _resolve(n)
            if target is not None and target != module:
                out.add(target)
    return out


GRAPH = {m: _imports(m) for m in MODULES}

# the layers of ARCHITECTURE.md, lowest first; a module may import its own layer or lower ones
LAYERS: list[tuple[str, ...]] = [
    ("liepos._checks", "liepos._progress", "liepos._angles", "liepos._version", "liepos.structure"),
    ("liepos._jordan_form", "liepos._jordan_numeric", "liepos._jordan", "liepos.generator"),
    ("liepos.classification", "liepos.tables"),
    ("liepos.apply",),
    ("liepos._pages", "liepos._fast", "liepos._kernels", "liepos._triton", "liepos._replay"),
    ("liepos.encoding", "liepos._graph"),
    ("liepos.catalogue", "liepos.scaling", "liepos.nn", "liepos.coordinates", "liepos._graph_key"),
    ("liepos.cache", "liepos.masks", "liepos.recentre", "liepos.origin_budget", "liepos.causal_tiling",
     "liepos.recentred_kernel", "liepos.faded_keys", "liepos.lag_bias", "liepos.key_windows", "liepos.attention_call",
     "liepos.attention_sdpa", "liepos.attention_pieces", "liepos.temperature", "liepos.attention_flex"),
    ("liepos.attend", "liepos.attention_graph", "liepos.per_request"),
    ("liepos.diagnosis",),
    ("liepos.interop",),
    ("liepos.schedule",),
    ("liepos.explore", "liepos.tour"),
    ("liepos.cli", "liepos.explore.__main__"),
    ("liepos",),
]


def layer_of(module: str) -> int:
    """The layer of the longest member naming ``module`` or a package above it; the facade ``liepos``
    (``__init__.py``) names itself only, so a new module is in no layer until it is placed."""
    best, where = -1, None
    for i, members in enumerate(LAYERS):
        for m in members:
            if (module == m or (m != "liepos" and module.startswith(m + "."))) and len(m) > best:
                best, where = len(m), i
    if where is None:
        raise AssertionError(f"{module} is in no layer of ARCHITECTURE.md: add it to LAYERS and the page")
    return where


def _page_layers(text: str) -> list[tuple[str, ...]]:
    """The layer table of ARCHITECTURE.md: row ``| i | `a`, `b/`, `c/__main__` | … |`` -> ``("liepos.a", …)``
    (``__init__`` is the facade ``liepos``; a trailing ``/`` marks a package)."""
    rows: list[tuple[str, ...]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[1].isdigit():
            assert int(cells[1]) == len(rows), f"ARCHITECTURE.md: layer row {cells[1]} out of order"
            names = re.findall(r"`([^`]+)`", cells[2])
            rows.append(tuple("liepos" if n == "__init__" else "liepos." + n.rstrip("/").replace("/", ".")
                              for n in names))
    return rows


def test_architecture_page_names_every_layer():
    """The page's layer table is LAYERS, row for row and module for module, in the same order."""
    page = _page_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(page) == len(LAYERS), f"ARCHITECTURE.md has {len(page)} layers, LAYERS {len(LAYERS)}"
    for i, (written, code) in enumerate(zip(page, LAYERS)):
        assert written == code, f"layer {i}: ARCHITECTURE.md lists {written}, LAYERS {code}"


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
    assert GRAPH["liepos._fast"] <= {"liepos.tables", "liepos.apply", "liepos._kernels", "liepos._triton",
                                     "liepos._pages"}, GRAPH["liepos._fast"]
    # the compiled kernels import torch and the page policy of fresh outputs only, which imports torch only
    assert GRAPH["liepos._kernels"] <= {"liepos._pages"}, GRAPH["liepos._kernels"]
    assert not GRAPH["liepos._pages"], GRAPH["liepos._pages"]
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


# ---------------------------------------------------------------------- the facade and private names
def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _base(module: str, node: ast.ImportFrom) -> str:
    """The absolute module of ``from <base> import …`` written in ``module`` (relative forms resolved)."""
    base = node.module or ""
    if node.level:
        up = _package(module).split(".")
        base = ".".join(up[: len(up) - node.level + 1] + ([base] if base else []))
    return base


def facade_imports(module: str, tree: ast.AST) -> list[str]:
    """Each import of the facade in ``module``: ``import liepos [as lp]``, ``from liepos import <name>`` where
    ``liepos.<name>`` is not a submodule, ``importlib.import_module("liepos")``."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"line {node.lineno}: import liepos" for a in node.names if a.name == "liepos"]
        elif isinstance(node, ast.ImportFrom) and _base(module, node) == "liepos":
            out += [f"line {node.lineno}: from liepos import {a.name}" for a in node.names if f"liepos.{a.name}" not in MODULES]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            out += [f"line {node.lineno}: import_module('liepos')" for a in node.args
                    if isinstance(a, ast.Constant) and a.value == "liepos"]
    return out


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; ``importlib.import_module("liepos.x").c`` -> ``["liepos.x", "c"]``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return [node.args[0].value, *reversed(parts)]
    return None


def _module_aliases(module: str, tree: ast.AST) -> dict[str, str]:
    """Local name -> the liepos module it is bound to (``import liepos.x as m``, ``from liepos import x``, ``m =
    importlib.import_module("liepos.x")``; a bare ``import liepos.x`` binds ``liepos``)."""
    alias: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "liepos":
                    alias[a.asname or "liepos"] = a.name if a.asname else "liepos"
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, node)
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    alias[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            d = _dotted(node.value) if isinstance(node.value, ast.Call) else None
            if d and d[0] in MODULES and len(d) == 1:
                alias[node.targets[0].id] = d[0]
    return alias


def private_crossings(module: str, tree: ast.AST) -> list[str]:
    """Each private name (``_x``, not a dunder, not a private submodule) of another liepos module that
    ``module`` imports (``from liepos.a import _x``) or reads (``a._x``, ``liepos.a._x``, ``getattr(a, "_x")``)."""
    alias = _module_aliases(module, tree)
    out: list[str] = []

    def check(owner: str, name: str, line: int) -> None:
        dunder = name.startswith("__") and name.endswith("__")
        if name.startswith("_") and not dunder and f"{owner}.{name}" not in MODULES and owner != module:
            out.append(f"line {line}: {owner}.{name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _base(module, node) in MODULES:
            for a in node.names:
                check(_base(module, node), a.name, node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            d = _dotted(node.args[0])
            if d:
                node = ast.Attribute(value=node.args[0], attr=node.args[1].value, lineno=node.lineno)
        if isinstance(node, ast.Attribute) and (d := _dotted(node)):
            parts = alias[d[0]].split(".") + d[1:] if d[0] in alias else d[0].split(".") + d[1:]
            # the longest prefix that is a module owns the name after it
            for i in range(len(parts) - 1, 0, -1):
                if ".".join(parts[:i]) in MODULES:
                    if i == len(parts) - 1:
                        check(".".join(parts[:i]), parts[i], node.lineno)
                    break
    return out


def _trees():
    for m, path in MODULES.items():
        yield m, ast.parse(path.read_text(encoding="utf-8"))


def test_the_facade_is_never_imported_from_inside_the_package():
    """Only ``__init__.py`` is the facade; every other module imports a name from the module that owns it
    (a submodule, ``from liepos import scaling``, is no facade import)."""
    bad = [f"{m} {hit}" for m, tree in _trees() if m != "liepos" for hit in facade_imports(m, tree)]
    assert not bad, "\n".join(bad)


def test_no_private_name_crosses_modules():
    """What one module uses of another is that module's public API (private modules such as ``liepos._fast``
    included: their public names); tests may read internals, the package may not."""
    bad = [f"{m} {hit}" for m, tree in _trees() for hit in private_crossings(m, tree)]
    assert not bad, "\n".join(bad)


def _exports(tree: ast.Module) -> set[str] | None:
    """The names of a module's literal ``__all__``, or None where it has none."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def test_what_a_module_imports_of_another_is_in_its_all():
    """A module with an ``__all__`` lists there every name another module of the package imports from it."""
    trees = dict(_trees())
    exports = {m: _exports(tree) for m, tree in trees.items()}
    bad = []
    for m, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (base := _base(m, node)) in MODULES and base != m \
                    and exports[base] is not None:
                bad += [f"{m} imports {base}.{a.name}, not in its __all__" for a in node.names
                        if f"{base}.{a.name}" not in MODULES and a.name not in exports[base]]
    assert not bad, "\n".join(bad)


def test_the_two_checks_see_each_form():
    """The checkers on code that breaks the rules in every form they look for (and on allowed forms)."""
    src = """
import liepos
import liepos as lp
import liepos._fast
import liepos._graph as G
from liepos import rope, scaling, _fast
from liepos._fast import _window, apply_fast, TableCache
from liepos.recentre import _poly_span as span
import importlib
R = importlib.import_module("liepos.recentre")

def f():
    liepos._fast._arange_start(x)
    G._encoding(k)
    _fast._empty(x, 1, d)
    R._within(t)
    importlib.import_module("liepos").rope
    getattr(G, "_constant")
    scaling.map_spectrum(e, g)
    G.__name__
"""
    tree = ast.parse(src)
    facade = facade_imports("liepos.tour.page", tree)
    assert [h.split(": ", 1)[1] for h in facade] == [
        "import liepos", "import liepos", "from liepos import rope", "import_module('liepos')"], facade
    private = sorted(h.split(": ", 1)[1] for h in private_crossings("liepos.tour.page", tree))
    assert private == sorted(["liepos._fast._window", "liepos.recentre._poly_span", "liepos._fast._arange_start",
                              "liepos._graph._encoding", "liepos._fast._empty", "liepos.recentre._within",
                              "liepos._graph._constant"]), private
    assert not private_crossings("liepos._fast", ast.parse("from liepos._fast import _window"))  # its own names
