"""The standard library's zstd API for the event log's modules: ``compression.zstd`` on 3.14+,
``backports.zstd`` (the same API) before."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 14):
    from compression import zstd
else:  # pragma: no cover - exercised on the interpreter CI runs
    from backports import zstd

__all__ = ["zstd"]
