"""The trigger stage's call book: outcomes kept by a first pass, answered in the second."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from onceflow.calls import CallContext, Callee
from onceflow.pipeline.call_record import CallBook, read_record

pytestmark = pytest.mark.spark


def test_an_async_service_is_awaited_recorded_and_answered_without_a_second_call() -> None:
    calls: list[Any] = []

    async def service(document: Any) -> Any:
        calls.append(document)
        return {"echo": document["n"]}

    callees = {"bill": (Callee("test", service, False, True), None)}
    first = CallBook(record=True)
    wrapped = first.wrap(callees)["bill"][0]
    first.position = 7
    assert wrapped.call({"n": 1}, CallContext("bill", "i-1", None, 1)) == {"echo": 1}
    first.position = 9
    assert wrapped.call({"n": 2}, CallContext("bill", "i-2", None, 1)) == {"echo": 2}
    rows = list(first.take())
    first.close()
    assert [(trigger, position) for trigger, position, _ in rows] == [("bill", 7), ("bill", 9)]

    second = CallBook(record=False, answers=read_record(iter(rows)))
    again = second.wrap(callees)["bill"][0]
    second.position = 9
    answer = again.call({"n": 2}, CallContext("bill", "i-2", None, 1))
    second.close()
    assert orjson.loads(orjson.dumps(answer)) == {"echo": 2}  # the kept JSON text
    assert calls == [{"n": 1}, {"n": 2}]  # the service ran once per document
