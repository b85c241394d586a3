"""The Spark session the pipeline runs in, and stage progress in the terminal."""

from __future__ import annotations

import os
import shutil
import subprocess
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
    write_class_data: bool = False,
) -> Any:
    """Get or create the SparkSession.

    Under spark-submit, the master and resources come from spark-submit; otherwise the
    session is local (`master`, default local[*]) with settings that suit one machine.
    A local session's JVM maps the archive of Spark's classes (`class_data_options`);
    with `write_class_data`, one that finds none writes it when `stop_session` ends it.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    # spark-submit starts the JVM first and hands the Python driver its gateway port.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    settings = dict(conf)
    # The master: --master, else --conf spark.master, else spark-submit's, else local.
    master = master or settings.get("spark.master")
    if master is not None:
        builder = builder.master(master)
    local = not submitted and (master or "local[*]").startswith("local")
    address = None if submitted else driver_address(master or "local[*]")
    if address is not None:
        # The address this machine reaches the master from, so that a cluster's workers
        # can reach the driver too (a local master: the loopback address).
        os.environ.setdefault("SPARK_LOCAL_IP", address)
    if local:
        # Shuffle files stay on this machine: compressing them (lz4) spends the JVM's
        # CPU, which the Python workers share, to save disk writes that mostly stay in the
        # page cache.
        builder = (builder.master(master or "local[*]")
                   .config("spark.ui.enabled", "false")
                   .config("spark.driver.memory", "2g")
                   .config("spark.shuffle.compress", "false")
                   .config("spark.shuffle.spill.compress", "false"))
    java_options = driver_java_options(quiet, local)
    if local:
        class_data, pending = class_data_options(java_options, conf, write_class_data)
        java_options += class_data
    else:
        pending = None
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
    if local:
        # The workers run this interpreter: import pyspark from the installed package
        # rather than its source zip (worker_daemon.py).
        builder = builder.config("spark.python.daemon.module",
                                 "onceflow.pipeline.worker_daemon")
    builder = (builder.config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.adaptive.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.python.worker.reuse", "true"))
    if shuffle_partitions is None and local:
        # A few tasks per core: the default of 200 tiny tasks costs more than it shares.
        cores = _local_cores(master or "local[*]")
        shuffle_partitions = 2 * cores
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in conf:
        builder = builder.config(key, value)
    started = SparkSession.getActiveSession() is None
    spark = builder.getOrCreate()
    if (started and not local and shuffle_partitions is None
            and "spark.sql.shuffle.partitions" not in settings
            and not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions")):
        # A cluster's cores are known once the session runs: the default of 200 shuffle
        # partitions made thousands of tiny tasks (an audit of 200k documents ran 4,247
        # tasks in 380 s, against 131 tasks in 80 s with 4).
        spark.conf.set("spark.sql.shuffle.partitions",
                       str(max(2, 2 * int(spark.sparkContext.defaultParallelism))))
    if pending is not None and started:
        _PENDING_CLASS_DATA[id(spark)] = pending
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def driver_java_options(quiet: bool, local: bool) -> list[str]:
    """The driver JVM's options (before the class-data archive's)."""
    java_options = []
    if quiet:
        java_options.append(f"-Dlog4j.configurationFile=file:{quiet_log4j_file()}")
    if local:
        # A local run lasts seconds to minutes and shares its cores with the Python
        # workers: with C2 the JVM spent about 10 s more CPU on a run of 1M documents
        # (compiling more than its faster code saved), and one GC thread is enough.
        java_options += ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    return java_options


# Class-data archives: HotSpot's application class-data sharing (CDS).  A local run spent
# about 5 of its first seconds loading and verifying Spark's classes from 280 jars, on one
# core, before any work; a JVM that maps an archive of them (written once by the JVM at
# exit, -XX:ArchiveClassesAtExit) starts its session and first job about 2.5 s sooner.
# The archive names the JVM, Spark's jars and the JVM options it was made with, so an
# upgrade makes a new one; the JVM itself checks it and runs without when it does not fit.
CLASS_DATA_ENV = "ONCEFLOW_SPARK_CLASS_DATA"
_PENDING_CLASS_DATA: dict[int, tuple[str, str]] = {}
_QUIET_CDS = ["-Xlog:cds=off", "-Xlog:cds+dynamic=off"]


def class_data_folder() -> str:
    """Where the archives live: $XDG_CACHE_HOME/onceflow (default ~/.cache/onceflow)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                              ".cache")
    return os.path.join(cache, "onceflow")


