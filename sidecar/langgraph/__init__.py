"""ckpt as LangGraph's checkpointer: ``CkptSaver`` and ``AsyncCkptSaver`` (see docs/langgraph.md).

Needs LangGraph's checkpoint package: ``pip install 'ckpt-sidecar[langgraph]'``.
"""

try:
    import langgraph.checkpoint.base  # noqa: F401
except ImportError as exc:  # the extra is optional: say which one, not only what is missing
    raise ImportError(
        f"ckpt.sidecar.langgraph needs LangGraph's checkpoint package ({exc}): pip install 'ckpt-sidecar[langgraph]'"
    ) from exc

from .heads import CheckpointConflictError
from .savers import AsyncCkptSaver, CkptSaver

__all__ = ["AsyncCkptSaver", "CheckpointConflictError", "CkptSaver"]
