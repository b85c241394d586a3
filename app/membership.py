"""The trigger set's fingerprint in a worker's group membership: one trigger set a group.

Every worker puts a fingerprint of its trigger set (a hash of the triggers and topic
settings as the worker reads them, not of the file's text) in the metadata it sends when
it joins the consumer group.  A worker whose fingerprint differs from the group's stops
with both fingerprints and what to do, instead of joining a group that disagrees about
which triggers exist: before joining, from the group's members as the broker describes
them (their metadata on Apache Kafka, their member ids, which begin with the worker's
client id `onceflow-<fingerprint>`, on the embedded broker); failing that when it joins,
refused by the group leader, which gives it no partitions.  ONCEFLOW_ALLOW_TRIGGER_CHANGE
lets a worker join anyway (a rolling change of the trigger file).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import re
from typing import Any
from urllib.parse import urlsplit

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from faust.assignor import PartitionAssignor
from onceflow.errors import OnceflowError
from onceflow.triggers import TriggerSet

from .boundary import EXIT_INPUT
from .security import Cluster, started

FIELD = "onceflow_triggers"  # the fingerprint, in Faust's member user data
ALLOW = "onceflow_allow_trigger_change"  # the member joins whatever the group runs
REFUSED = "onceflow_refused"  # in an assignment: the leader refused this member

log = logging.getLogger("onceflow.membership")


def fingerprint(triggers: TriggerSet) -> str:
    """A short hash of a trigger set: equal for files that define the same triggers."""
    normal = {
        "triggers": sorted((dataclasses.asdict(t) for t in triggers.triggers),
                           key=lambda t: t["name"]),
        "topics": {name: dataclasses.asdict(settings)
                   for name, settings in sorted(triggers.topic_settings.items())},
    }
    text = json.dumps(normal, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


CLIENT_ID = "onceflow-"  # + the fingerprint: the worker's Kafka client id


def client_id(mine: str, allow_change: bool, web_url: str) -> str:
    """The Kafka client id of a worker: its fingerprint and web address, into member ids.

    Brokers that leave member metadata out of DescribeGroups (the embedded one) still
    name each member by an id that begins with its client id, so a worker can compare
    fingerprints before it joins there too, and ask the member's web address whether it
    still runs (such a broker lists a member that has left until the group rebalances).
    A worker that allows a change names no fingerprint.
    """
    parts = urlsplit(web_url)
    where = f"{parts.port or 80}-{parts.hostname or '?'}"
    return f"{CLIENT_ID}{'rolling-' if allow_change else ''}{mine}-{where}"


def _id_facts(text: str | None) -> tuple[str, str | None] | None:
    """(fingerprint, web address or None) that a client id or member id begins with."""
    if not text or not text.startswith(CLIENT_ID):
        return None
    candidate = text[len(CLIENT_ID):len(CLIENT_ID) + 16]
    rest = text[len(CLIENT_ID) + 16:]
    if len(candidate) != 16 or any(c not in "0123456789abcdef" for c in candidate) or (
            rest and not rest.startswith("-")):
        return None
    if len(rest) > 37 and _MEMBER_SUFFIX.fullmatch(rest[-37:]):
        rest = rest[:-37]  # the broker's "-<uuid>" after the client id
    port, _, host = rest[1:].partition("-")
    if not port.isdigit() or not host:
        return candidate, None
    return candidate, f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _id_print(text: str | None) -> str | None:
    """The fingerprint a client id or member id begins with (client_id), if any."""
    facts = _id_facts(text)
    return facts[0] if facts else None


_MEMBER_SUFFIX = re.compile(r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def refusal(source: str, mine: str, group: str, theirs: str, where: str) -> str:
    """What a worker whose trigger set differs from its group's says before it stops."""
    return (f"{source}: trigger set: its fingerprint is {mine}, but the workers of the "
            f"group {group!r} run another trigger file ({where}: {theirs}); a worker does "
            "not join a group that disagrees about its triggers. Start every worker with "
            "the same file (stop them all, then start them with the new one), or set "
            "ONCEFLOW_ALLOW_TRIGGER_CHANGE=true for a rolling change (see docs/operations.md, "
            "changing the trigger file)")


