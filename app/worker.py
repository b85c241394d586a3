"""`onceflow worker`: a Faust worker running the triggers of a trigger file."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from onceflow.agents.wire import Names
from onceflow.errors import ConfigError
from onceflow.runners import load_callees
from onceflow.triggers import load_triggers

from .boundary import EXIT_SYSTEM
from .broker_loss import CHECK_EVERY, BrokerWatch
from .membership import assignor_with, check_group, client_id, fingerprint
from .settings import WorkerSettings
from .topics import deployment_topics, ensure_topics


def _plain_unless_terminal() -> dict[str, Any]:
    """Faust's logging, colored only when its stream (stderr) is a terminal.

    mode's colored formatter asks whether stdout is a terminal, while the handler writes
    to stderr: `onceflow worker 2>worker.log` from a terminal wrote escape codes into the
    file.  The formatter is told to look at stderr, and NO_COLOR turns colors off.
    """
    from mode.utils.logging import DEFAULT_FORMATTERS

    terminal = sys.stderr.isatty() and "NO_COLOR" not in os.environ
    colored = ({**DEFAULT_FORMATTERS["colored"], "stream": sys.stderr} if terminal
               else DEFAULT_FORMATTERS["default"])
    return {"merge": True, "formatters": {"colored": colored}}


def check_port(host: str, port: int) -> None:
    """ConfigError when the web views cannot listen on host:port (in use, not an address)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        why = ("another process listens there" if exc.errno == errno.EADDRINUSE
               else (exc.strerror or str(exc)).lower())
        raise ConfigError("environment", f"web views on {host}:{port}",
                          f"cannot listen: {why} (set ONCEFLOW_WEB_PORT, or --web-port, to a "
                          "free port)") from None


LOCK_FILE = "onceflow.lock"
_held: list[int] = []  # the lock's file descriptor, open for the life of the process


def lock_data_dir(data_dir: Path) -> None:
    """Hold the data directory for this process, or stop: it is another worker's.

    A second worker on a directory in use would join the group (a rebalance for every
    worker), then wait on RocksDB's lock of each database and stop with its traceback.
    """
    import fcntl

    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip()
        os.close(fd)
        raise ConfigError("environment", f"ONCEFLOW_DATA_DIR {data_dir}",
                          "in use by another worker"
                          + (f" (pid {holder})" if holder.isdigit() else "")
                          + "; give each worker a data directory of its own") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held.append(fd)


def run_worker(triggers_path: str, settings: WorkerSettings) -> int:
    """Create the topics, build the app and run it until stopped (SIGTERM, Ctrl-C)."""
    import faust
    from onceflow.agents.faust_app import build_app

    from .web import add_web_views

    path = Path(triggers_path)
    triggers = load_triggers(path)
    callees = load_callees(triggers, base_dir=path.resolve().parent)
    check_port(settings.bind_host, settings.web_port)
    plan = deployment_topics(
        triggers, Names(settings.topic_prefix), partitions=settings.partitions,
        replication=settings.replication_factor, config=settings.topic_config,
        extra=settings.extra_topics)
    replication = asyncio.run(ensure_topics(settings.cluster, plan,
                                            create=settings.create_topics))
    if settings.replication_factor != -1:
        replication = settings.replication_factor
    mine = fingerprint(triggers)
    if not settings.allow_trigger_change:
        asyncio.run(check_group(settings.cluster, Names(settings.topic_prefix).app_id, mine,
                                str(path)))
    lock_data_dir(settings.data_dir)  # before the worker joins the group
    options = dataclasses.replace(settings.options(), replication_factor=replication)
    faust_settings = {**settings.faust_settings(), "topic_replication_factor": replication,
                      "broker_client_id": client_id(mine, settings.allow_trigger_change,
                                                    settings.web_url),
                      "PartitionAssignor": assignor_with(mine, str(path),
                                                         settings.allow_trigger_change)}
    app = build_app(triggers, callees, options, faust_settings)
    add_web_views(app, settings)
    watch = BrokerWatch(app.health, settings.bootstrap_servers, settings.broker_lost_timeout)

    @app.timer(CHECK_EVERY)
    async def broker_watch() -> None:
        await watch.check()

    print(f"onceflow: worker for {path} (trigger set {mine}) on {settings.broker_url}; web "
          f"views on {settings.bind_host}:{settings.web_port}, advertised as "
          f"{settings.web_url}", file=sys.stderr, flush=True)
    worker = faust.Worker(app, loglevel=settings.log_level, quiet=True,
                          logging_config=_plain_unless_terminal())
    if not sys.stdout.isatty():
        worker.spinner = None  # it writes cursor escapes even when not on a terminal
    if settings.debug_batches:
        logging.getLogger("onceflow.batches").setLevel(logging.INFO)
    # Everything built so far lives as long as the worker: keep it out of the collector's
    # full collections, which Faust also runs during rebalances (on a loaded machine a
    # collection of these took 0.3 s of the event loop; agents/store.py).
    gc.collect()
    gc.freeze()
    # Each record leaves dozens of short-lived objects; a profile at saturation put 31% of
    # the worker's CPU in the collector with Python's default thresholds (700,10,10).
    gc.set_threshold(*settings.gc_threshold)
    try:
        worker.execute_from_commandline()
    except SystemExit:
        if app.storage_failure is not None:
            # The disk under ONCEFLOW_DATA_DIR refused (said in one line when it happened):
            # the operating system refused, as for any command (docs/operations.md).
            return EXIT_SYSTEM
        raise
    return 0
