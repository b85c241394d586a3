"""`onceflow worker`: a Faust worker running the triggers of a trigger file."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from pathlib import Path

from onceflow.agents.wire import Names
from onceflow.engine import load_callees
from onceflow.triggers import load_triggers

from .settings import WorkerSettings
from .topics import deployment_topics, ensure_topics


def run_worker(triggers_path: str, settings: WorkerSettings) -> int:
    """Create the topics, build the app and run it until stopped (SIGTERM, Ctrl-C)."""
    import faust
    from onceflow.agents.faust_app import build_app

    from .web import add_web_views

    path = Path(triggers_path)
    triggers = load_triggers(path)
    callees = load_callees(triggers, base_dir=path.resolve().parent)
    plan = deployment_topics(
        triggers, Names(settings.topic_prefix), partitions=settings.partitions,
        replication=settings.replication_factor, config=settings.topic_config,
        extra=settings.extra_topics)
    replication = asyncio.run(ensure_topics(settings.cluster, plan,
                                            create=settings.create_topics))
    if settings.replication_factor != -1:
        replication = settings.replication_factor
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    options = dataclasses.replace(settings.options(), replication_factor=replication)
    faust_settings = {**settings.faust_settings(), "topic_replication_factor": replication}
    app = build_app(triggers, callees, options, faust_settings)
    add_web_views(app, settings)
    print(f"onceflow: worker for {path} on {settings.broker_url}; web views at "
          f"{settings.web_url}", file=sys.stderr, flush=True)
    worker = faust.Worker(app, loglevel=settings.log_level, quiet=True)
    if settings.debug_batches:
        logging.getLogger("onceflow.batches").setLevel(logging.INFO)
    worker.execute_from_commandline()
    return 0
