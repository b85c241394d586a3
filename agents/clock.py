"""How far ahead of the wall clock a partition's time may run (ONCEFLOW_MAX_CLOCK_SKEW).

Partition time is the newest record time seen on the partition, and it is stored: one
record stamped in year 9999 would expire every join opened on that partition afterwards,
after every restart too.  So in the worker, partition time never moves past the worker's
wall clock plus the skew:

- an input record stamped beyond it is `bad-input` at ingress (agents/partition_worker.py);
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


def millis(seconds: float) -> int:
    """A wall-clock time or a setting in seconds as whole milliseconds (partition time)."""
    return round(seconds * 1000)


def limit(wall: float, skew: float) -> int:
    """The latest partition time allowed, in ms, for a wall clock and a skew in seconds."""
    return millis(wall) + millis(skew)


def describe(ts: int) -> str:
    """A record time in ms for a message: ISO 8601 in UTC, with the seconds it stands for."""
    try:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts / 1000))
    except (OverflowError, OSError, ValueError):
        return f"{ts!r} ms"
    return f"{stamp} ({ts / 1000:.3f})"


def ahead(ts: int, wall: float, skew: float) -> str | None:
    """Why `ts` (ms) is too far ahead of the wall clock (`wall`, `skew` in s), or None."""
    if ts <= limit(wall, skew):
        return None
    return (f"its time {describe(ts)} is {(ts - millis(wall)) / 1000:.6g} s ahead of this "
            f"worker's clock, more than {SETTING} ({skew:g} s): it would move partition "
            f"time forward and expire every open join of the partition")
