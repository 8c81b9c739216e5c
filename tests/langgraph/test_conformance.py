"""LangGraph's own conformance suite for checkpointers (langgraph-checkpoint-conformance, pinned) against
every form of the saver: sync and asyncio, through a real sidecar and embedded. Every capability, base and
extended, must be detected and pass: a failure or a skip fails the test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from ckpt.sidecar.langgraph import AsyncCkptSaver, CkptSaver
from tests.support import Sidecar


def report_of(name: str, make: Callable[[], BaseCheckpointSaver[Any]]) -> str:
    async def factory() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        saver = make()
        try:
            yield saver
        finally:
            if isinstance(saver, AsyncCkptSaver):
                await saver.aclose()
            elif isinstance(saver, CkptSaver):
                saver.close()

    registered = checkpointer_test(name=name)(factory)
    report = asyncio.run(validate(registered))
    lines = []
    for capability in sorted(c.value for c in ALL_CAPABILITIES):
        result = report.results[capability]
        lines.append(
            f"{capability}: detected={result.detected} passed={result.passed}"
            f" ({result.tests_passed} passed, {result.tests_failed} failed, {result.tests_skipped} skipped)"
        )
        lines += (f"  {failure}" for failure in result.failures)
    text = "\n".join(lines)
    for capability in ALL_CAPABILITIES:
        result = report.results[capability.value]
        assert result.detected and result.passed and not result.tests_skipped, text
    print(f"{name}:\n{text}")  # the report, for -s
    return text


def test_the_saver_through_a_sidecar_passes_every_capability(sidecar: Sidecar) -> None:
    report_of("CkptSaver", lambda: CkptSaver(sidecar.unix_target))


def test_the_asyncio_saver_through_a_sidecar_passes_every_capability(sidecar: Sidecar) -> None:
    report_of("AsyncCkptSaver", lambda: AsyncCkptSaver(sidecar.tcp_target))


@pytest.mark.parametrize("saver_class", [CkptSaver, AsyncCkptSaver])
def test_the_embedded_saver_passes_every_capability(tmp_path: Path, saver_class: type[CkptSaver]) -> None:
    count = iter(range(100))
    report_of(saver_class.__name__, lambda: saver_class.embedded(tmp_path / f"data{next(count)}"))
