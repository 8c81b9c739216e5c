"""The sidecar's collector settings hold while it serves and are undone after."""

from __future__ import annotations

import gc

import pytest

from ckpt.sidecar.server.gctune import SERVING_GEN0_THRESHOLD, serving_gc


def test_serving_gc_raises_the_young_threshold_and_freezes_then_restores() -> None:
    before = gc.get_threshold()
    assert before[0] != SERVING_GEN0_THRESHOLD
    kept: list[int] = []  # a tracked object alive before serving starts
    assert gc.is_tracked(kept)
    with serving_gc():
        assert gc.get_threshold() == (SERVING_GEN0_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
        # Frozen: no collection traverses it, so the collector does not report it among its objects.
        assert not any(o is kept for o in gc.get_objects())
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert any(o is kept for o in gc.get_objects())


def test_serving_gc_restores_when_serving_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), serving_gc():
        raise RuntimeError("serving stopped")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
