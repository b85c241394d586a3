"""`onceflow worker`: a Faust worker running the triggers of a trigger file."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from onceflow.agents.wire import Names
from onceflow.engine import load_callees
from onceflow.triggers import load_triggers

from .kafka import ensure_topics, worker_topics
from .settings import WorkerSettings


def run_worker(triggers_path: str, settings: WorkerSettings) -> int:
    """Create the topics, build the app and run it until stopped (SIGTERM, Ctrl-C)."""
    import faust
    from onceflow.agents.faust_app import build_app

    from .web import add_web_views

    path = Path(triggers_path)
    triggers = load_triggers(path)
    callees = load_callees(triggers, base_dir=path.resolve().parent)
    reads, writes = worker_topics(triggers, Names(settings.topic_prefix),
                                  settings.extra_topics)
    asyncio.run(ensure_topics(settings.bootstrap_servers, reads, writes, settings.partitions))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = build_app(triggers, callees, settings.options(), settings.faust_settings())
    add_web_views(app, settings)
    print(f"onceflow: worker for {path} on {settings.broker_url}; web views at "
          f"{settings.web_url}", file=sys.stderr, flush=True)
    worker = faust.Worker(app, loglevel=settings.log_level, quiet=True)
    if settings.debug_batches:
        logging.getLogger("onceflow.batches").setLevel(logging.INFO)
    worker.execute_from_commandline()
    return 0
