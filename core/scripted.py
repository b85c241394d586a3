"""The built-in `scripted` service and resolver (spec section 7).

They let a scenario drive every path without code: the document's body says what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .calls import CallContext
from .errors import ScriptedFailure, TransientError
from .joins import JoinDocument


def _newest_body(document: Any) -> Any:
    # A join document carries its members; the newest member is the last one added.
    if type(document) is JoinDocument:
        members = document["documents"]
        newest = next(reversed(members.values())) if members else None
        return newest.get("body") if isinstance(newest, dict) else None
    return document.get("body") if isinstance(document, dict) else None


def scripted_service(document: Any, context: CallContext) -> dict[str, Any]:
    """Return {"ok": true}, or fail as body.raise says: fatal, transient, transient:N."""
    body = _newest_body(document)
    order = body.get("raise") if isinstance(body, dict) else None
    if order is None:
        return {"ok": True}
    if order == "fatal":
        raise ScriptedFailure("scripted service: body.raise is 'fatal'")
    if order == "transient":
        raise TransientError(f"scripted service: transient failure (attempt {context.attempt})")
    if isinstance(order, str) and order.startswith("transient:"):
        try:
            failures = int(order.split(":", 1)[1])
        except ValueError:
            raise ScriptedFailure(
                f"scripted service: body.raise {order!r} needs a whole number after ':'"
            ) from None
        if context.attempt <= failures:
            raise TransientError(
                f"scripted service: transient failure {context.attempt} of {failures}"
            )
        return {"ok": True}
    raise ScriptedFailure(f"scripted service: unknown body.raise value {order!r}")


def scripted_resolver(document: Any, context: CallContext) -> str:
    """Return body.resolve (NEW, DUPLICATE or IN_DOUBT), else NEW; "raise" raises."""
    body = document.get("body") if isinstance(document, dict) else None
    answer = body.get("resolve") if isinstance(body, dict) else None
    if answer is None:
        return "NEW"
    if answer == "raise":
        raise ScriptedFailure("scripted resolver: body.resolve is 'raise'")
    if answer == "transient":
        raise TransientError("scripted resolver: transient failure")
    return str(answer)


def noop_service(document: Any) -> None:
    """Do nothing and publish nothing (benchmarks, pass-through triggers)."""
    return None


def echo_service(document: Any) -> Any:
    """Publish the document itself to the output topic."""
    return document


SERVICES: dict[str, Callable[..., Any]] = {
    "scripted": scripted_service, "noop": noop_service, "echo": echo_service,
}
RESOLVERS: dict[str, Callable[..., Any]] = {"scripted": scripted_resolver}
