"""Fixtures of the Spark tests: one local session for the whole run, generated archives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A quiet local[2] session: no UI, two shuffle partitions."""
    from onceflow.pipeline.session import build_session

    session = build_session("local[2]", app_name="onceflow-tests", shuffle_partitions=2)
    yield session
    session.stop()
