"""aiayn: the original Transformer (Vaswani et al. 2017), readable and complete.

``Transformer`` and ``TransformerConfig`` are imported on first use (PEP 562), not with the
package: importing torch takes about a second, and the ``aiayn`` command imports this
package before its ``main()`` can turn a Ctrl-C in that second into one line.
"""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import TYPE_CHECKING

__all__ = ["Transformer", "TransformerConfig"]
__version__ = "0.1.0"

_LAZY = {"Transformer": "aiayn.model.transformer", "TransformerConfig": "aiayn.config"}

if TYPE_CHECKING:  # mypy sees the names as imported, and still flags any other name
    from aiayn.config import TransformerConfig
    from aiayn.model.transformer import Transformer
else:

    def __getattr__(name: str) -> object:
        if name in _LAZY:
            value = getattr(import_module(_LAZY[name]), name)
            globals()[name] = value  # the next look-up finds it without coming here
            return value
        # A subpackage (`import aiayn; aiayn.decode.greedy`), as the eager imports made
        # `aiayn.config` and `aiayn.model` before.
        if name.isidentifier() and not name.startswith("_") and find_spec(f"{__name__}.{name}"):
            return import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})
