"""The documentation holds together: a short README linking every docs/ page, links that resolve, examples
that run, and words about the product only."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
HISTORY = ROOT / "bench" / "HISTORY.md"
PAGES = [README, *DOCS]

_ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth"
    "|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth"
)
_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
# Words about how the project was worked on rather than about the product. "session" alone is the
# product's word (an agent's checkpoint session), so only the phrasings that number or place a working
# session are caught; "walk" is caught as a noun for a pass over the code, not as a verb (a chain read
# "walks back" to its FULL frame).
PROCESS_WORDS = re.compile(
    rf"""
      \bsession\s+\#?\d+\b
    | \b(?:{_ORDINALS}|\d+(?:st|nd|rd|th)|this|previous|earlier|working)\s+session\b
    | \bsession's\s+(?:start|end)\b
    | \bhelper(?:-\d+|'s|s')
    | \breview(?:s|ed|ers?|ing)?\b
    | \b(?:a|the|this|each|two|three|code|house|helpers')\s+walk(?:s|'s)?\b(?!\s+(?:back|over|through|to|along)\b)
    | \bwalks?\s+ran\b
    | \bwalk-?through\b
    | \b20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b
    | \b(?:{_MONTHS})[a-z]*\.?\s+\d{{1,2}},?\s+20\d\d\b
    """,
    re.IGNORECASE | re.VERBOSE,
)

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return _FENCE.sub("", page.read_text())


def _links(page: Path) -> list[str]:
    return [target for target in _LINK.findall(_prose(page)) if not re.match(r"[a-z]+:", target)]


def _anchor(heading: str) -> str:
    """GitHub's id for a heading: its text lower-cased, punctuation dropped, spaces made hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(page), re.MULTILINE):
        slug = _anchor(heading)
        count = counts.get(slug, 0)
        counts[slug] = count + 1
        anchors.add(f"{slug}-{count}" if count else slug)  # GitHub numbers a repeated heading's id
    return anchors


def _python_block(page: Path, heading: str) -> str:
    section = page.read_text().split(heading + "\n", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, f"no python block under {heading!r} in {page.name}"
    return code.group(1)


def test_readme_is_a_front_door_of_at_most_200_lines() -> None:
    assert len(README.read_text().splitlines()) <= 200


def test_the_readme_links_every_docs_page() -> None:
    linked = {(README.parent / target.split("#", 1)[0]).resolve() for target in _links(README)}
    assert DOCS, "no docs/ pages"
    assert [page.name for page in DOCS if page.resolve() not in linked] == []


@pytest.mark.parametrize("page", [*PAGES, HISTORY], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_to_files_and_headings(page: Path) -> None:
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no such heading in {file.name}")
    assert broken == []


@pytest.mark.parametrize("page", [*PAGES, HISTORY], ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_speak_of_the_product_only(page: Path) -> None:
    hits = [
        f"line {number}: {match.group(0)!r}"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in PROCESS_WORDS.finditer(line)
    ]
    assert hits == []


@pytest.mark.parametrize(
    "text",
    [
        "measured in the tenth session",
        "at the session's start",
        "session 12 measured it",
        "earlier sessions aside, this session found",
        "a helper's tests running",
        "two helpers' walks ran meanwhile",
        "helper-3 saw it",
        "a review's measurement",
        "reviewed by the lead",
        "the walk found two bugs",
        "measured on 2026-11-26",
        "since Nov 27, 2026",
    ],
)
def test_process_words_are_caught(text: str) -> None:
    assert PROCESS_WORDS.search(text)


@pytest.mark.parametrize(
    "text",
    [
        "an agent's session keeps its labels",
        "a request id reused for a different write to the same session",
        "sessions written interleaved leave pages half full",
        "1,000,000 sessions",
        "each walks back to the FULL frame that starts its chain",
        "nearly every young collection walked and promoted the writes",
        "ckpt sessions --updated-after 2026-11-21T09:00:00Z",
        "shared test helpers live in one module",
        "runs in a process session of its own",
    ],
)
def test_product_words_are_not_caught(text: str) -> None:
    assert PROCESS_WORDS.search(text) is None


def test_embedded_store_example_runs_on_a_fresh_data_directory(tmp_path: Path) -> None:
    source = _python_block(ROOT / "docs" / "embedded.md", "## The store")
    source = source.replace('Path("data")', f"Path({str(tmp_path / 'data')!r})")
    state = pb.Checkpoint(goal="demo", step=1).SerializeToString()
    patch = pb.Checkpoint(step=2).SerializeToString()
    namespace: dict[str, Any] = {"state_bytes": state, "patch_bytes": patch}
    exec(compile(source, "docs/embedded.md", "exec"), namespace)
    assert namespace["latest"].state == state + patch
    assert namespace["v1"].state == state
    assert [v.version for v in namespace["page"]] == [2, 1]


def test_codec_example_runs() -> None:
    source = _python_block(ROOT / "docs" / "embedded.md", "## The codec alone")
    states = [pb.Checkpoint(goal="demo", step=n, conversation_summary="x" * n).SerializeToString() for n in range(30)]
    stored: dict[int, bytes] = {}
    namespace: dict[str, Any] = {"states": states, "store": stored.__setitem__}
    exec(compile(source, "docs/embedded.md", "exec"), namespace)
    assert sorted(stored) == list(range(1, 31))
