"""The worker's side of the clock limit (ONCEFLOW_MAX_CLOCK_SKEW): its wall clock, in ms.

The rule itself (partition time never moves past the wall clock plus the skew; what is
refused, clamped and reset) is the core's: `onceflow.partition.ClockLimit`, applied by
`Partition.time_refused`, `advance` and `start_at`.  The worker only supplies its clock
and the setting.  Replay and the Spark pipeline run on the scenario's time, with no limit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from onceflow.partition import ClockLimit

SETTING: Final = "ONCEFLOW_MAX_CLOCK_SKEW"


def millis(seconds: float) -> int:
    """A wall-clock time or a setting in seconds as whole milliseconds (partition time)."""
    return round(seconds * 1000)


def clock_limit(wall_clock: Callable[[], float], skew: float) -> ClockLimit:
    """The core's clock limit for a worker: `wall_clock` and `skew` in seconds."""
    return ClockLimit(lambda: millis(wall_clock()), millis(skew), f"{SETTING} ({skew:g} s)")
