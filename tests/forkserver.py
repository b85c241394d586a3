"""Start the tests' workers by forking a process that has imported them already.

`make test` starts about 110 `onceflow worker` processes, and each spends about 0.6 s of
CPU importing Faust, aiokafka, pydantic and onceflow before it does anything (1.1 s in all
from start to ready to stop, measured 2026-11-26). The suite is bound by the CPU of two
cores, so the imports alone cost about half a minute of its wall time.

A fork server per test process imports the worker's modules once; each worker is then a
fork of it that runs the command line exactly as `python -m onceflow.app.cli worker ...`
does, in its own session, with its own environment, working directory and log. It is a
real process of its own: the tests signal it, kill it and read its exit status as before
(through `ForkedProcess`, which stands in for `subprocess.Popen`). ONCEFLOW_TEST_FORKSERVER=0
starts the workers with `subprocess.Popen` as the product does (app/process.py).

    python tests/forkserver.py SOCKET    # the server; conftest.py starts it
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# -- the server ----------------------------------------------------------------------------


def _reap(statuses: dict[int, int]) -> None:
    """Collect every child that has ended: pid -> Popen-style return code."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = os.waitstatus_to_exitcode(status)


def _child(request: dict[str, Any], server: socket.socket, conn: socket.socket) -> None:
    """In the forked child: become `python -m onceflow.app.cli ARGS` and never return."""
    import runpy

    code = 1
    try:
        server.close()
        conn.close()
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # stdin from a file (default nothing), stdout to the log, stderr to its own file
        # or to the log as well.
        streams = (os.open(request.get("stdin") or os.devnull, os.O_RDONLY),
                   os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
                   os.open(request.get("stderr") or request["log"],
                           os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        for fd, stream in enumerate(streams):
            os.dup2(stream, fd)
            os.close(stream)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        # As `python -m` sets it up: the working directory first, then the environment's
        # PYTHONPATH, then the interpreter's own paths (not this script's folder).
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *extra, *_BASE_PATH]
        sys.argv = ["onceflow", *request["argv"]]
        # As in a fresh interpreter, the command line module runs as __main__ only (runpy
        # warns about a module it runs that is imported already).
        sys.modules.pop("onceflow.app.cli", None)
        runpy.run_module("onceflow.app.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the worker's log, as Python would
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# The interpreter's module search path without this script's folder and the server's own
# PYTHONPATH (each worker gets its own: _child).
_OWN_PYTHONPATH = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
_BASE_PATH = [p for p in sys.path[1:] if p not in _OWN_PYTHONPATH]


PRELOADED = (
    "onceflow.app.cli", "onceflow.app.worker", "onceflow.agents.faust_app", "onceflow.app.web",
    "faust.worker", "faust.tables", "faust.web.drivers.aiohttp",
    "faust.web.cache.backends.memory",
)


def serve(path: str) -> None:
    """Import the worker's modules, then fork a worker for each request until orphaned."""
    import importlib

    # What a worker imports before it is ready (found with py-spy on forked workers): the
    # command line, the worker and its Faust app, the web views, Faust's worker, tables and
    # web driver.
    for module in PRELOADED:
        importlib.import_module(module)

    if threading.active_count() != 1:  # forking a process with threads is not safe
        sys.exit("forkserver: the imports started threads; not serving")
    import gc

    # What the imports made is never collected: the workers' collections skip it, and
    # leave the pages they share with the server unwritten.
    gc.freeze()
    parent = os.getppid()
    statuses: dict[int, int] = {}
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    server.settimeout(1.0)
    print("ready", flush=True)
    while os.getppid() == parent:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            _reap(statuses)
            continue
        with conn:
            conn.settimeout(10.0)
            request = json.loads(conn.makefile("rb").readline())
            _reap(statuses)
            if request["op"] == "spawn":
                pid = os.fork()
                if pid == 0:
                    _child(request, server, conn)
                reply: dict[str, Any] = {"pid": pid}
            else:  # "status"
                pid = request["pid"]
                reply = {"returncode": statuses.get(pid)}
            conn.sendall(json.dumps(reply).encode() + b"\n")


# -- the tests' side -----------------------------------------------------------------------


class ForkServer:
    """One server per test process, started on first use."""

    def __init__(self, folder: Path) -> None:
        self.path = str(folder / "forkserver.sock")
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30.0)
            conn.connect(self.path)
            conn.sendall(json.dumps(request).encode() + b"\n")
            answer: dict[str, Any] = json.loads(conn.makefile("rb").readline())
            return answer

    def _started(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._process = subprocess.Popen(
            [sys.executable, __file__, self.path], stdout=subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")})
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the fork server did not start: {line!r}")

    def spawn(self, argv: list[str], env: dict[str, str], log: Path, *,
              stderr: Path | None = None, stdin: Path | None = None,
              cwd: Path | None = None) -> ForkedProcess:
        """A process running `onceflow ARGV` with exactly `env`: its output appended to
        `log` (stderr to `stderr` when given), its input read from `stdin` (default none),
        in `cwd` (default this process's working directory)."""
        with self._lock:
            self._started()
            pid = self._ask({"op": "spawn", "argv": argv, "env": env,
                             "cwd": str(cwd or os.getcwd()), "log": str(log),
                             "stderr": str(stderr) if stderr else None,
                             "stdin": str(stdin) if stdin else None})["pid"]
        return ForkedProcess(self, pid, argv)

    def returncode(self, pid: int) -> int | None:
        """The process's exit status once it has ended (as Popen.returncode)."""
        with self._lock:
            code: int | None = self._ask({"op": "status", "pid": pid})["returncode"]
            return code

    def close(self) -> None:
        """Stop the server (its workers were stopped by their tests)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        import shutil

        shutil.rmtree(Path(self.path).parent, ignore_errors=True)


_SHARED: ForkServer | None = None


def shared() -> ForkServer | None:
    """This test process's fork server (started on first use), or None when
    ONCEFLOW_TEST_FORKSERVER=0 asks for processes started as the product starts them."""
    global _SHARED
    if os.environ.get("ONCEFLOW_TEST_FORKSERVER", "1") == "0":
        return None
    if _SHARED is None:
        import atexit
        import tempfile

        _SHARED = ForkServer(Path(tempfile.mkdtemp(prefix="onceflow-fork-")))
        atexit.register(_SHARED.close)
    return _SHARED


class ForkedProcess:
    """What the tests use of `subprocess.Popen`, for a process the fork server started."""

    def __init__(self, server: ForkServer, pid: int, argv: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; subprocess.TimeoutExpired after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, signum: int) -> None:
        """Signal the process, while it runs."""
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve(sys.argv[1])
