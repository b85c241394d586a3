"""Signatures of the records on the repartition topic (`onceflow.route`).

What a worker does with a route-topic record is an admin's power: a `suspend` stops a
trigger, a `seed` can turn a document that never ran into a `duplicate`, a `forget` lets
one run again, a routed document skips the duplicate-ID cache, a tick moves the clock.  So
every record onceflow writes there (workers, `onceflow resubmit`, `onceflow replay --live`)
carries an HMAC-SHA256 in the header `onceflow-signature`, and a worker applies only
records whose signature it can verify; any other is `bad-input` with a dead-letter copy
(agents/partition_worker.py), and the worker goes on.

The key is derived from ONCEFLOW_ADMIN_TOKEN, the one secret a deployment already shares:
whoever holds the token may suspend, resume and resubmit anyway.  A deployment without a
token has no secret: its route records are neither signed nor checked (the worker says so
at start).  The signature covers the real topic name, the partition and the value, so a
record signed for one partition or one deployment (topic prefix) is refused on another.
It does not make a copy of a signed record unique: an admin's controls carry an id and a
time for that (agents/controls.py), and write access to the route topic stays an admin
right (docs/operations.md, trust model).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence

from onceflow.envelope import H_REDELIVERY

HEADER = "onceflow-signature"
# Keeps the admin token itself from ever being an HMAC key: a signature made with this
# key is good for the route topic and nothing else.
_PURPOSE = b"onceflow route-topic signature key, version 1"


def route_key(token: str | None) -> bytes | None:
    """The signing key of a deployment whose admin token is `token` (None: no token)."""
    if not token:
        return None
    secret = token.encode("utf-8", "surrogateescape")
    return hmac.new(secret, _PURPOSE, hashlib.sha256).digest()


class RouteSigner:
    """Signs route-topic records with one key; accepts records signed with any of `keys`."""

    __slots__ = ("_sign", "_accept")

    def __init__(self, keys: Iterable[bytes | None] = ()) -> None:
        """`keys`: the key to sign with first, then any others accepted (None: skipped)."""
        states = [hmac.new(key, digestmod=hashlib.sha256) for key in keys if key]
        self._sign = states[0] if states else None
        self._accept = states

    @classmethod
    def from_tokens(cls, token: str | None, *others: str | None) -> RouteSigner:
        """The signer of a deployment: signs with `token`, also accepts `others`."""
        return cls([route_key(token), *(route_key(other) for other in others)])

    @property
    def enabled(self) -> bool:
        """Whether records are signed and checked (the deployment has an admin token)."""
        return self._sign is not None

    def headers(self, topic: str, partition: int, value: bytes
                ) -> list[tuple[str, bytes]]:
        """The headers that sign a record for a partition of the route topic (real name)."""
        if self._sign is None:
            return []
        return [(HEADER, _digest(self._sign, topic, partition, value))]

    def check(self, topic: str, partition: int, value: bytes | None,
              headers: Sequence[tuple[str, bytes | None]] | None) -> str | None:
        """Why a record read from the route topic must not be applied, or None."""
        if not self._accept:
            return None
        given = [data for name, data in headers or () if name == HEADER]
        if not given:
            return (f"it has no signature (header {HEADER!r}): onceflow did not write it, or "
                    f"a worker or command without ONCEFLOW_ADMIN_TOKEN did")
        if len(given) > 1:
            return f"it has {len(given)} signature headers {HEADER!r}; onceflow writes one"
        data = value or b""
        if not any(hmac.compare_digest(given[0] or b"", _digest(state, topic, partition, data))
                   for state in self._accept):
            return ("its signature does not match: it was changed, copied from another "
                    "partition or deployment, or signed with another ONCEFLOW_ADMIN_TOKEN")
        return None


    def redelivery_marker(self, topic: str, partition: int, original: str,
                          value: bytes | None) -> str | None:
        """The `onceflow-redelivery` header of a live replay's stand-in for a redelivery.

        The stand-in is sent to `topic` (real name) and `partition`; `original` names the
        record it stands in for, "<topic>/<partition>@<offset>" (logical topic).  The
        signature covers both and the value, so a marker copied onto another record, or
        to another partition or deployment, is not valid.  None: no admin token.
        """
        if self._sign is None:
            return None
        digest = _digest(self._sign, topic, partition, _marked(original, value))
        return f"{original} {digest.decode('ascii')}"

    def redelivery_of(self, topic: str, partition: int, value: bytes | None,
                      marker: str) -> str | None:
        """The coordinates a validly signed marker names; None for any other marker.

        Never raises, whatever a publisher wrote in the header.
        """
        if not self._accept or len(marker) > 600:
            return None
        original, _, signature = marker.rpartition(" ")
        if not original or len(signature) != 64:
            return None
        try:
            given = signature.encode("ascii")
            message = _marked(original, value)
        except UnicodeEncodeError:
            return None
        if any(hmac.compare_digest(given, _digest(state, topic, partition, message))
               for state in self._accept):
            return original
        return None


# What a redelivery marker's signature covers besides the topic and partition: a prefix
# that no route-topic value (a JSON object) starts with, so that neither kind of
# signature is ever good for the other.
_MARK = H_REDELIVERY.encode("ascii") + b"\x00"


def _marked(original: str, value: bytes | None) -> bytes:
    return _MARK + original.encode("utf-8") + b"\x00" + (value or b"")


def _digest(state: hmac.HMAC, topic: str, partition: int, value: bytes) -> bytes:
    mac = state.copy()
    mac.update(f"{topic}\x00{partition}\x00".encode("utf-8", "surrogateescape"))
    mac.update(value)
    return mac.hexdigest().encode()
