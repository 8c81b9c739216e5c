"""Cold hydration: ``Store.get`` at the end of the longest chain against one FULL frame's decode."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...codec import ChainEncoder, ChainPolicy, FrameKind, decode
from ...sidecar import Store, StoreConfig, WriteMode
from .. import trajectories
from .common import fresh_dir, interleaved


def _chains(infos: Iterable[Any]) -> list[list[int]]:
    """Versions grouped by chain, oldest first: a chain starts at each FULL frame."""
    chains: list[list[int]] = []
    for info in sorted(infos, key=lambda i: i.version):
        if info.frame_kind is FrameKind.FULL or not chains:
            chains.append([])
        chains[-1].append(info.version)
    return chains


def _all_versions(store: Store, session_id: str) -> list[Any]:
    out: list[Any] = []
    token = ""
    while True:
        page, token = store.list_versions(session_id, page_size=1000, page_token=token)
        out += page
        if not token:
            return out


def cold_hydration(root: Path, trajectory_dir: str | None = None, *, reps: int = 51) -> dict[str, Any]:
    """Cold Store.get at the longest chain against one FULL-frame decode, REPLACE and MERGE."""
    sessions = [list(trajectories.replay(t)) for t in trajectories.load(trajectory_dir)]
    steps = min(sessions, key=lambda s: abs(len(s[-1].state) - 300_000))
    del sessions
    directory = fresh_dir(root, "cold-hydration")
    out: dict[str, Any] = {"versions": len(steps), "final_state_bytes": len(steps[-1].state), "rows": []}
    try:
        with Store(StoreConfig(data_dir=directory)) as store:
            for step in steps:
                store.put("replace", step.state, mode=WriteMode.REPLACE)
                store.put("merge", step.patch, mode=WriteMode.MERGE)
        with Store(StoreConfig(data_dir=directory, cache_size_bytes=0)) as store:
            for mode in ("replace", "merge"):
                chains = _chains(_all_versions(store, mode))
                out[f"{mode}_chain_lengths"] = [len(c) for c in chains]
                # The first longest chain (as bench/test_codec_bench.py takes), and the last chain the
                # policy ended (followed by a FULL frame), which holds the largest states.
                picks = {"longest": max(chains, key=len)}
                if len(chains) > 1 and chains[-2] is not picks["longest"]:
                    picks["last ended"] = chains[-2]
                for which, chain in picks.items():
                    out["rows"].append(_time_cold_get(store, steps, mode, which, chain, reps))
            out["cache_hits"] = store.counters.cache_hits
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    out["reps"] = reps
    out["byte_exact"] = all(row["byte_exact"] for row in out["rows"])
    return out


def _time_cold_get(
    store: Store, steps: list[trajectories.Step], mode: str, which: str, chain: list[int], reps: int
) -> dict[str, Any]:
    """Store.get of the chain's last version, the codec's decode of its frames, one FULL frame's decode."""
    target = chain[-1]
    expected = steps[target - 1].state if mode == "replace" else b"".join(s.patch for s in steps[:target])
    frames = [f for v, _, f in store.frames_of(mode)[1] if chain[0] <= v <= target]
    full = ChainEncoder(policy=ChainPolicy(max_depth=0)).replace(expected).data
    exact = store.get(mode, target).state == expected and decode([full]) == expected and decode(frames) == expected
    get_s, chain_s, full_s = interleaved(
        [lambda: store.get(mode, target).state, lambda: decode(frames), lambda: decode([full])], reps
    )
    return {
        "mode": mode,
        "chain": which,
        "target_version": target,
        "chain_frames": len(chain),
        "chain_stored_bytes": sum(len(f) for f in frames),
        "full_frame_bytes": len(full),
        "state_bytes": len(expected),
        "byte_exact": exact,
        "store_get_us": get_s * 1e6,
        "codec_chain_decode_us": chain_s * 1e6,
        "full_decode_us": full_s * 1e6,
        "get_vs_full": get_s / full_s,
        "chain_decode_vs_full": chain_s / full_s,
        "store_overhead_us": (get_s - chain_s) * 1e6,
    }


def render_cold_hydration(r: dict[str, Any]) -> str:
    lines = [
        f"\n## cold hydration: trajectory of {r['versions']} versions, final state {r['final_state_bytes']:,} B; "
        f"store reopened with cache_size_bytes=0; medians of {r['reps']} interleaved reps",
        "",
        "| mode, chain | frames | version | state B | chain stored B | FULL frame B | Store.get us | "
        "codec decode(chain) us | decode(FULL) us | get x FULL | decode(chain) x FULL | byte-exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m in r["rows"]:
        lines.append(
            f"| {m['mode'].upper()}, {m['chain']} chain | {m['chain_frames']} | {m['target_version']} | "
            f"{m['state_bytes']:,} | "
            f"{m['chain_stored_bytes']:,} | {m['full_frame_bytes']:,} | {m['store_get_us']:.0f} | "
            f"{m['codec_chain_decode_us']:.0f} | {m['full_decode_us']:.0f} | **{m['get_vs_full']:.2f}** | "
            f"{m['chain_decode_vs_full']:.2f} | {'yes' if m['byte_exact'] else 'NO'} |"
        )
    lines.append(
        f"\nchain lengths (frames, oldest chain first): REPLACE {r['replace_chain_lengths']}, "
        f"MERGE {r['merge_chain_lengths']}"
    )
    lines.append(
        "(codec targets for decode at the bound: <= 4x REPLACE, <= 3x MERGE; state-cache hits during the "
        f"timed gets: {r['cache_hits']})"
    )
    return "\n".join(lines)
