r"""Griffe extensions for the API reference: bare doctests become ``pycon`` code blocks (:class:`DoctestFences`),
Sphinx roles become links the reference resolves and ``a, b:`` parameter entries are split (:class:`SphinxRoles`).

liepos's docstrings carry doctests that check their identity (``>>> …`` and the expected output) inside
the description, not only under an ``Examples:`` heading. Markdown would read them as a block quote and
their output (``[1.0, 0.3162, 0.1]``) as a link; fenced, they render as the code they are.

>>> fence("Text.\n\n>>> 1 + 1\n2\n\nMore.").splitlines()
['Text.', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'More.']
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

FENCE = "```"


def fence(text: str) -> str:
    """``text`` with each run of doctest lines (a ``>>>`` line, its ``...`` lines and output) fenced.

    Lines already inside a fenced block are left as they are."""
    out: list[str] = []
    fenced = inside = False  # within a block fenced by the author / by us
    indent = ""
    for line in text.splitlines():
        stripped = line.lstrip()
        if not inside and stripped.startswith(FENCE):
            fenced = not fenced
        elif not fenced and not inside and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}{FENCE}pycon")
            inside = True
        elif inside and not stripped:
            out.append(f"{indent}{FENCE}")
            inside = False
        out.append(line)
    if inside:
        out.append(f"{indent}{FENCE}")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fence the bare doctests of every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence(obj.docstring.value)


# ---------------------------------------------------------------------- Sphinx roles -> links
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([\w.]+)(?:\(\))?`")
# the API pages' ``::: identifier`` lines: what the reference renders, so what a link can reach
API_PAGES = Path(__file__).resolve().parents[1] / "docs" / "api"


def rendered() -> list[str]:
    """The identifiers the API pages render (``::: liepos.X``), in page order."""
    out = []
    for page in sorted(API_PAGES.glob("*.md")):
        out += [ln.split(":::", 1)[1].strip() for ln in page.read_text(encoding="utf-8").splitlines()
                if ln.startswith(":::")]
    return out


def targets(roots: dict[str, Any]) -> dict[str, str]:
    """Every name a role may use -> the identifier the reference renders it under.

    ``roots`` maps each rendered identifier to its griffe object; its public members are rendered too
    (``Generator.exp``), and each is reachable by its short name, its dotted tail and its full path."""
    out: dict[str, str] = {}

    def add(ident: str, obj: Any, depth: int) -> None:
        parts = ident.split(".")
        for i in range(len(parts)):
            out.setdefault(".".join(parts[i:]), ident)
        for attr in ("path", "canonical_path"):
            try:
                out.setdefault(getattr(obj, attr), ident)
            except Exception:  # an alias of a name outside the package (an import): not rendered
                return
        if depth == 0:
            return
        try:
            members = obj.members
        except Exception:  # an alias that cannot be resolved: its members are not rendered
            return
        for name, member in members.items():
            if not name.startswith("_") and not (getattr(member, "is_alias", False) and obj.is_module):
                add(f"{ident}.{name}", member, depth - 1)

    for ident, obj in roots.items():
        add(ident, obj, 1 if obj.is_module else 2)
    return out


def link_roles(text: str, known: dict[str, str], scope: str = "") -> str:
    """``text`` with each Sphinx role written as mkdocs-autorefs reads it: a link where the reference
    renders the target (``[`Generator`][liepos.Generator]``), else as code.

    >>> link_roles("see :class:`~liepos.Encoding` and :func:`liepos._fast.x`", {"liepos.Encoding": "liepos.Encoding"})
    'see [`Encoding`][liepos.Encoding] and `liepos._fast.x`'
    """
    def one(m: re.Match) -> str:
        tilde, name = m.group(1), m.group(2)
        shown = name.rsplit(".", 1)[-1] if tilde else name
        for key in ([f"{scope}.{name}"] if scope else []) + [name, name.removeprefix("liepos.")]:
            if key in known:
                return f"[`{shown}`][{known[key]}]"
        return f"`{shown}`"

    return ROLE.sub(one, text)


def split_shared_params(text: str) -> str:
    """A Google-style ``a, b: what`` entry (two parameters at once) as ``a: what`` and ``b: as `a`.``, so
    the renderer finds each name in the signature (its type and its true default).

    >>> split_shared_params("Args:\\n    q, k: the inputs\\n        of shape (s,).\\n")
    'Args:\\n    q: the inputs\\n        of shape (s,).\\n    k: as `q`.\\n'
    """
    lines, out, pending = text.split("\n"), [], None
    for line in lines:
        m = re.match(r"^(\s+)(\w+), (\w+): (.*)$", line)
        if pending and not (line.startswith(pending[0] + " ") and line.strip()):
            out.append(f"{pending[0]}{pending[2]}: as `{pending[1]}`.")
            pending = None
        if m:
            out.append(f"{m.group(1)}{m.group(2)}: {m.group(4)}")
            pending = (m.group(1), m.group(2), m.group(3))
            continue
        out.append(line)
    if pending:
        out.append(f"{pending[0]}{pending[2]}: as `{pending[1]}`.")
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Turn the Sphinx roles of every rendered docstring into links the reference resolves, and split
    ``a, b:`` parameter entries, once the package is loaded."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        roots = {}
        for ident in rendered():
            path = ident.removeprefix(pkg.name).lstrip(".")
            try:
                roots[ident] = pkg[path] if path else pkg
            except KeyError:
                continue
        known = targets(roots)
        seen: set[int] = set()

        def walk(obj: Any, depth: int) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            try:
                target = obj.final_target if obj.is_alias else obj
            except Exception:
                return
            if target.docstring is not None:
                scope = target.path.rsplit(".", 1)[0] if target.is_function else target.path
                target.docstring.value = link_roles(split_shared_params(target.docstring.value), known,
                                                    _facade(scope, known))
            if depth:
                for name, member in target.members.items():
                    if not name.startswith("_") and not (member.is_alias and target.is_module):
                        walk(member, depth - 1)

        for obj in roots.values():
            walk(obj, 2)


def _facade(scope: str, known: dict[str, str]) -> str:
    """The rendered identifier of a canonical path's scope (``liepos.encoding.Encoding`` -> ``liepos.Encoding``)."""
    return known.get(scope, scope)
