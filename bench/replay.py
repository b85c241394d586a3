"""Benchmark: `onceflow replay` end to end (read the file, write the journal).

Generates 1,000,000 documents (10% resends, half of them in AND/XOR joins over 3 types,
1% bad input) and prints documents per second.  The baseline measured in the same run is
the floor any replay pays: reading and JSON-decoding the input and JSON-encoding one line
per record; the ratio shows how much the trigger semantics cost on top.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from onceflow import engine as core_engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import generate_lines, write_scenario  # noqa: E402


def baseline(path: Path, sink: Path) -> float:
    """Read, decode and re-encode every line: the I/O floor of a replay."""
    start = time.perf_counter()
    with path.open("rb") as source, sink.open("wb") as out:
        for line in source:
            item = orjson.loads(line)
            out.write(orjson.dumps({"trigger": None, "outcome": "x", "ts": item["ts"]}))
            out.write(b"\n")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=1_000_000)
    args = parser.parse_args()
    onceflow = Path(sys.executable).parent / "onceflow"
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_scenario(Path(tmp) / "scenario", generate_lines(args.documents))
        journal = Path(tmp) / "journal.jsonl"
        floor = baseline(folder / "input.jsonl", journal)
        start = time.perf_counter()
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with journal.open("wb") as out:
            # One core: the replay runs in one process, pinned where the OS allows.
            cmd = [str(onceflow), "replay", str(folder)]
            if hasattr(os, "sched_setaffinity"):
                cmd = ["taskset", "-c", "0", *cmd]
            subprocess.run(cmd, stdout=out, check=True)
        elapsed = time.perf_counter() - start
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime -
                                                          cpu_before.ru_stime)
        lines = sum(1 for _ in journal.open("rb"))
    compiled = not str(core_engine.__file__).endswith(".py")
    rate = args.documents / elapsed
    floor_rate = args.documents / floor
    print(f"core                 {'compiled (mypyc)' if compiled else 'pure Python':>12}")
    print(f"documents            {args.documents:>12,}")
    print(f"journal records      {lines:>12,}")
    print(f"onceflow replay      {rate:>12,.0f} documents/s  ({elapsed:.2f} s wall, one core)")
    print(f"  per CPU second     {args.documents / cpu:>12,.0f} documents/s  ({cpu:.2f} s CPU; "
          f"the wall rate is lower when other work shares the machine)")
    print(f"baseline (I/O only)  {floor_rate:>12,.0f} documents/s  ({floor:.2f} s)")
    print(f"ratio replay/baseline {rate / floor_rate:>11.2f}")
    print(f"target 100,000 docs/s: {'met' if rate >= 100_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
