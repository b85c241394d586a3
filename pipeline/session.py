"""The Spark session the pipeline runs in, and stage progress in the terminal."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

# Spark and Hadoop log only errors; the pipeline says itself what it is doing.
_QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.spark.name = org.apache.spark
logger.spark.level = error
"""


def quiet_log4j_file() -> str:
    """A log4j2 configuration that keeps Spark's own logging to errors (written once)."""
    path = os.path.join(tempfile.gettempdir(), "onceflow-spark-log4j2.properties")
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(_QUIET_LOG4J)
    return path


def build_session(
    master: str | None = None,
    *,
    app_name: str = "onceflow",
    shuffle_partitions: int | None = None,
    conf: Sequence[tuple[str, str]] = (),
    quiet: bool = True,
) -> Any:
    """Get or create the SparkSession.

    Under spark-submit, the master and resources come from spark-submit; otherwise the
    session is local (`master`, default local[*]) with settings that suit one machine.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    # spark-submit starts the JVM first and hands the Python driver its gateway port.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is not None:
        builder = builder.master(master)
    local = (master or ("" if submitted else "local[*]")).startswith("local")
    if local and not submitted:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.master(master or "local[*]")
                   .config("spark.ui.enabled", "false")
                   .config("spark.driver.memory", "2g"))
    java_options = []
    if quiet:
        java_options.append(f"-Dlog4j.configurationFile=file:{quiet_log4j_file()}")
    if local and not submitted:
        # A local run lasts seconds to minutes and shares its cores with the Python
        # workers: the C2 compiler spent more CPU compiling Spark (about 30 s for a run
        # of 1M documents) than its faster code saved, and one GC thread is enough.
        java_options += ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
    if local and not submitted:
        # The workers run this interpreter: import pyspark from the installed package
        # rather than its source zip (worker_daemon.py).
        builder = builder.config("spark.python.daemon.module",
                                 "onceflow.pipeline.worker_daemon")
    builder = (builder.config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.adaptive.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.python.worker.reuse", "true"))
    if shuffle_partitions is None and local and not submitted:
        # A few tasks per core: the default of 200 tiny tasks costs more than it shares.
        cores = _local_cores(master or "local[*]")
        shuffle_partitions = 2 * cores
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in conf:
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def _local_cores(master: str) -> int:
    inside = master[master.find("[") + 1:master.find("]")] if "[" in master else "1"
    inside = inside.split(",")[0]
    if inside == "*":
        return os.cpu_count() or 1
    try:
        return max(1, int(inside))
    except ValueError:
        return os.cpu_count() or 1


class Progress:
    """Polls Spark's status tracker and shows the running stage of our jobs.

    On a terminal the line is redrawn in place; otherwise a line is written when the stage
    changes and every `interval` seconds, so logs of long runs show steady progress.
    """

    def __init__(self, spark: Any, stream: IO[str] | None = None,
                 interval: float = 10.0) -> None:
        self.context = spark.sparkContext
        self.stream = stream or sys.stderr
        self.interval = interval
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._label = ""
        self._stage_names: Sequence[str] = ()
        self._started = time.monotonic()

    @contextmanager
    def job(self, label: str, stage_names: Sequence[str] = ()) -> Iterator[None]:
        """Report the jobs run inside the block under `label`."""
        group = f"onceflow-{id(self)}-{label}"
        self.context.setJobGroup(group, f"onceflow: {label}")
        self._label, self._stage_names = label, stage_names
        self._started = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, args=(group,), daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()
            if self.tty:
                self.stream.write("\r\033[K")
            self.stream.write(f"onceflow: {label}: done in "
                              f"{time.monotonic() - self._started:.1f} s\n")
            self.stream.flush()
            self.context.setJobGroup("", "")

    def _poll(self, group: str) -> None:
        tracker = self.context.statusTracker()
        last_line = ""
        last_write = 0.0
        while not self._stop.wait(0.5):
            try:
                line = self._describe(tracker, group)
            except Exception:  # the JVM is going away: stop quietly
                return
            now = time.monotonic()
            if not line:
                continue
            if self.tty:
                self.stream.write("\r\033[K" + line)
                self.stream.flush()
            elif line.split(":")[0] != last_line.split(":")[0] or now - last_write >= (
                self.interval
            ):
                self.stream.write(line + "\n")
                self.stream.flush()
                last_write = now
            last_line = line

    def _describe(self, tracker: Any, group: str) -> str:
        elapsed = time.monotonic() - self._started
        for job_id in sorted(tracker.getJobIdsForGroup(group), reverse=True):
            job = tracker.getJobInfo(job_id)
            if job is None or job.status != "RUNNING":
                continue
            stage_ids = sorted(job.stageIds)
            for stage_id in tracker.getActiveStageIds():
                if stage_id not in stage_ids:
                    continue
                info = tracker.getStageInfo(stage_id)
                if info is None:
                    continue
                index = stage_ids.index(stage_id)
                names = self._stage_names
                name = names[index] if index < len(names) else f"stage {stage_id}"
                return (f"onceflow: {self._label} [{name}, stage {index + 1}/"
                        f"{len(stage_ids)}]: {info.numCompletedTasks}/{info.numTasks} "
                        f"tasks done, {info.numActiveTasks} running ({elapsed:.0f} s)")
        return ""
