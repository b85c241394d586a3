"""Topics named by publishers (reply-to): whether the name is legal, and making sure it exists.

A reply-to topic is named in a document, so it can be anything: an illegal name, a topic
that does not exist on a broker that does not create topics on first produce, a topic the
worker may not write.  Producing to such a topic would make the producer wait for its
metadata (about 40 s) and then fail the worker's whole batch.  So the worker checks the name
first (Kafka's rule), creates a missing topic as it creates its other output topics (with
ONCEFLOW_PARTITIONS partitions, ONCEFLOW_REPLICATION_FACTOR replicas and
ONCEFLOW_TOPIC_CONFIG; not at all with ONCEFLOW_CREATE_TOPICS=false, when the produce
decides), and remembers what it found.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Protocol

log = logging.getLogger("onceflow.topics")

# Kafka's rule (org.apache.kafka.common.internals.Topic): 1 to 249 characters of
# [a-zA-Z0-9._-], and neither "." nor "..".
LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
TOPIC_ALREADY_EXISTS = 36
# A topic that could not be created or written is not tried again for this long: every
# reply copy to it goes to the dead-letter topic at once meanwhile.
RETRY_BROKEN_AFTER = 60.0


def illegal_topic_name(name: str) -> str | None:
    """Why `name` is not a legal Kafka topic name, or None when it is."""
    if LEGAL_TOPIC.fullmatch(name) and name not in (".", ".."):
        return None
    if not name:
        return "an empty name is not a legal Kafka topic name"
    shown = name if len(name) <= 80 else f"{name[:80]}... ({len(name)} characters)"
    return (f"{shown!r} is not a legal Kafka topic name (1-249 characters of a-z, A-Z, "
            f"0-9, '.', '_' and '-', not '.' or '..')")


async def default_replication(admin: Any) -> int:
    """The broker's default.replication.factor (what -1 means).

    aiokafka's CreateTopics goes up to version 3, which takes no -1 (Kafka reads -1 as "the
    broker's default" from version 4), so onceflow asks the broker for its default.  A
    broker that does not say (the embedded one) gets one replica per broker, at most 3.
    """
    brokers: list[int] = []
    try:
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        cluster = await admin.describe_cluster()
        brokers = [broker["node_id"] for broker in cluster.get("brokers", ())]
        node = cluster.get("controller_id")
        if node is None or node < 0 or node not in brokers:
            node = brokers[0] if brokers else 0

        responses = await admin.describe_configs([ConfigResource(
            ConfigResourceType.BROKER, str(node), {"default.replication.factor": None})])
        for response in responses:
            for resource in response.resources:
                for entry in resource[4]:
                    if entry[0] == "default.replication.factor" and entry[1]:
                        return int(entry[1])
    except Exception:  # the broker does not describe itself (or its configs)
        pass
    return max(1, min(len(brokers), 3))


class TopicMaker(Protocol):
    """Creates topics the worker is asked to write to."""

    async def ensure(self, topic: str) -> str | None:
        """Make sure the topic exists; None when it does, else why not."""

    def broken(self, topic: str, reason: str) -> None:
        """The topic could not be written: do not try it again for a while."""

    def written(self, topic: str) -> None:
        """A record reached the topic."""

    async def close(self) -> None:
        """Release the connection."""


class AnyTopic:
    """Every topic exists (the memory broker creates topics on first write)."""

    async def ensure(self, topic: str) -> str | None:
        """Nothing to do."""
        return None

    def broken(self, topic: str, reason: str) -> None:
        """Nothing to remember."""

    def written(self, topic: str) -> None:
        """Nothing to remember."""

    async def close(self) -> None:
        """Nothing to release."""


class KafkaTopicMaker:
    """Creates missing topics with the worker's partition count, replicas and configs."""

    def __init__(self, bootstrap: str, partitions: int, *, auth: dict[str, Any] | None = None,
                 replication: int = -1, config: dict[str, str] | None = None,
                 create: bool = True, clock: Any = time.monotonic) -> None:
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.auth = auth or {}
        self.replication = replication
        self.config = config or {}
        self.create = create
        self._clock = clock
        self._admin: Any = None
        self._known: set[str] = set()
        self._broken: dict[str, tuple[float, str]] = {}

    async def ensure(self, topic: str) -> str | None:
        """Create the topic unless known; None when it exists, else the broker's answer."""
        if topic in self._known:
            return None
        broken = self._broken.get(topic)
        if broken is not None:
            if self._clock() < broken[0]:
                return broken[1]
            del self._broken[topic]
        if not self.create:
            return None  # the deployment creates topics; the produce decides
        from aiokafka.admin import NewTopic

        try:
            admin = await self._connect()
            if self.replication == -1:
                self.replication = await default_replication(admin)
            response = await admin.create_topics([NewTopic(
                topic, self.partitions, self.replication, topic_configs=self.config)])
            codes = [code for _, code, *_ in response.topic_errors]
        except Exception as exc:  # the admin connection: try the produce anyway
            log.warning("could not create reply-to topic %s: %r", topic, exc)
            return None
        if all(code in (0, TOPIC_ALREADY_EXISTS) for code in codes):
            self._known.add(topic)
            return None
        # Not created (policy, authorization): the topic may still exist or be created on
        # first produce, so the produce decides; its failure is remembered by `broken`.
        log.warning("reply-to topic %s: CreateTopics answered Kafka error code(s) %s",
                    topic, codes)
        return None

    def broken(self, topic: str, reason: str) -> None:
        """Remember that the topic could not be written."""
        self._known.discard(topic)
        self._broken[topic] = (self._clock() + RETRY_BROKEN_AFTER, reason)

    def written(self, topic: str) -> None:
        """A record reached the topic."""
        self._known.add(topic)

    async def _connect(self) -> Any:
        if self._admin is None:
            from aiokafka.admin import AIOKafkaAdminClient

            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self.auth)
            await admin.start()
            self._admin = admin
        return self._admin

    async def close(self) -> None:
        """Close the admin connection."""
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

