"""/readyz after the local store failed: not ready, saying why."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from onceflow.agents.health import Health, readiness


def test_a_worker_whose_local_store_failed_is_not_ready() -> None:
    recovered = asyncio.Event()
    recovered.set()
    app = SimpleNamespace(
        consumer=SimpleNamespace(fetched_at=None), rebalancing=False, in_recovery=False,
        tables=SimpleNamespace(recovery=SimpleNamespace(completed=recovered)),
        assignor=SimpleNamespace(assigned_actives=lambda: set()),
        runtime=SimpleNamespace(names=SimpleNamespace(route="onceflow.route")),
        bulk_delivery=None)
    health = Health(stuck_after=60)
    health.on_rebalance_end()
    ready, _ = readiness(app, health)
    assert ready
    health.storage_error = "the local store /data/v1/tables/ingress-0.db failed: IO error"
    ready, body = readiness(app, health)
    assert not ready
    assert body["reasons"] == ["the worker stops: the local store /data/v1/tables/ingress-0.db "
                               "failed: IO error"]
