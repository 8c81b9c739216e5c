"""PNG plots for the report (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .report import Results, tuning_label

PLOTS = {
    "bytes": "bytes_per_checkpoint.png",
    "throughput": "throughput_by_concurrency.png",
    "cdf": "cold_hydrate_cdf.png",
    "tuning": "tuning_curve.png",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def _per_workload(plt: Any, workloads: list[str], title: str, draw: Callable[[Any, str], None], path: Path) -> None:
    """One small plot per workload, drawn by ``draw(ax, workload)``, in a grid of up to three columns."""
    cols = min(len(workloads), 3)
    rows = (len(workloads) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for k, w in enumerate(workloads):
        ax = axes[k // cols][k % cols]
        draw(ax, w)
        ax.set_title(w)
    for k in range(len(workloads), rows * cols):
        axes[k // cols][k % cols].axis("off")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(doc: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """Write every plot the results support under ``out_dir``; returns {kind: file name}."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    res = Results(doc)
    labels = {s: doc.get("system_labels", {}).get(s, s) for s in res.systems}
    colors = {s: f"C{i}" for i, s in enumerate(res.systems)}
    written: dict[str, str] = {}

    # Bytes per checkpoint: grouped bars, log scale (systems differ by orders of magnitude).
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(res.systems), 1)
    for i, s in enumerate(res.systems):
        xs, ys = [], []
        for j, w in enumerate(res.workloads):
            v = res.get(s, w, "disk_bytes_per_checkpoint")
            if v:
                xs.append(j + i * width)
                ys.append(v)
        ax.bar(xs, ys, width, label=labels[s], color=colors[s])
    ax.set_xticks([j + width * (len(res.systems) - 1) / 2 for j in range(len(res.workloads))], res.workloads)
    ax.set_yscale("log")
    ax.set_ylabel("disk bytes per checkpoint (log)")
    ax.set_title("Bytes per checkpoint by system (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / PLOTS["bytes"], dpi=110)
    plt.close(fig)
    written["bytes"] = PLOTS["bytes"]

    def throughput(ax: Any, w: str) -> None:
        for s in res.systems:
            pts = [(a, res.get(s, w, "write_throughput", agents=a)) for a in res.agents_levels(w)]
            pts = [(a, v) for a, v in pts if v is not None]
            if pts:
                ax.plot([a for a, _ in pts], [v for _, v in pts], marker="o", label=labels[s], color=colors[s])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent agents")
        ax.set_ylabel("durable writes/s")

    # Cold (or, for in-memory systems, hot) latest-version hydrate latency CDFs.
    def cdf(ax: Any, w: str) -> None:
        for s in res.systems:
            rec = res.record(s, w, "hydrate_latest_cold") or res.record(s, w, "hydrate_latest_hot")
            if not rec:
                continue
            samples = rec["samples_us"]
            n = len(samples)
            style = "-" if rec["metric"].endswith("cold") else ":"
            ax.step(samples, [(i + 1) / n for i in range(n)], style, where="post", label=labels[s], color=colors[s])
        ax.set_xscale("log")
        ax.set_xlabel("latest-version hydrate (µs, log)")
        ax.set_ylabel("fraction of reads")

    for kind, title, draw in (
        ("throughput", "Write throughput by concurrency (higher is better)", throughput),
        ("cdf", "Cold hydrate latency CDF (dotted: in-memory, hot)", cdf),
    ):
        _per_workload(plt, res.workloads, title, draw, out_dir / PLOTS[kind])
        written[kind] = PLOTS[kind]

    sweeps = doc.get("tuning") or []
    if sweeps:
        fig, axes = plt.subplots(1, len(sweeps), figsize=(6.5 * len(sweeps), 4.5), squeeze=False)
        markers = {"level": "o", "max_decode_cost_ratio": "s", "max_depth": "^", "merge_message_type": "D"}
        for ax, sweep in zip(axes[0], sweeps, strict=True):
            for knob, marker in markers.items():
                knob_points = [t for t in sweep["points"] if t["knob"] == knob]
                if not knob_points:
                    continue
                ax.plot(
                    [t["bytes_per_version"] for t in knob_points],
                    [t["cold_latest_p50_us"] for t in knob_points],
                    marker=marker,
                    linestyle="--",
                    label=knob,
                )
                for t in knob_points:
                    ax.annotate(tuning_label(t), (t["bytes_per_version"], t["cold_latest_p50_us"]), fontsize=7)
            default = next((t for t in sweep["points"] if t["default"]), None)
            if default:
                ax.plot(
                    [default["bytes_per_version"]],
                    [default["cold_latest_p50_us"]],
                    marker="*",
                    markersize=16,
                    color="red",
                    linestyle="none",
                    label="default",
                )
            ax.set_xlabel("stored bytes per version")
            ax.set_ylabel("cold latest hydrate p50 (µs)")
            ax.set_title(f"{sweep['workload']} (MERGE)")
            ax.legend(fontsize=8)
        fig.suptitle("Tuning trade-off: bytes against cold hydrate latency (lower-left is better)")
        fig.tight_layout()
        fig.savefig(out_dir / PLOTS["tuning"], dpi=110)
        plt.close(fig)
        written["tuning"] = PLOTS["tuning"]
    return written
