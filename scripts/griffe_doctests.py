r"""A griffe extension for the API reference: bare doctests in a docstring become ``pycon`` code blocks.

liepos's docstrings carry doctests that check their identity (``>>> …`` and the expected output) inside
the description, not only under an ``Examples:`` heading. Markdown would read them as a block quote and
their output (``[1.0, 0.3162, 0.1]``) as a link; fenced, they render as the code they are.

>>> fence("Text.\n\n>>> 1 + 1\n2\n\nMore.").splitlines()
['Text.', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'More.']
"""

from __future__ import annotations

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