def class_data_options(java_options: Sequence[str], conf: Sequence[tuple[str, str]],
                       write: bool) -> tuple[list[str], tuple[str, str] | None]:
    """JVM options that map this Spark's class-data archive, or write it at exit.

    Returns the options and, when this JVM is to write the archive, (temporary file,
    archive).  None of it when ONCEFLOW_SPARK_CLASS_DATA=0 or nothing can be found.
    """
    if os.environ.get(CLASS_DATA_ENV, "1").lower() in ("0", "false", "no", "off"):
        return [], None
    path = _class_data_path(java_options, conf)
    if path is None:
        return [], None
    if os.path.isfile(path):
        return [f"-XX:SharedArchiveFile={path}", *_QUIET_CDS], None
    if not write:
        return [], None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        _remove_abandoned(os.path.dirname(path))
    except OSError:
        return [], None
    if not os.access(os.path.dirname(path), os.W_OK):
        return [], None  # the JVM could not write it there
    temporary = f"{path}.{os.getpid()}.tmp"
    return [f"-XX:ArchiveClassesAtExit={temporary}", *_QUIET_CDS], (temporary, path)


def class_data_missing(conf: Sequence[tuple[str, str]] = (), quiet: bool = True) -> bool:
    """Whether a local run with these settings would write a class-data archive.

    True when class_data_options would have the JVM write one: archives are on, none is
    there for this JVM, Spark's jars and options, and the folder can take one (else
    asking again would be asking for a replay each time).
    """
    return class_data_options(driver_java_options(quiet, True), conf, write=True)[1] is not None


