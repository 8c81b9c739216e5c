"""The benchmark harness behind ``ckpt bench run``: workloads x systems -> results, report, plots.

Modules, one job each:
- ``workloads``: seeded generators of checkpoint sequences (real trajectories and synthetic agents);
- ``systems``: ckpt (embedded and through the sidecar) and the stores people use today, behind one interface;
- ``runner``: drives a workload through a system and measures it;
- ``tuning``: zstd level and chain policy sweeps;
- ``report`` and ``plots``: results JSON -> REPORT.md and PNG plots;
- ``events_report``: the event log benchmark's events.json (``bench/events_bench.py``) -> its REPORT.md section.
"""
