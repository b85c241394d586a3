"""Benchmark: `onceflow spark replay` on local[2] against `onceflow replay`, same input.

Generates 1,000,000 documents (bench/generate.py: 10% resends, half of them in AND/XOR
joins over 3 types, 1% bad input), runs both commands in this run, and prints:

- the Spark rate end to end (the whole command: JVM start, the job, writing the journal as
  Parquet and JSON lines and the documents, stopping Spark) and within the job (the
  pipeline's own timing from summary.json: passes and exports, without the start-up);
- the replay rate (one process, journal to a file);
- the ratio Spark / replay, and whether the two journals are identical as multisets of
  the five contract fields (trigger, outcome, identity, activation, ts and its type).

The machine's load average is printed too: on a shared machine the rates move with it.
So is whether the run found the archive of Spark's classes that the first local run on a
machine writes (docs/spark.md, "Local runs"): without it the JVM starts about 2.5 s
slower, and the run that writes it takes 10-20 s more.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from onceflow.journal import contract_multiset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import generate_lines, write_scenario  # noqa: E402
from procs import TreeSampler  # noqa: E402


def class_data_state() -> str:
    """Whether the Spark run maps the archive of Spark's classes that earlier runs wrote."""
    from onceflow.pipeline.session import CLASS_DATA_ENV, class_data_folder

    if os.environ.get(CLASS_DATA_ENV, "1").lower() in ("0", "false", "no", "off"):
        return f"off ({CLASS_DATA_ENV}=0)"
    folder = Path(class_data_folder())
    if any(folder.glob("spark-*.jsa")):
        return f"present in {folder} (written by an earlier run)"
    return f"absent: this run writes it into {folder} (once, 10-20 s more)"


def cpu_seconds() -> float:
    """CPU time of this process's finished children (the commands measured)."""
    times = os.times()
    return times.children_user + times.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    onceflow = Path(sys.executable).parent / "onceflow"
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_scenario(Path(tmp) / "scenario", generate_lines(args.documents))
        output = Path(tmp) / "spark-out"
        class_data = class_data_state()
        load_before = os.getloadavg()[0]
        cpu = cpu_seconds()
        start = time.perf_counter()
        command = subprocess.Popen([str(onceflow), "spark", "replay", "--master", args.master,
                                    "--triggers", str(folder / "triggers.toml"),
                                    "--input", str(folder / "input.jsonl"),
                                    "--output", str(output), "--quiet"],
                                   stdout=subprocess.DEVNULL)
        # Every process of the command (the driver, its JVM, the Python workers the JVM
        # starts): not all of them are waited for by their parents, so children's rusage
        # alone can miss some; /proc is sampled as well and the larger figure kept.
        tree = TreeSampler(command.pid).start()
        if command.wait() != 0:
            tree.stop()
            raise SystemExit(f"onceflow spark replay exited {command.returncode}")
        spark_wall = time.perf_counter() - start
        tree.stop()
        spark_cpu_driver = cpu_seconds() - cpu
        spark_cpu = max(spark_cpu_driver, tree.total_cpu())
        # The Python workers run `python -m onceflow.pipeline.worker_daemon`; the JVM's
        # command line names that module too (spark.python.daemon.module), so the marker
        # holds the "-m": with "worker_daemon" alone this line reported the JVM's RSS.
        worker, jvm = "-m onceflow.pipeline.worker_daemon", "java "
        worker_peak, jvm_peak = tree.peak_of(worker), tree.peak_of(jvm)
        worker_cpu, jvm_cpu = tree.cpu_of(worker), tree.cpu_of(jvm)
        summary = orjson.loads((output / "summary.json").read_bytes())
        spark_job = summary["seconds"]
        spark_lines = b"".join(p.read_bytes() for p in
                               sorted((output / "journal.jsonl").glob("part-*"))).split(b"\n")

        journal = Path(tmp) / "replay.jsonl"
        cpu = cpu_seconds()
        start = time.perf_counter()
        with journal.open("wb") as out:
            subprocess.run([str(onceflow), "replay", str(folder)], stdout=out, check=True)
        replay_wall = time.perf_counter() - start
        replay_cpu = cpu_seconds() - cpu
        load_after = os.getloadavg()[0]
        replay_lines = journal.read_bytes().split(b"\n")
        identical = contract_multiset(spark_lines) == contract_multiset(replay_lines)

    n = args.documents
    spark_rate, job_rate, replay_rate = n / spark_wall, n / spark_job, n / replay_wall
    print(f"documents                    {n:>12,}")
    print(f"journal records (spark)      {sum(1 for x in spark_lines if x.strip()):>12,}")
    print(f"journal records (replay)     {sum(1 for x in replay_lines if x.strip()):>12,}")
    print(f"onceflow spark replay        {spark_rate:>12,.0f} documents/s end to end "
          f"({spark_wall:.1f} s, {args.master}, JVM start and writes included)")
    print(f"  within the job             {job_rate:>12,.0f} documents/s ({spark_job:.1f} s: "
          f"{summary['passes']} pass(es) and the JSON-lines exports)")
    print(f"onceflow replay              {replay_rate:>12,.0f} documents/s "
          f"({replay_wall:.1f} s, one process)")
    print(f"ratio spark/replay           {spark_rate / replay_rate:>12.2f} end to end, "
          f"{job_rate / replay_rate:.2f} within the job")
    spark_us, replay_us = spark_cpu / n * 1e6, replay_cpu / n * 1e6
    print(f"CPU per document             {spark_us:>12.1f} us spark (every process of the "
          f"command, {spark_cpu:.1f} s), {replay_us:.1f} us replay ({replay_cpu:.1f} s)")
    print(f"  of which                   {jvm_cpu / n * 1e6:>12.1f} us the JVM, "
          f"{worker_cpu / n * 1e6:.1f} us the Python workers, the rest the driver "
          f"(as sampled every 0.2 s)")
    print(f"ratio of CPU spark/replay    {spark_us / replay_us:>12.2f} (target <= 2: "
          f"{'met' if spark_us <= 2 * replay_us else 'NOT met'})")
    print(f"JVM peak RSS                 {jvm_peak:>12.0f} MiB")
    print(f"Python worker peak RSS       {worker_peak:>12.0f} MiB (the largest of onceflow's "
          f"Python workers; run with several --documents to see whether it grows)")
    print(f"results identical            {'yes' if identical else 'NO'} (journal multisets)")
    print(f"target 50,000 documents/s    end to end {'met' if spark_rate >= 50_000 else 'NOT met'}"
          f", within the job {'met' if job_rate >= 50_000 else 'NOT met'}")
    print(f"class-data archive           {class_data}")
    print(f"load average                 {load_before:.2f} before, {load_after:.2f} after "
          f"({os.cpu_count()} cores); spark driver CPU {spark_cpu_driver:.1f} s")


if __name__ == "__main__":
    main()
