"""The standard library's zstd API, the one place its location is chosen: ``compression.zstd`` on 3.14+,
``backports.zstd`` (the same API) before. The codec's frames and the store's event log both use it."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 14):
    from compression import zstd
else:  # pragma: no cover - exercised on the interpreter CI runs
    from backports import zstd

__all__ = ["zstd"]
