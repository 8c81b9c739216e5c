"""The side-by-side sidecar benchmark: each build serves from its own checkout, and is measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt.bench import echo_sidecar, sidecar_ab
from ckpt.sidecar.server import SidecarProcess


def _worktrees() -> str:
    return sidecar_ab._git("worktree", "list")


def test_two_builds_are_measured_from_their_own_checkouts(tmp_path: Path) -> None:
    report = sidecar_ab.run("HEAD", rounds=2, seconds=0.2, warmup=0.05, root=tmp_path)
    p = report.params
    assert p["baseline_commit"] == p["this_commit"]  # HEAD against this checkout
    baseline_cwd, this_cwd = Path(p["cwd"]["baseline"]), Path(p["cwd"]["this"])
    assert baseline_cwd != this_cwd and baseline_cwd.name.startswith("ckpt-ab-")
    assert not baseline_cwd.exists() and str(baseline_cwd) not in _worktrees()  # removed when done
    for build in sidecar_ab.BUILDS:
        rounds = report.builds[build]
        assert all(len(rounds[m]) == 2 for m in sidecar_ab.METRICS)
        assert all(x > 0 for m in sidecar_ab.METRICS for x in rounds[m])
    assert report.paired["merge"] == [
        t / b for t, b in zip(report.builds["this"]["merge"], report.builds["baseline"]["merge"], strict=True)
    ]
    assert set(report.paired) == set(sidecar_ab.PAIRED) and all(len(v) == 2 for v in report.paired.values())
    text = sidecar_ab.render(report)
    assert "| baseline |" in text and "| this |" in text and "median of the paired merges/s ratios" in text
    assert "of PutStream writes/s" in text and "of hot Get p50" in text
    assert list(tmp_path.iterdir()) == []  # data directories, logs and sockets removed after clean stops


def test_an_unknown_ref_is_refused_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _worktrees()
    assert sidecar_ab.main(["no-such-ref-xyz", "--rounds", "1"]) == 2
    assert "no-such-ref-xyz" in capsys.readouterr().err
    assert _worktrees() == before


def test_a_build_that_cannot_start_leaves_no_server_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[SidecarProcess] = []
    real_start = echo_sidecar.start_echo_sidecar

    def start(base: Path, name: str, *, source: Path | None = None, extra: tuple[str, ...] = ()) -> SidecarProcess:
        if started:  # the second build fails to start
            raise RuntimeError("ckpt serve did not start")
        sidecar = real_start(base, name, source=source, extra=extra)
        started.append(sidecar)
        return sidecar

    monkeypatch.setattr(sidecar_ab, "start_echo_sidecar", start)
    before = _worktrees()
    with pytest.raises(RuntimeError, match="did not start"):
        sidecar_ab.run("HEAD", rounds=1, seconds=0.1, root=tmp_path)
    assert started and started[0].process.poll() is not None  # the first one was stopped
    assert _worktrees() == before


def test_each_build_gets_its_own_serve_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # HEAD against itself with one setting changed: the way to compare two settings of one build.
    commands: dict[str, list[str]] = {}
    real_start = echo_sidecar.start_echo_sidecar

    def start(base: Path, name: str, *, source: Path | None = None, extra: tuple[str, ...] = ()) -> SidecarProcess:
        sidecar = real_start(base, name, source=source, extra=extra)
        commands[name] = Path(f"/proc/{sidecar.pid}/cmdline").read_bytes().decode().split("\0")
        return sidecar

    monkeypatch.setattr(sidecar_ab, "start_echo_sidecar", start)
    report = sidecar_ab.run(
        "HEAD",
        rounds=1,
        seconds=0.1,
        warmup=0.0,
        root=tmp_path,
        extra={"this": ("--max-commit-delay-seconds", "0")},
    )
    (baseline,) = (c for n, c in commands.items() if n.startswith("ab-baseline-"))
    (this,) = (c for n, c in commands.items() if n.startswith("ab-this-"))
    assert "--max-commit-delay-seconds" not in baseline
    assert this[this.index("--max-commit-delay-seconds") + 1] == "0"
    assert report.params["serve_options"] == {"baseline": [], "this": ["--max-commit-delay-seconds", "0"]}
    assert "this: ckpt serve --max-commit-delay-seconds 0" in sidecar_ab.render(report)


def test_serve_options_are_split_like_a_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def run(ref: str, **kwargs: object) -> None:
        seen.update(kwargs, ref=ref)
        raise ValueError("stop here")

    monkeypatch.setattr(sidecar_ab, "run", run)
    assert (
        sidecar_ab.main(["HEAD", "--this-args", "--durability no-meta-sync", "--baseline-args", "--threads '4'"]) == 2
    )
    assert seen["extra"] == {"baseline": ("--threads", "4"), "this": ("--durability", "no-meta-sync")}
