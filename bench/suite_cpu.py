"""Benchmark: the CPU `make test` spends, and where: the suite in a cgroup of its own.

The suite's wall time on 2 cores follows its CPU (its processes keep both cores busy), and
much of that CPU is spent outside pytest's own processes: the JVMs of Spark, the brokers,
the workers forked by tests/forkserver.py, podman's build.  `time` sees only the children
a process waited for.  This runs `make test` itself (its settings, its number of processes unless
`--processes` says another) inside a cpuacct cgroup (cgroup v1) or a cgroup v2 group made for the
run, with each pytest-xdist process in a group of its own below it, so everything each
starts is counted, and prints:

- the wall time, the CPU of the whole run, and CPU / cores: the least wall time these
  tests could take on this machine if nothing ever waited;
- the CPU and the wall time of each test module (a test's CPU is its process group's
  during the test: fixtures it starts are counted where they run).

Needs root (it writes under /sys/fs/cgroup).  Other work on the machine does not enter
the counts, though it slows the run.

    .venv/bin/python bench/suite_cpu.py [--processes N] [--top 30] [-- PYTEST ARGS...]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup/unified")
ENV_GROUP = "ONCEFLOW_SUITE_CGROUP"
ENV_OUT = "ONCEFLOW_SUITE_TIMELINE"


def group_cpu(group: Path) -> float:
    """CPU seconds used by a cgroup and everything below it."""
    usage = group / "cpuacct.usage"
    if usage.exists():
        return int(usage.read_text()) / 1e9
    for line in (group / "cpu.stat").read_text().splitlines():
        name, value = line.split()
        if name == "usage_usec":
            return int(value) / 1e6
    raise OSError(f"{group} has no CPU usage")


def join_group(group: Path) -> None:
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))


# -- the plugin, in each pytest process (-p suite_cpu) -----------------------------------

_started: dict[str, tuple[float, float]] = {}


def _own_group() -> Path | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or not os.environ.get(ENV_GROUP):
        return None
    return Path(os.environ[ENV_GROUP]) / worker


def pytest_configure(config: object) -> None:
    group = _own_group()
    if group is not None:
        join_group(group)


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    group = _own_group()
    if group is not None:
        _started[nodeid] = (time.time(), group_cpu(group))


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    group = _own_group()
    if group is None or nodeid not in _started:
        return
    start, cpu = _started.pop(nodeid)
    line = {"test": nodeid, "start": start, "end": time.time(), "cpu": group_cpu(group) - cpu}
    with open(os.environ[ENV_OUT], "a") as out:
        out.write(json.dumps(line) + "\n")


# -- the driver ----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, help="TEST_PROCESSES (default: the Makefile's)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    base = V1 if V1.is_dir() else V2
    group = base / f"onceflow-suite-{os.getpid()}"
    group.mkdir()
    handle, name = tempfile.mkstemp(prefix="onceflow-suite-", suffix=".jsonl")
    os.close(handle)  # the test processes append to it by name
    timeline = Path(name)
    # `make test`, with this file as a plugin of its pytest and the arguments given here.
    env = {**os.environ, ENV_GROUP: str(group), ENV_OUT: str(timeline),
           "PYTEST_ADDOPTS": shlex.join(["-p", "suite_cpu", *args.pytest_args]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "bench"),
                                                       os.environ.get("PYTHONPATH")]))}
    command = ["make", "--no-print-directory", "test"]
    if args.processes is not None:
        command.append(f"TEST_PROCESSES={args.processes}")
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env,
                          preexec_fn=lambda: join_group(group / "main"))
    wall = time.monotonic() - started
    total = group_cpu(group)
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, float("inf"), 0.0])
    first = None
    for line in timeline.read_text().splitlines():
        row = json.loads(line)
        first = row["start"] if first is None else min(first, row["start"])
        found = modules[row["test"].split("::")[0]]
        found[0] += row["cpu"]
        found[1] += row["end"] - row["start"]
        found[2] = min(found[2], row["start"])
        found[3] = max(found[3], row["end"])
    cores = os.cpu_count() or 1
    print(f"make test exited {done.returncode}; wall {wall:.0f} s; CPU {total:.0f} s on {cores} "
          f"cores: at least {total / cores:.0f} s of wall time; load "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(f"{'CPU s':>7} {'wall s':>7} {'from':>6} {'to':>6}  module")
    for name, (cpu, spent, start, end) in sorted(modules.items(),
                                                 key=lambda item: -item[1][0])[:args.top]:
        print(f"{cpu:7.1f} {spent:7.1f} {start - first:6.0f} {end - first:6.0f}  {name}")
    print(f"(every test's line: {timeline})")
    for below in [*group.iterdir()]:
        if below.is_dir():
            try:
                below.rmdir()  # empty once its processes are gone
            except OSError:
                pass
    try:
        group.rmdir()
    except OSError:
        print(f"(the cgroup {group} still has processes)")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
