"""The core's value classes survive pickling (compiled with mypyc they need __reduce__)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from onceflow.calls import CallContext
from onceflow.envelope import Document, Record
from onceflow.history import HistoryEntry
from onceflow.journal import JournalRecord
from onceflow.outputs import Output
from onceflow.scenario import HistorySeed
from onceflow.triggers import TopicSettings, parse_triggers

TRIGGERS = parse_triggers({
    "trigger": [{"name": "bill", "service": "scripted", "types": ["inv"], "history_ttl": "1h"},
                {"name": "ship", "service": "scripted",
                 "types": ["order", "payment"], "condition": "all",
                 "join_timeout": "none", "max_retry_attempts": 2}],
    "topic": {"inv": {"id_cache_size": 7}},
})

VALUES: list[Any] = [
    TRIGGERS,
    TRIGGERS.triggers[1],
    TopicSettings(5, False),
    Record("inv", 2, 9, 5, {"uuid": "u"}, "k", {"dup-id": "d"}),
    Document("inv", "u", "a-1", {"uuid": "u"}, 5500, "inv", 2, 9, "m", 3, "k", {"x": "y"}, 4),
    JournalRecord("bill", "processed", "u", None, 5, "inv", 2, 9, "why", 1, 4),
    Output("bill.out", None, {"ok": True}, {"dup-id": "bill:u"}),
    HistoryEntry(3, 2),
    CallContext("bill", "u", None, 2, 1, "m", {"started": 3}),
    HistorySeed("bill", "u", "completed", 3, True, "a"),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_round_trip(value: Any) -> None:
    copy = pickle.loads(pickle.dumps(value))
    assert type(copy) is type(value)
    assert copy == value
    assert repr(copy) == repr(value)  # an int ts stays an int