def assignor_with(mine: str, source: str, allow_change: bool) -> type[PartitionAssignor]:
    """Faust's partition assignor, with the trigger set's fingerprint in the membership.

    The group leader hands partitions only to members whose fingerprint is its own (or
    that allow a change); every other member gets none and is told so in its assignment,
    and stops with the reason (exit code 2).
    """

    class FingerprintAssignor(PartitionAssignor):  # type: ignore[misc]
        def metadata(self, topics: Any) -> ConsumerProtocolMemberMetadata:
            member = super().metadata(topics)
            data = json.loads(member.user_data)
            data[FIELD] = mine
            data[ALLOW] = allow_change
            return ConsumerProtocolMemberMetadata(member.version, member.subscription,
                                                  json.dumps(data).encode())

        def _perform_assignment(self, cluster: Any, member_metadata: Any) -> Any:
            data = {member: _user_data(metadata.user_data)
                    for member, metadata in member_metadata.items()}
            refused = {member for member, facts in data.items()
                       if facts.get(FIELD) != mine and not facts.get(ALLOW)}
            if allow_change or not refused:
                return super()._perform_assignment(cluster, member_metadata)
            kept = {m: md for m, md in member_metadata.items() if m not in refused}
            result = dict(super()._perform_assignment(cluster, kept))
            for member in refused:
                facts = data[member]
                log.error("onceflow: the worker at %s runs another trigger file (trigger set "
                          "%s, the group's is %s): it gets no partitions and stops",
                          facts.get("url"), facts.get(FIELD), mine)
                told = {"assignment": {"actives": {}, "standbys": {}},
                        "url": facts.get("url", ""), "changelog_distribution": {},
                        REFUSED: {"group": mine, "leader": str(self.app.conf.canonical_url)}}
                result[member] = ConsumerProtocolMemberAssignment(
                    self.version, [], self._compress(json.dumps(told).encode()))
            return result

        def on_assignment(self, assignment: Any) -> None:
            told = _user_data(self._decompress(assignment.user_data)).get(REFUSED)
            if isinstance(told, dict):
                message = refusal(source, mine, str(self.app.conf.id), str(told.get("group")),
                                  f"group leader {told.get('leader')}")
                # The worker redirects sys.stderr into its logs: write to the real one.
                os.write(2, f"onceflow: {message}\n".encode())
                logging.shutdown()
                os._exit(EXIT_INPUT)
            super().on_assignment(assignment)

    return FingerprintAssignor


def _user_data(raw: bytes | None) -> dict[str, Any]:
    try:
        data = json.loads(raw or b"")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


async def group_fingerprints(cluster: Cluster, group: str) -> dict[str, str | None]:
    """{member (client host and id): fingerprint} of the group's current members."""
    admin = await started(AIOKafkaAdminClient(**cluster.client_kwargs()), cluster)
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    found: dict[str, str | None] = {}
    for response in responses:
        for described in response.groups:
            members = described[5] if len(described) > 5 else ()
            for member in members:
                member_id, client, host, metadata = member[0], member[1], member[2], member[3]
                where = f"{host or '?'} ({client or member_id})"
                if metadata:
                    found[where] = _member_print(metadata)
                    continue
                facts = _id_facts(client) or _id_facts(member_id)
                if facts is None:
                    found[where] = None
                    continue
                theirs, web = facts
                # A member named only by its id may have left: only one that answers counts.
                found[where] = theirs if web is None or await _answers(web) else None
    return found


async def _answers(web: str) -> bool:
    """Whether a worker answers at a web address (any HTTP answer)."""
    from .process import WorkerUnreachable, http_json

    try:
        await asyncio.to_thread(http_json, web + "/livez", timeout=2.0)
    except WorkerUnreachable:
        return False
    return True


def _member_print(metadata: bytes | None) -> str | None:
    """The fingerprint in a member's metadata (None: not told, as by the embedded broker)."""
    try:
        data = _user_data(ConsumerProtocolMemberMetadata.decode(metadata).user_data)
    except Exception:  # noqa: BLE001 - metadata that is not a consumer's, or none at all
        return None
    value = data.get(FIELD)
    return value if isinstance(value, str) and not data.get(ALLOW) else None


async def check_group(cluster: Cluster, group: str, mine: str, source: str) -> None:
    """OnceflowError before joining when members run a trigger set of another fingerprint.

    From the members' metadata, or, where the broker leaves it out of DescribeGroups (the
    embedded one), from their member ids (client_id).  A member that tells neither (an
    older worker) is refused by the group leader when it joins (assignor_with).
    """
    others = {member: theirs for member, theirs in
              (await group_fingerprints(cluster, group)).items()
              if theirs is not None and theirs != mine}
    if others:
        where, theirs = sorted(others.items())[0]
        raise OnceflowError(refusal(source, mine, group, theirs, where))