def _class_data_path(java_options: Sequence[str], conf: Sequence[tuple[str, str]]
                     ) -> str | None:
    import hashlib

    try:
        import pyspark
        from pyspark.find_spark_home import _find_spark_home

        home = os.environ.get("JAVA_HOME")
        java = os.path.join(home, "bin", "java") if home else shutil.which("java")
        if java is None:
            return None
        java = os.path.realpath(java)
        jars = os.path.join(_find_spark_home(), "jars")
        key = hashlib.sha256()
        stat = os.stat(java)
        key.update(f"{java} {stat.st_size} {stat.st_mtime_ns}\n".encode())
        for entry in sorted(os.scandir(jars), key=lambda e: e.name):
            stat = entry.stat()
            key.update(f"{entry.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    except (ImportError, OSError):
        return None
    for option in sorted(java_options):
        key.update(option.encode() + b"\n")
    for name, value in sorted(conf):
        if "classpath" in name.lower() or name.startswith("spark.jars"):
            key.update(f"{name}={value}\n".encode())
    version = getattr(pyspark, "__version__", "unknown")
    return os.path.join(class_data_folder(), f"spark-{version}-{key.hexdigest()[:16]}.jsa")


def _remove_abandoned(folder: str) -> None:
    """Temporary archives of runs that are gone (killed before their JVM finished)."""
    for name in os.listdir(folder):
        parts = name.split(".")
        if name.endswith(".tmp") and len(parts) > 2 and parts[-2].isdigit():
            try:
                os.kill(int(parts[-2]), 0)
            except ProcessLookupError:
                os.remove(os.path.join(folder, name))
            except OSError:
                pass


def stop_session(spark: Any) -> None:
    """Stop the session; a JVM that writes the class-data archive is let exit to write it.

    Writing it takes a few seconds, once.  The JVM writes a temporary file, renamed when
    it exited cleanly, so that no run ever maps half an archive.
    """
    pending = _PENDING_CLASS_DATA.pop(id(spark), None)
    spark.stop()
    if pending is None:
        return
    from pyspark import SparkContext

    temporary, path = pending
    process = getattr(SparkContext._gateway, "proc", None)
    try:
        if process is None or process.stdin is None:
            return
        print(f"onceflow: saving Spark's classes for faster starts (once, about 160 MB in "
              f"{os.path.dirname(path)}; {CLASS_DATA_ENV}=0 turns this off)", file=sys.stderr)
        process.stdin.close()  # the gateway JVM exits at the end of its stdin
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            return
        SparkContext._gateway = None
        SparkContext._jvm = None
        if process.returncode == 0 and os.path.isfile(temporary):
            os.replace(temporary, path)
            remove_old_archives(os.path.dirname(path), path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


# Archives kept in the folder, the newest first: those of other virtual environments on
# the machine (another checkout, another Spark) stay, so that two of them used in turn do
# not write theirs again each time (about 15 s of CPU and 160 MB each); older ones go.
KEPT_ARCHIVES = 3


def remove_old_archives(folder: str, keep: str) -> None:
    """Remove the archives beyond the KEPT_ARCHIVES newest, never `keep`."""
    others = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.startswith("spark-") and name.endswith(".jsa") and path != keep:
            try:
                others.append((os.stat(path).st_mtime_ns, path))
            except OSError:
                continue
    for _, stale in sorted(others, reverse=True)[KEPT_ARCHIVES - 1:]:
        try:
            os.remove(stale)
        except OSError:
            pass


def driver_address(master: str) -> str | None:
    """The local address that reaches the master: the loopback one for a local master.

    A datagram socket "connected" to the master sends nothing; it only asks the kernel
    which interface would be used.  The master URL's host is its first host
    (spark://a:7077,b:7077 for standby masters).  None when the URL names no host (yarn):
    Spark's own choice stands.
    """
    import socket
    from urllib.parse import urlsplit

    if master.startswith("local"):
        return "127.0.0.1"
    try:
        parts = urlsplit(master.split(",")[0])
        host, port = parts.hostname, parts.port or 7077
    except ValueError:
        return None
    if not host or parts.scheme not in ("spark", "mesos"):
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), port))
            return str(probe.getsockname()[0])
    except OSError:
        return None


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
        self._step = ""
        self.records: int | None = None  # input records, when known: rate shown
        self._seen: dict[int, float] = {}  # stage id -> when it was first seen running

    @contextmanager
    def job(self, label: str, stage_names: Sequence[str] = (),
            records: int | None = None) -> Iterator[None]:
        """Report the jobs run inside the block under `label` (`records`: its input)."""
        group = f"onceflow-{id(self)}-{label}"
        self.context.setJobGroup(group, f"onceflow: {label}")
        self._label, self._stage_names = label, stage_names
        self.records, self._step, self._seen = records, "", {}
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

    def step(self, name: str, records: int | None = None) -> None:
        """Name what the block does now (stages are shown under it); records, once known."""
        self._step = name
        if records is not None:
            self.records = records

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
                name = names[index] if index < len(names) else (self._step or
                                                                  f"stage {stage_id}")
                seen = self._seen.setdefault(stage_id, time.monotonic())
                return (f"onceflow: {self._label} [{name}, stage {index + 1}/"
                        f"{len(stage_ids)}]: {info.numCompletedTasks}/{info.numTasks} "
                        f"tasks done, {info.numActiveTasks} running ({elapsed:.0f} s)"
                        + pace(info.numCompletedTasks, info.numTasks,
                               time.monotonic() - seen, self.records))
        return ""


def pace(done: int, tasks: int, seconds: float, records: int | None) -> str:
    """", ~N records/s, ETA M s" of a stage from its finished share of tasks.

    Tasks of one stage read about equal slices of the input, so the share of tasks done
    is the share of records done.  Nothing before the first task has finished.
    """
    if done <= 0 or tasks <= 0 or seconds <= 0:
        return ""
    share = min(done / tasks, 1.0)
    out = ""
    if records:
        out += f", ~{records * share / seconds:,.0f} records/s"
    remaining = seconds * (1 - share) / share
    return out + f", ETA {remaining:.0f} s"
