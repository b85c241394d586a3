"""A worker as a child process: started, waited for, stopped or killed (live runs, tests)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import httpx
from onceflow.errors import OnceflowError


class WorkerUnreachable(OnceflowError):
    """No worker answered at a web address (nothing listens there, or it did not answer)."""


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The default verifying context of httpx, made once per process.

    httpx builds a new one for every `httpx.request` (reading the whole CA bundle: about
    17 ms of CPU), even for an http:// address; polling a worker's /ready every 50 ms paid
    that on each poll (two thirds of the CPU of the tests that start workers).
    """
    return httpx.create_ssl_context()


def http_json(url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
              timeout: float = 5.0) -> tuple[int, Any]:
    """(status, decoded JSON body) of a request; the body is a string when not JSON.

    WorkerUnreachable (an OnceflowError: one line, no traceback) when no answer came:
    connection refused, an unknown host, a timeout, a malformed address.
    """
    try:
        response = httpx.request(method, url, headers=headers or {}, timeout=timeout,
                                 verify=_tls_context())
    except httpx.InvalidURL as exc:
        raise WorkerUnreachable(f"{url!r} is not a web address ({exc}); give it as "
                                "http://HOST:PORT") from None
    except httpx.UnsupportedProtocol:
        raise WorkerUnreachable(f"{url!r} is not a web address; give it as "
                                "http://HOST:PORT") from None
    except httpx.TimeoutException:
        raise WorkerUnreachable(
            f"the worker at {_origin(url)} did not answer within {timeout:g} s") from None
    except httpx.TransportError as exc:
        raise WorkerUnreachable(f"cannot reach a worker at {_origin(url)}: "
                                f"{_reason(exc)}") from None
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url


def _reason(exc: Exception) -> str:
    """The innermost OS reason of a transport error, in words ("connection refused")."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    text = str(exc).strip()
    return text[:200] if text else type(exc).__name__


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when the process that started it dies.

    The brokers and workers a command starts run in sessions of their own (Ctrl-C at the
    terminal is the command's to handle), so nothing else ends them: a command killed with
    SIGKILL left them running, re-parented to init.  Linux only (prctl PR_SET_PDEATHSIG);
    elsewhere the child outlives a killed parent as before.
    """
    parent = os.getpid()

    def arm() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), sig)

    return arm


@contextlib.contextmanager
def stopped_on_term() -> Iterator[None]:
    """SIGTERM ends the command as Ctrl-C does, stopping what it started.

    The `finally` blocks that stop its brokers and workers run (Python's default for
    SIGTERM exits at once, without them), and the command exits 143 (128 + SIGTERM).  Only
    in the main thread; elsewhere a no-op.
    """
    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch(args: list[str], env: dict[str, str], log: IO[bytes]) -> Any:
    """`python -m onceflow.app.cli ARGS` in a session of its own, its output into `log`.

    Returns the subprocess.Popen.  The worker gets SIGKILL when this process dies: a
    graceful stop would wait on a broker that may have gone with it (an embedded one),
    and a killed worker loses nothing (what it decided is durable).  (The tests start
    their workers from a fork server with the same command line: tests/forkserver.py.)
    """
    return subprocess.Popen([sys.executable, "-m", "onceflow.app.cli", *args], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=dies_with_parent(signal.SIGKILL))


class WorkerProcess:
    """`onceflow worker --triggers FILE` with ONCEFLOW_* settings from `env`."""

    def __init__(self, triggers: Path, env: dict[str, str], log_path: Path) -> None:
        self.triggers = triggers
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # wall-clock time of start()
        self._log: IO[bytes] | None = None

    @property
    def web_url(self) -> str:
        """Where its web views answer."""
        return f"http://127.0.0.1:{self.env['ONCEFLOW_WEB_PORT']}"

    def start(self) -> WorkerProcess:
        """Start the worker (not waiting for it)."""
        self._log = open(self.log_path, "ab")
        self.started_at = time.time()
        self.process = launch(["worker", "--triggers", str(self.triggers)],
                              {**os.environ, **self.env}, self._log)
        return self

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until the worker has joined the group and recovered its tables."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.process is None or self.process.poll() is not None:
                said = self.last_words()
                raise OnceflowError("the worker exited before it was ready"
                                    + (f": {said}" if said else f"; see {self.log_path}"))
            try:
                status, _ = http_json(self.web_url + "/ready", timeout=1.0)
                if status == 200:
                    return time.monotonic() - started
            except WorkerUnreachable:
                pass
            time.sleep(0.05)
        raise OnceflowError(f"the worker was not ready after {timeout} s; see {self.log_path}")

    def last_words(self) -> str:
        """The worker's last `onceflow: ...` line on stderr (why it stopped), if any."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        lines = [line for line in text.splitlines() if line.startswith("onceflow: ")
                 and not line.startswith("onceflow: worker for ")]
        return lines[-1].removeprefix("onceflow: ") if lines else ""

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, with nothing flushed or closed."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._close()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (graceful: leave the group, flush), SIGKILL if it takes too long."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._close()

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
