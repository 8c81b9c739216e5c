"""When a batch of writes stops gathering and goes to commit: one rule, for the writer thread and the loop.

Sans-IO: the writer thread (writer.py) and an event loop gathering its own
writes (loopwrites.py) each ask :func:`close_in` how long their batch may
wait yet, and do the waiting their own way.
"""

from __future__ import annotations

#: A batch waits for the writers it expects at most this many of the last commit's durations
#: (and at most max_commit_delay_seconds), counted from when the last batch was handed over.
GATHER_COMMITS = 3


def close_in(
    *,
    gathered: int,
    expected: int,
    last_commit_seconds: float,
    since_hand_over_seconds: float,
    max_commit_delay_seconds: float,
) -> float:
    """Seconds the batch may wait yet for more writes; 0.0: close it now.

    ``expected`` is how many writers the batch can hope for: those the last
    commit answered (and, on the writer thread, those who queued while it
    ran), at most max_batch_writes; 0 or 1 when nobody else is writing.

    A batch closes as soon as it holds the writes expected. Otherwise it
    waits: a commit's flush costs about the same for 30 writes as for 60, so
    waiting briefly for the writers the last commit answered saves flushes.
    The wait is counted from the last hand-over, not from now: writes that
    came only after the last commit have waited through it already.
    """
    if expected < 2 or gathered >= expected:
        return 0.0
    budget = min(max_commit_delay_seconds, GATHER_COMMITS * last_commit_seconds)
    return max(0.0, budget - since_hand_over_seconds)
