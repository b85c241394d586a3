"""`onceflow replay`: a scenario through the core, with no broker, on simulated time."""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import orjson
from onceflow.engine import Engine
from onceflow.journal import JournalRecord, summary_table
from onceflow.outputs import Output
from onceflow.processor import Sink
from onceflow.scenario import InputOffsets, Scenario, load_scenario


def replay_scenario(
    scenario: Scenario,
    *,
    keep_outputs: bool = True,
    on_journal: Callable[[list[JournalRecord]], None] | None = None,
    chunk: int = 4096,
    offsets: InputOffsets | None = None,
) -> tuple[list[JournalRecord], list[Output], Engine]:
    """Run every record of a scenario in file order; return the journal and the outputs.

    With `on_journal`, journal records are handed over in chunks as they are made and not
    kept, so a long replay streams in constant memory for the journal.  `offsets`, when
    given, keeps what the input reader remembers (each offset's first value) past the run.
    """
    engine = Engine(scenario.triggers, base_dir=scenario.path)
    for seed in scenario.history:
        engine.seed_history(seed.trigger, seed.identity, seed.status, seed.ts, seed.failed,
                            seed.activation)
    sink = Sink(keep_outputs=keep_outputs)
    try:
        engine.process_all(scenario.iter_records(offsets), sink, on_journal, chunk)
    finally:
        engine.close()
    return sink.journal, sink.outputs or [], engine


def write_journal(records: Iterable[JournalRecord], stream: IO[bytes]) -> None:
    """One JSON object per line."""
    dumps = orjson.dumps
    newline = orjson.OPT_APPEND_NEWLINE
    stream.write(b"".join([dumps(record.as_dict(), option=newline) for record in records]))


def write_outputs(outputs: list[Output], folder: Path) -> None:
    """Output documents as one JSON-lines file per topic."""
    folder.mkdir(parents=True, exist_ok=True)
    by_topic: dict[str, list[Output]] = {}
    for output in outputs:
        by_topic.setdefault(output.topic, []).append(output)
    for topic, items in by_topic.items():
        with (folder / f"{topic}.jsonl").open("wb") as handle:
            for item in items:
                handle.write(orjson.dumps({"key": item.key, "headers": item.headers,
                                           "value": item.value}))
                handle.write(b"\n")




# What the last replay in this process held: kept until the process ends (see run).
_LEFT_FOR_EXIT: list[object] = []

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


def keep_heap() -> bool:
    """Ask glibc to keep freed memory for reuse instead of returning it at once.

    A replay frees and allocates small objects by the million; glibc trims the heap top
    and maps large blocks afresh again and again (a profile put 21% of a replay's time
    there). Keeping up to 1 GiB free at the top, padding each growth by 64 MiB and serving
    blocks up to 32 MiB from the heap ran bench/replay.py about 30% faster per CPU second
    (62-66k to 85k documents/s). Only where the C library is glibc; True when applied.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(option, value) == 1 for option, value in (
        (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 64 << 20), (M_MMAP_THRESHOLD, 32 << 20)))


def run(path: str, *, summary: bool = False, outputs: str | None = None) -> int:
    """The `onceflow replay` command."""
    keep_heap()
    scenario = load_scenario(path)
    counts: list[dict[str, Any]] = []
    stream = sys.stdout.buffer

    def emit(records: list[JournalRecord]) -> None:
        if summary:
            counts.extend({"trigger": r.trigger, "outcome": r.outcome} for r in records)
        else:
            write_journal(records, stream)

    # A replay allocates millions of small objects that the state keeps (history, joins,
    # id caches) and almost no reference cycles; the cyclic collector would rescan the
    # growing state again and again for nothing, so it is paused for the run, and what the
    # run left is moved out of its sight before it comes back (else its first full pass
    # walks every object of the state once more).
    gc.disable()
    offsets = InputOffsets()
    try:
        _, produced, engine = replay_scenario(scenario, keep_outputs=bool(outputs),
                                              on_journal=emit, offsets=offsets)
    finally:
        gc.freeze()
        gc.enable()
    # The state stays referenced after the return: the console script leaves with
    # os._exit, so it is never freed object by object (a profile put 11% of a replay in
    # freeing the values the reader kept, and more in the history and join state).
    _LEFT_FOR_EXIT[:] = [engine, offsets]
    if outputs:
        write_outputs(produced, Path(outputs))
    if summary:
        sys.stdout.write(summary_table(counts))
        for name, held in engine.held.items():
            if held:
                sys.stdout.write(f"trigger {name!r} is suspended; {len(held)} document(s) "
                                 f"stay unacknowledged\n")
    sys.stdout.flush()
    return 0
