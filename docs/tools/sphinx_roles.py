"""A griffe extension (mkdocs.yml, mkdocstrings' `extensions`): the docstrings' Sphinx
roles, ``:class:`~aiayn.decode.DecodeOptions` `` and the like, shown as code
(`DecodeOptions`) instead of as raw text, since the site renders docstrings as Markdown."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``:func:`~a.b.c` `` -> `` `c` ``; ``:func:`a.b.c` `` -> `` `a.b.c` ``."""

    def code(m: re.Match[str]) -> str:
        name = m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)
        return f"`{name}`"

    return ROLE.sub(code, text)


class SphinxRoles(Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
