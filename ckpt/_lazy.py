"""Names a package imports from its modules when first used (PEP 562), for the packages whose import
must stay light: ``ckpt.codec`` (the configuration names ChainPolicy; no zstd for it), ``ckpt.sidecar``
(a client loads no store engine) and ``ckpt.sidecar.server`` (``ckpt serve`` starts its store process
before it loads grpc).

A package names each lazy name's module and binds the module attributes this returns::

    __getattr__, __dir__ = lazy_names(__name__, {"Store": ".store"})

with the same names imported under ``if TYPE_CHECKING:``, so that type checkers see them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names ``homes`` maps to the modules (relative
    to it) they are imported from on first use; each is then bound in the package, found there from then on."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        namespace[name] = value  # later lookups find it there, without this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return __getattr__, __dir__
