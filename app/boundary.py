"""What a failed command says: one line on stderr and an exit code, never a traceback.

Every `onceflow` command runs inside `error_boundary`.  Errors onceflow raises on purpose
(OnceflowError) carry their own message; errors of the libraries it uses (Kafka, HTTP,
files, ports, settings) are put in words with what to do.  Anything else is a bug: one line
naming it, and `ONCEFLOW_DEBUG=1` prints the traceback.

Exit codes: 2 a wrong input or setting (a file, a trigger file, an argument), 3 the broker
or a worker cannot be reached, 4 the operating system refused (a file, a port), 70 an
unexpected error, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable

from onceflow.errors import OnceflowError

EXIT_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_SYSTEM = 4
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


def debugging() -> bool:
    """Whether ONCEFLOW_DEBUG asks for tracebacks."""
    return os.environ.get("ONCEFLOW_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def say(message: str) -> None:
    """One line on stderr, prefixed `onceflow: `."""
    line = " ".join(message.split("\n")) if message else "failed"
    if not line.isprintable():  # text from a file, a record or a server: no escape codes
        line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
    try:
        print(f"onceflow: {line}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass


def explain(exc: BaseException) -> tuple[str, int]:
    """(message, exit code) for an exception that ended a command."""
    from .process import WorkerUnreachable
    from .security import ConnectionFailed

    if isinstance(exc, WorkerUnreachable | ConnectionFailed):
        return str(exc), EXIT_UNREACHABLE
    if isinstance(exc, OnceflowError):
        return str(exc), EXIT_INPUT
    kafka = _kafka_error(exc)
    if kafka is not None:
        return kafka
    if isinstance(exc, OSError):
        return _os_error(exc), EXIT_SYSTEM
    if type(exc).__name__ == "ValidationError":  # pydantic, outside WorkerSettings.from_env
        return f"invalid settings: {_first_line(exc)}", EXIT_INPUT
    hint = "" if debugging() else "; rerun with ONCEFLOW_DEBUG=1 for the traceback"
    return (f"unexpected error ({type(exc).__name__}: {_first_line(exc)}){hint}; "
            "please report it", EXIT_INTERNAL)


def error_boundary(run: Callable[[], int]) -> int:
    """Run a command; turn whatever it raises into one line and an exit code."""
    try:
        return run()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except SystemExit:
        raise
    except BaseException as exc:  # the boundary: nothing gets past it as a traceback
        if debugging():
            traceback.print_exc()
        message, code = explain(exc)
        say(message)
        return code


def _kafka_error(exc: BaseException) -> tuple[str, int] | None:
    try:
        from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
    except ImportError:  # pragma: no cover - aiokafka is a dependency
        return None
    if isinstance(exc, KafkaConnectionError | KafkaTimeoutError):
        servers = os.environ.get("ONCEFLOW_BROKER_URL", "kafka://127.0.0.1:9092")
        return (f"cannot reach the broker at {servers}: {_first_line(exc) or 'no answer'} "
                "(check ONCEFLOW_BROKER_URL and that the broker runs)", EXIT_UNREACHABLE)
    if isinstance(exc, KafkaError):
        name = type(exc).__name__
        text = _first_line(exc)
        return (f"the broker refused: {name}{': ' + text if text and text != name else ''}",
                EXIT_INPUT)
    return None


def _os_error(exc: OSError) -> str:
    where = f" {exc.filename}" if exc.filename is not None else ""
    reason = (exc.strerror or _first_line(exc) or type(exc).__name__).lower()
    if exc.errno == errno.EADDRINUSE:
        return f"address already in use{where}: another process listens there"
    if isinstance(exc, FileNotFoundError):
        return f"cannot open{where}: no such file or directory"
    if isinstance(exc, PermissionError):
        return f"cannot open{where}: permission denied"
    if isinstance(exc, IsADirectoryError):
        return f"cannot open{where}: it is a folder, not a file"
    return f"{reason}{':' + where if where else ''}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""
