"""The `onceflow spark ...` commands and `onceflow replay --spark`.

pyspark is imported only when one of them runs, so the rest of the CLI starts fast.
"""

from __future__ import annotations

import argparse
import io
import sys
from itertools import chain, repeat
from pathlib import Path
from typing import Any

from onceflow.errors import OnceflowError
from onceflow.scenario import HistorySeed, load_scenario, read_history
from onceflow.triggers import TriggerSet, load_triggers


def add_spark_commands(commands: Any) -> None:
    """Add `spark replay` and `spark audit` to the CLI's subcommands."""
    spark = commands.add_parser(
        "spark", help="the Spark pipeline: replay archives at scale, audit journals",
        description="Run the same trigger semantics as `onceflow replay` over archives of "
        "records on Spark, and audit journals against the guarantees.")
    sub = spark.add_subparsers(dest="spark_command", required=True, metavar="{replay,audit}")
    replay = sub.add_parser(
        "replay", help="an archive through the triggers; journal and documents to files",
        description="Read an archive (JSON lines in the scenario record format and/or "
        "Parquet with the same columns; a file or a folder), run ingress per topic-"
        "partition and every trigger per routing key, and write the journal (Parquet and "
        "JSON lines) and the output, error, in-doubt and dead-letter documents.")
    replay.add_argument("--triggers", required=True, help="the triggers.toml file")
    replay.add_argument("--input", required=True, help="the archive: a file or folder")
    replay.add_argument("--output", required=True, help="the output folder (replaced)")
    replay.add_argument("--history", help="a history.jsonl of seed entries")
    _session_options(replay)
    audit = sub.add_parser(
        "audit", help="check a journal against an archive (spec section 6)",
        description="Check that every input record has a terminal outcome and that no "
        "service ran twice within its history TTL; write an HTML report; exit 1 when a "
        "guarantee is broken, naming the records.")
    audit.add_argument("--input", required=True, help="the archive (or a scenario folder)")
    audit.add_argument("--journal", required=True,
                       help="the journal: a `spark replay` output folder, Parquet, or JSON "
                       "lines (`onceflow replay` output)")
    audit.add_argument("--triggers", help="the triggers.toml file (default: the scenario's)")
    audit.add_argument("--report", default="report.html", help="the HTML report to write")
    audit.add_argument("--limit", type=int, default=200,
                       help="how many violations and documents to list (default 200)")
    _session_options(audit)


