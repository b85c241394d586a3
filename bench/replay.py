"""Benchmark: `onceflow replay` end to end (read the file, write the journal).

Generates 300,000 documents (10% resends, half of them in AND/XOR joins over 3 types,
1% bad input) and prints documents per second.  The floor measured in the same run is
what any replay pays: JSON-decoding the input and JSON-encoding the journal the replay
wrote (its real records); the ratio shows how much the trigger semantics cost on top.
"""

from __future__ import annotations

import argparse
import gc
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


def baseline(path: Path, journal: list[dict[str, object]], sink: Path) -> float:
    """Decode every input line and encode the replay's real journal: a replay's floor.

    The journal records are the ones the replay wrote (decoded before the clock starts),
    so the floor pays for exactly the output the replay produced.  The cyclic collector is
    off, as it is during a replay.
    """
    gc.disable()
    start = time.perf_counter()
    with path.open("rb") as source:
        for line in source:
            orjson.loads(line)
    with sink.open("wb") as out:
        for record in journal:
            out.write(orjson.dumps(record))
            out.write(b"\n")
    elapsed = time.perf_counter() - start
    gc.enable()
    return elapsed


def run_replay(scenario: Path, journal: Path, env: dict[str, str] | None = None
               ) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `onceflow replay` of `scenario` into `journal`.

    One core: the replay runs in one process, pinned where the OS allows.  `env`: the
    command's environment (default: this process's).
    """
    command = [str(Path(sys.executable).parent / "onceflow"), "replay", str(scenario)]
    if hasattr(os, "sched_setaffinity"):
        command = ["taskset", "-c", "0", *command]
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with journal.open("wb") as out:
        subprocess.run(command, stdout=out, env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    elapsed = time.perf_counter() - start
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=300_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_scenario(Path(tmp) / "scenario", generate_lines(args.documents))
        journal = Path(tmp) / "journal.jsonl"
        elapsed, cpu = run_replay(folder, journal)
        written = [orjson.loads(line) for line in journal.open("rb")]
        lines = len(written)
        floor = baseline(folder / "input.jsonl", written, Path(tmp) / "floor.jsonl")
    compiled = not str(core_engine.__file__).endswith(".py")
    rate = args.documents / elapsed
    floor_rate = args.documents / floor
    print(f"core                 {'compiled (mypyc)' if compiled else 'pure Python':>12}")
    print(f"documents            {args.documents:>12,}")
    print(f"journal records      {lines:>12,}")
    print(f"onceflow replay      {rate:>12,.0f} documents/s  ({elapsed:.2f} s wall, one core)")
    print(f"  per CPU second     {args.documents / cpu:>12,.0f} documents/s  ({cpu:.2f} s CPU; "
          f"the wall rate is lower when other work shares the machine)")
    print(f"floor (parse input, dump its journal) {floor_rate:>,.0f} documents/s  "
          f"({floor:.2f} s)")
    print(f"ratio replay/baseline {rate / floor_rate:>11.2f}")
    print(f"target 200,000 docs/s: {'met' if rate >= 200_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
