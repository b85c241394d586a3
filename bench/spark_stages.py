"""Benchmark: the Spark pipeline's three Python stages against the replay, in one process.

`bench/spark.py` times the whole `onceflow spark replay` (JVM, driver, Python workers) on
local[2], where the machine's noise and Spark's start-up blur what the stages themselves
cost.  This bench runs the stages' own functions, one task each, without Spark:

- read: `ReadLocalLines` over the input file (parse each line, position, partition time);
- ingress: `IngressStage` over the read stage's rows sorted by (kind, block), as
  `sortWithinPartitions` gives them;
- triggers: `TriggerStage` over the ingress stage's rows sorted the same way, writing the
  journal (Parquet and JSON lines) and the documents into a scratch folder, as a local
  run's tasks do;

and `onceflow replay`'s own path on the same input in the same process (read, the core's
Engine, the journal as JSON lines), alternately, best of --repeat.  It prints CPU
microseconds a document for each and their ratio to the replay.  Only what Spark itself
does is missing: the shuffles and sorts in the JVM, Arrow between the JVM and the workers,
the start-up (bench/spark.py shows those).

The journal the stages wrote must equal the replay's (as multisets of the contract
fields); the bench fails otherwise.

    .venv/bin/python bench/spark_stages.py [--documents 300000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from onceflow.app.replay import replay_scenario, write_journal
from onceflow.journal import JournalRecord, contract_multiset
from onceflow.pipeline.ingress_stage import IngressStage
from onceflow.pipeline.local_output import JOURNAL_LINES
from onceflow.pipeline.plan import make_slots
from onceflow.pipeline.read_stage import ReadLocalLines
from onceflow.pipeline.rows import READ_SCHEMA, ROUTED_SCHEMA
from onceflow.pipeline.trigger_stage import TriggerStage
from onceflow.scenario import load_scenario
from onceflow.triggers import TriggerSet

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import generate_lines, write_scenario  # noqa: E402


def sorted_rows(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> list[pa.RecordBatch]:
    """A stage's output rows in the order the next stage gets them: by (kind, block)."""
    table = pa.Table.from_batches(list(batches), schema=schema)
    order = pc.sort_indices(table, sort_keys=[("kind", "ascending"), ("block", "ascending")])
    return table.take(order).to_batches(max_chunksize=10_000)


def stages(path: Path, triggers: TriggerSet, scratch: Path) -> tuple[dict[str, float],
                                                                    list[bytes]]:
    """CPU seconds of each stage (one task each), and the journal lines they wrote."""
    spent: dict[str, float] = {}
    size = path.stat().st_size
    start = time.process_time()
    read = ReadLocalLines({str(path): 0}, [[(str(path), str(path), 0, size)]])
    rows = list(read(iter([pa.record_batch([pa.array([0])], names=["id"])])))
    spent["read"] = time.process_time() - start
    rows = sorted_rows(iter(rows), READ_SCHEMA)
    start = time.process_time()
    routed = list(IngressStage(triggers, make_slots(1), (str(path),))(iter(rows)))
    spent["ingress"] = time.process_time() - start
    del rows
    routed = sorted_rows(iter(routed), ROUTED_SCHEMA)
    results = scratch / "results"
    start = time.process_time()
    manifest = list(TriggerStage(triggers, None, [], {}, str(results))(iter(routed)))
    spent["triggers"] = time.process_time() - start
    del routed, manifest
    lines = [line for part in sorted(results.rglob(f"{JOURNAL_LINES}/*"))
             for line in part.read_bytes().split(b"\n")]
    shutil.rmtree(results)
    return spent, lines


def replay(folder: Path) -> tuple[float, list[bytes]]:
    """CPU seconds of `onceflow replay`'s path in this process, and its journal lines."""
    out = io.BytesIO()
    start = time.process_time()
    scenario = load_scenario(folder)

    def write(records: list[JournalRecord]) -> None:
        write_journal(records, out)

    replay_scenario(scenario, keep_outputs=False, on_journal=write)
    spent = time.process_time() - start
    return spent, out.getvalue().split(b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        folder = write_scenario(scratch / "scenario", generate_lines(args.documents))
        triggers = load_scenario(folder).triggers
        best: dict[str, float] = {}
        journals: dict[str, Counter[tuple[Any, ...]]] = {}
        for _ in range(args.repeat):
            gc.collect()
            gc.disable()  # as the replay command and the stages run
            spent, lines = replay(folder)
            gc.enable()
            best["replay"] = min(best.get("replay", spent), spent)
            journals["replay"] = contract_multiset(lines)
            del lines
            gc.collect()
            parts, lines = stages(folder / "input.jsonl", triggers, scratch)
            for name, seconds in parts.items():
                best[name] = min(best.get(name, seconds), seconds)
            journals["stages"] = contract_multiset(lines)
            del lines
        if journals["stages"] != journals["replay"]:
            raise SystemExit("the stages' journal differs from the replay's")
    count = args.documents
    print(f"{count:,} documents, one task a stage, best of {args.repeat}; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; journals identical")
    print(f"{'runner':<46} {'CPU us/doc':>10} {'vs replay':>10}")
    labels = {"replay": "onceflow replay (read, engine, journal lines)",
              "read": "read stage (parse, position, partition time)",
              "ingress": "ingress stage (the core's Ingress, routing)",
              "triggers": "trigger stage (the core's Engine, results)"}
    for name in ("replay", "read", "ingress", "triggers"):
        print(f"{labels[name]:<46} {best[name] / count * 1e6:>10.2f} "
              f"{best[name] / best['replay']:>9.2f}x")
    total = best["read"] + best["ingress"] + best["triggers"]
    print(f"{'the three stages':<46} {total / count * 1e6:>10.2f} "
          f"{total / best['replay']:>9.2f}x")


if __name__ == "__main__":
    main()
