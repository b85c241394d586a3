"""How far ahead of the wall clock a partition's time may run (ONCEFLOW_MAX_CLOCK_SKEW).

Partition time is the newest record time seen on the partition, and it is stored: one
record stamped in year 9999 would expire every join opened on that partition afterwards,
after every restart too.  So in the worker, partition time never moves past the worker's
wall clock plus the skew:

- an input record stamped beyond it is `bad-input` at ingress (agents/partition.py);
- a tick beyond it is `bad-input` on the repartition topic (agents/controls.py);
- a routed document beyond it (its ingress worker's clock is ahead of this one's) is
  decided on its own time, and moves partition time only up to the limit;
- a stored partition time beyond it (written before this limit existed) starts again
  from the wall clock when the partition is loaded.

Replay and the Spark pipeline run on the scenario's time, which has no wall clock to be
ahead of: this is a worker-only limit.
"""

from __future__ import annotations

import time
from typing import Final

SETTING: Final = "ONCEFLOW_MAX_CLOCK_SKEW"


def describe(ts: float) -> str:
    """A record time for a message: ISO 8601 in UTC, with the seconds it stands for."""
    try:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        return f"{ts!r}"
    return f"{stamp} ({ts:.3f})"


def ahead(ts: float, wall: float, skew: float) -> str | None:
    """Why `ts` is too far ahead of the wall clock for partition time, or None."""
    if ts <= wall + skew:  # (a NaN is never within it)
        return None
    return (f"its time {describe(ts)} is {ts - wall:.6g} s ahead of this worker's clock, "
            f"more than {SETTING} ({skew:g} s): it would move partition time forward and "
            f"expire every open join of the partition")
