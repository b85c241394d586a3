"""A worker whose brokers are gone: not ready at once, quiet, and stopped after a bound.

Without this, a worker whose cluster went away kept answering /readyz 200 for about 45 s,
logged aiokafka's connection errors every 50 ms with tracebacks (about 5,000 lines in
75 s), then stopped with Faust's crash.  Here, once the Kafka clients have logged a
connection error, the worker checks every second that some bootstrap server accepts a
connection.  When none does it is not ready from that check on, the log lines of the
libraries are held back (they only repeat that the broker is gone) and one line says so
every few seconds; when a server answers again within
ONCEFLOW_BROKER_LOST_TIMEOUT the worker goes on (the clients reconnect by themselves),
and when none has by then it stops with one line and exit code 3.  Nothing is lost by
stopping: records are acknowledged only once what they decided is durable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from .boundary import EXIT_UNREACHABLE

CHECK_EVERY = 1.0  # seconds between checks
CONNECT_WITHIN = 2.0  # a server that has not accepted a connection by then does not answer
SAY_EVERY = 5.0  # seconds between the lines said while the brokers are gone

log = logging.getLogger("onceflow.broker")


# What aiokafka logs, many times a second, when it cannot reach a broker.
CONNECTION_NOISE = ("Connect call failed", "Unable connect to node", "NodeNotReadyError",
                    "Unable to update metadata", "KafkaConnectionError",
                    "Coordinator Request failed", "Failed fetch messages")


class LostBrokerQuiet(logging.Filter):
    """While the brokers are gone, only onceflow's own lines get through.

    Before a check has found them gone, a connection error of the libraries gets through
    once every SAY_EVERY seconds (the first one tells what happened).
    """

    def __init__(self, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.quiet = False
        self.clock = clock
        self.suspect = False  # a connection error was logged since the last check
        self._noise_at: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether the line gets through."""
        if record.name.startswith("onceflow"):
            return True
        message = record.getMessage()
        noise = any(marker in message for marker in CONNECTION_NOISE)
        if noise:
            self.suspect = True
        if self.quiet:
            return False
        if not noise:
            return True
        now = self.clock()
        if self._noise_at is not None and now - self._noise_at < SAY_EVERY:
            return False
        self._noise_at = now
        return True


async def any_server_answers(servers: list[tuple[str, int]]) -> bool:
    """Whether one of the servers accepts a TCP connection within CONNECT_WITHIN."""
    async def answers(host: str, port: int) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                               CONNECT_WITHIN)
        except (TimeoutError, OSError):
            return False
        writer.close()
        return True

    results = await asyncio.gather(*(answers(host, port) for host, port in servers))
    return any(results)


def servers_of(bootstrap: str) -> list[tuple[str, int]]:
    """(host, port) of a host:port,... list."""
    found = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        found.append((host.strip("[]"), int(port)))
    return found


class BrokerWatch:
    """Checks the brokers, marks the worker not ready, keeps the log quiet, stops it."""

    def __init__(self, health: Any, bootstrap: str, timeout: float, *,
                 clock: Any = time.monotonic) -> None:
        self.health = health
        self.bootstrap = bootstrap
        self.servers = servers_of(bootstrap)
        self.timeout = timeout
        self.clock = clock
        self.quiet = LostBrokerQuiet(clock)
        self._said_at = 0.0

    async def check(self) -> None:
        """One check (every CHECK_EVERY seconds): connect only when there is reason to.

        A connection a second would show in the brokers' own logs (a TLS listener logs
        each one that closes before its handshake), so the servers are tried only after
        the clients logged a connection error, and while they are gone.
        """
        self.install_once()  # Faust sets its handlers up when it starts
        quiet = self.quiet
        if not quiet.suspect and self.health.broker_lost_since is None:
            return
        quiet.suspect = False
        answered = await any_server_answers(self.servers)
        self.seen(answered)

    def seen(self, answered: bool) -> None:
        """What one check found."""
        now = self.clock()
        health = self.health
        if answered:
            if health.broker_lost_since is not None:
                log.warning("onceflow: the broker at %s answers again after %.0f s",
                            self.bootstrap, now - health.broker_lost_since)
            health.broker_lost_since = None
            self.quiet.quiet = False
            return
        if health.broker_lost_since is None:
            health.broker_lost_since = now
            self._said_at = 0.0
        self.quiet.quiet = True
        lost = now - health.broker_lost_since
        if lost >= self.timeout:
            self.stop(lost)
        if now - self._said_at >= SAY_EVERY:
            self._said_at = now
            log.warning("onceflow: no broker at %s has answered for %.0f s; the worker is not "
                        "ready, and stops if none answers within %g s "
                        "(ONCEFLOW_BROKER_LOST_TIMEOUT)", self.bootstrap, lost, self.timeout)

    def install_once(self) -> None:
        """Hold back the libraries' lines while the brokers are gone (every root handler)."""
        for handler in logging.getLogger().handlers:
            if self.quiet not in handler.filters:
                handler.addFilter(self.quiet)

    def stop(self, lost: float) -> None:
        """One line, exit code 3; no shutdown that would wait on the brokers."""
        message = (f"onceflow: no broker at {self.bootstrap} has answered for {lost:.0f} s "
                   f"(ONCEFLOW_BROKER_LOST_TIMEOUT is {self.timeout:g} s): the worker stops; "
                   "start it again once the cluster is back (what it decided is durable)\n")
        os.write(2, message.encode())
        logging.shutdown()
        os._exit(EXIT_UNREACHABLE)
