"""The quick start's service: confirm an order, exactly once per order."""

from __future__ import annotations

from typing import Any

from onceflow import CallContext, TransientError


def confirm_order(document: dict[str, Any], context: CallContext) -> dict[str, Any]:
    """Called once per new order document; what it returns goes to `orders.out`.

    `document` is the envelope as published: {"type", "uuid", "body", ...}.  `context`
    says which trigger and attempt this is (and the delivery count, the identity).
    """
    body = document["body"]
    if body.get("warehouse") == "busy" and context.attempt == 1:
        # Retried after the trigger's retry_interval (up to max_retry_attempts).
        raise TransientError("the warehouse is busy")
    if body["quantity"] <= 0:
        # Any other exception: an error document on `orders.error`, no retry.
        raise ValueError(f"quantity must be positive, got {body['quantity']}")
    return {"order": document["uuid"], "total": body["quantity"] * body["price"],
            "attempt": context.attempt}
