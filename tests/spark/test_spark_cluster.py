"""A standalone Spark cluster on this machine: `spark replay` and `spark audit` on it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from onceflow.app.broker import free_port
from onceflow.app.replay import replay_scenario
from onceflow.journal import contract_key
from onceflow.scenario import load_scenario

from .support import multiset

pytestmark = pytest.mark.spark

# The JVMs of this short run (master, worker, executor) compile with C1 only and collect
# with one thread, as onceflow's local runs do (pipeline/session.py): C2 and parallel GC
# threads cost more CPU than they save in a run this short.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_class() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "bin" / "spark-class"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A master and one worker (2 cores, 1 GB), bound to 127.0.0.1 on free ports."""
    folder = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m",
           "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS,
           "SPARK_WORKER_DIR": str(folder / "work"), "SPARK_NO_DAEMONIZE": "1"}
    port, ui = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        for name, args in (
            ("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", str(port), "--webui-port", str(ui)]),
            ("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--port", str(free_port()), "--webui-port", str(free_port()),
                        "--cores", "2", "--memory", "1g", url]),
        ):
            with open(folder / f"{name}.log", "wb") as log:
                started.append(subprocess.Popen([str(spark_class()), *args], env=env,
                                                stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True))
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                    state = json.load(r)
                if any(w.get("state") == "ALIVE" for w in state.get("workers", [])):
                    break
            except (OSError, ValueError):
                # Not up yet, or up and answering /json/ with its HTML page before the
                # JSON handler is in place (seen once on a loaded machine): ask again.
                pass
            for process in started:
                assert process.poll() is None, (folder / "master.log").read_text()[-3000:] + (
                    (folder / "worker.log").read_text()[-3000:])
            assert time.monotonic() < deadline, "the worker did not register with the master"
            time.sleep(0.5)
        yield url
    finally:
        for process in reversed(started):
            _stop(process)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from generate import generate_lines, write_scenario

    return write_scenario(tmp_path_factory.mktemp("cluster-archive") / "scenario",
                          generate_lines(2000, seed=5))


# One driver for both commands (a driver and its executor are two more JVMs to start):
# the session is built as the CLI builds it, and each command finds it running.
DRIVER = r"""
import json
import sys
from onceflow.app.cli import main
from onceflow.pipeline.session import build_session, stop_session

replay, audit, conf = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:]
spark = build_session(conf=[tuple(item.split("=", 1)) for item in conf])
try:
    assert spark.sparkContext.master.startswith("spark://"), spark.sparkContext.master
    sys.stdout.write("replay exit %d\n" % main(["spark", "replay", *replay]))
    sys.stdout.write("audit exit %d\n" % main(["spark", "audit", *audit]))
finally:
    stop_session(spark)
"""


def test_replay_and_audit_on_a_standalone_cluster(cluster: str, archive: Path,
                                                  tmp_path: Path) -> None:
    output = tmp_path / "out"
    from onceflow.pipeline.session import quiet_log4j_file

    # The driver's JVM too (a session on a cluster sets no JVM options of its own; with C2
    # and the parallel collector the driver alone spent about 31 s of CPU here).
    driver_options = f"{JVM_OPTIONS} -Dlog4j.configurationFile=file:{quiet_log4j_file()}"
    conf = [f"spark.master={cluster}", "spark.executor.memory=512m", "spark.cores.max=2",
            f"spark.executor.extraJavaOptions={JVM_OPTIONS}",
            f"spark.driver.extraJavaOptions={driver_options}"]
    replay = ["--triggers", str(archive / "triggers.toml"), "--input",
              str(archive / "input.jsonl"), "--output", str(output)]
    audit = ["--input", str(archive), "--journal", str(output), "--report",
             str(tmp_path / "report.html"), "--quiet"]
    for item in conf:
        replay += ["--conf", item]
        audit += ["--conf", item]
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(replay),
                           json.dumps(audit), *conf],
                          capture_output=True, text=True, timeout=1800)
    assert "replay exit 0" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    # It ran on the cluster, with its settings: 2 tasks per core, not the local ones.
    assert f"on {cluster}, 4 partitions" in done.stderr, done.stderr[-2000:]
    lines = [line for part in sorted((output / "journal.jsonl").glob("part-*"))
             for line in part.read_bytes().splitlines() if line]
    journal, _, _ = replay_scenario(load_scenario(archive))
    expected = Counter(contract_key(record.as_dict()) for record in journal)
    got = multiset(lines)
    assert got == expected, f"missing: {expected - got}\nunexpected: {got - expected}"
    assert not (output / "_results").exists()
    assert "audit exit 0" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert "audit PASSED: 2000 input records" in done.stdout