def _session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, or "
                        "local[*])")
    parser.add_argument("--partitions", type=int,
                        help="tasks per stateful stage (default: 2 per core)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _session(args: argparse.Namespace) -> Any:
    from .session import build_session

    pairs = []
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise OnceflowError(f"--conf {item!r}: expected KEY=VALUE")
        pairs.append((key, value))
    return build_session(args.master, conf=pairs, write_class_data=True)


def _triggers_for(args: argparse.Namespace) -> tuple[TriggerSet, str]:
    path = args.triggers
    if path is None:
        candidate = Path(args.input) / "triggers.toml"
        if not candidate.exists():
            raise OnceflowError("--triggers is needed (the input is not a scenario folder)")
        path = str(candidate)
    return load_triggers(path), str(Path(path).resolve().parent)


def _check_local(option: str, location: str | None) -> None:
    """OnceflowError, before Spark starts, when a local input does not exist."""
    if not location or ("://" in location and not location.startswith("file://")):
        return  # a cluster file system (hdfs://, s3a://...): Spark finds out
    path = Path(location.removeprefix("file://"))
    if not path.exists():
        raise OnceflowError(f"{option} {location}: no such file or folder")


def run_spark_command(args: argparse.Namespace) -> int:
    """`onceflow spark replay|audit`."""
    _check_local("--input", args.input)
    if getattr(args, "journal", None):
        _check_local("--journal", args.journal)
    if getattr(args, "history", None):
        _check_local("--history", args.history)
    triggers, base_dir = _triggers_for(args)
    seeds: list[HistorySeed] = []
    if getattr(args, "history", None):
        seeds = list(read_history(Path(args.history), {t.name for t in triggers.triggers}))
    from pyspark.sql import SparkSession

    from .session import stop_session

    # A session someone else started (a notebook, a test run) is used and left running.
    started_here = SparkSession.getActiveSession() is None
    spark = _session(args)
    try:
        return _run(spark, args, triggers, base_dir, seeds)
    except OnceflowError:
        raise
    except Exception as exc:  # a Spark job failed: say so in one line, not a JVM trace
        print(f"onceflow: the Spark job failed: {describe_failure(exc)}", file=sys.stderr)
        return 1
    finally:
        if started_here:
            stop_session(spark)


def describe_failure(exc: BaseException) -> str:
    """What went wrong, in one line: the innermost Java cause of a JVM error.

    A Py4JJavaError reads "An error occurred while calling o42.getFileSystem"; what the
    operator needs is its root cause ("UnsupportedFileSystemException: No FileSystem
    for scheme "s3a"").
    """
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            while java.getCause() is not None and java.getCause() is not java:
                java = java.getCause()
            name = str(java.getClass().getSimpleName())
            message = str(java.getMessage() or "").strip()
        except Exception:  # the JVM is gone: fall back to the Python text
            pass
        else:
            text = f"{name}: {message}" if message else name
            if "No FileSystem for scheme" in message or (
                    name == "ClassNotFoundException" and "FileSystem" in message):
                text += (" (the file system's connector is not on Spark's class path: add "
                         "it, e.g. --packages org.apache.hadoop:hadoop-aws:3.5.0 for s3a; "
                         "see docs/spark.md)")
            return _first_line(text)
    return f"{type(exc).__name__}: {_first_line(str(exc))}"


def _first_line(text: str) -> str:
    # A Python worker's error comes as its traceback: its last line says what failed.
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if any("Traceback (most recent call last)" in line for line in lines):
        return lines[-1]
    return lines[0]


def _run(spark: Any, args: argparse.Namespace, triggers: TriggerSet, base_dir: str,
         seeds: list[HistorySeed]) -> int:
    from .archive import list_archive
    from .session import Progress

    archive = list_archive(spark, args.input)
    progress = Progress(spark, interval=10.0) if not args.quiet else None
    if args.spark_command == "replay":
        from .plan import ReplayPlan, default_partitions
        from .replay import replay_to_files

        partitions = args.partitions or default_partitions(spark, archive)
        plan = ReplayPlan(triggers, base_dir, seeds, partitions=partitions)
        summary = replay_to_files(spark, archive, plan, args.output,
                                  progress or Progress(spark, stream=io.StringIO()))
        _print_summary(summary.counts, summary.held)
        print(f"{len(archive.files)} file(s), {summary.passes} pass(es), "
              f"{summary.seconds:.1f} s on {spark.sparkContext.master}, {partitions} "
              f"partitions; results in {args.output}", file=sys.stderr)
        return 0
    from .audit import run_audit
    from .report import write_report

    if progress is not None:
        with progress.job("audit"):
            result = run_audit(spark, archive, args.journal, triggers,
                               partitions=args.partitions, limit=args.limit,
                               step=progress.step)
    else:
        result = run_audit(spark, archive, args.journal, triggers,
                           partitions=args.partitions, limit=args.limit)
    write_report(result, args.report, archive=args.input, journal=args.journal)
    for violation in result.violations:
        print(f"violation ({violation.check}): {violation.message}")
    if result.violation_count > len(result.violations):
        print(f"... and {result.violation_count - len(result.violations)} more")
    verdict = "PASSED" if result.passed else f"FAILED ({result.violation_count} violations)"
    print(f"audit {verdict}: {result.records} input records, {result.journal_records} "
          f"journal records; report: {args.report}")
    return 0 if result.passed else 1


def _print_summary(counts: dict[tuple[str | None, str], int], held: dict[str, int]) -> None:
    from onceflow.journal import summary_table

    # The table counts records: one row object per (trigger, outcome), repeated.
    rows = chain.from_iterable(repeat({"trigger": t, "outcome": o}, n)
                               for (t, o), n in counts.items())
    sys.stdout.write(summary_table(rows))
    for name, count in sorted(held.items()):
        sys.stdout.write(f"trigger {name!r} is suspended; {count} document(s) stay "
                         f"unacknowledged\n")


def replay_on_spark(path: str, *, summary: bool = False, outputs: str | None = None,
                    master: str | None = None) -> int:
    """`onceflow replay --spark SCENARIO_DIR`: the scenario through the Spark pipeline.

    Prints the journal exactly as `onceflow replay` does (or its summary table).
    """
    from pyspark.sql import SparkSession

    from .archive import list_archive
    from .plan import ReplayPlan
    from .replay import document_lines, journal_lines, replay_in_memory
    from .session import build_session, stop_session

    scenario = load_scenario(path)
    # A session someone else started (a notebook, a test run) is used and left running.
    started_here = SparkSession.getActiveSession() is None
    spark = build_session(master or "local[2]", shuffle_partitions=2, write_class_data=True)
    try:
        plan = ReplayPlan(scenario.triggers, str(scenario.path.resolve()), scenario.history,
                          partitions=2)
        table, result = replay_in_memory(spark, list_archive(spark, str(scenario.path)),
                                         plan)
    finally:
        if started_here:
            stop_session(spark)
    if summary:
        _print_summary(result.counts, result.held)
    else:
        stream = sys.stdout.buffer
        for line in journal_lines(table):
            stream.write(line + b"\n")
    if outputs:
        folder = Path(outputs)
        folder.mkdir(parents=True, exist_ok=True)
        for topic, lines in document_lines(table).items():
            (folder / f"{topic}.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    sys.stdout.flush()
    return 0
