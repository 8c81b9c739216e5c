"""The store's benchmarks on real disk: group commit, cold hydration, scale, disk use, merge cost, quiet keyframes.

One module per benchmark (``commits``, ``hydration``, ``scaling`` with ``scale_data``,
``scale_reads`` and ``disk``, ``merges``, ``keyframes``), what they share in
``common``, and the command line and its report in ``cli``
(``python -m ckpt.bench.store_bench --help`` describes every benchmark).
"""

from .cli import BENCHMARKS, QUICK_SESSIONS, Report, main, render, run
from .commits import group_commit, render_group_commit
from .common import DEFAULT_DIR, DEFAULT_SESSIONS, ENV_DIR, ENV_SESSIONS, TARGETS, check, data_root
from .disk import interleaved_fill
from .hydration import cold_hydration, render_cold_hydration
from .keyframes import quiet_keyframes, render_quiet_keyframes
from .merges import merge_cost, render_merge_cost
from .scale_data import VERSIONS_PER_SESSION, ScaleData
from .scaling import render_scale, scale

__all__ = [
    "BENCHMARKS",
    "DEFAULT_DIR",
    "DEFAULT_SESSIONS",
    "ENV_DIR",
    "ENV_SESSIONS",
    "QUICK_SESSIONS",
    "TARGETS",
    "VERSIONS_PER_SESSION",
    "Report",
    "ScaleData",
    "check",
    "cold_hydration",
    "data_root",
    "group_commit",
    "interleaved_fill",
    "main",
    "merge_cost",
    "quiet_keyframes",
    "render",
    "render_cold_hydration",
    "render_group_commit",
    "render_merge_cost",
    "render_quiet_keyframes",
    "render_scale",
    "run",
    "scale",
]
