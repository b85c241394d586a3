"""Every topic a deployment needs: the plan, creating it, checking it, printing it.

The plan lists each topic with its partitions, replicas and configs: the input topics and
the repartition topic (read by the workers: exactly ONCEFLOW_PARTITIONS partitions, since
Faust gives partition p of each of them, and of each table, to the same worker), the
journal, acks and dead-letter topics, the triggers' output, error and in-doubt topics, and
the tables' changelogs (compacted, ONCEFLOW_PARTITIONS partitions).

The worker creates what is missing (ONCEFLOW_CREATE_TOPICS=true, the default) and then
checks every topic of the plan; with ONCEFLOW_CREATE_TOPICS=false it only checks, for
deployments whose workers may not create topics (they are created beforehand, for example
with the commands `onceflow topics` prints).  The check names every mismatch: a missing
topic, a wrong partition count, a wrong cleanup policy.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import for_code
from onceflow.agents.context import TABLES
from onceflow.agents.topics import default_replication
from onceflow.agents.wire import Names
from onceflow.errors import ConfigError
from onceflow.triggers import TriggerSet

from .security import Cluster, as_cluster, started

TOPIC_ALREADY_EXISTS = 36
UNKNOWN_TOPIC = 3
# What a topic's cleanup.policy is when DescribeConfigs does not name it: Kafka's default
# (log.cleanup.policy).  Apache Kafka always names it; the embedded broker names only the
# configs a topic was created with (see docs/operations.md).
DEFAULT_CLEANUP = "delete"


@dataclass(frozen=True)
class TopicSpec:
    """One topic of the deployment and what it must be like."""

    name: str
    role: str  # input, repartition, internal, output, changelog
    partitions: int
    replication: int
    config: tuple[tuple[str, str], ...]

    @property
    def compacted(self) -> bool:
        """Changelogs are compacted; nothing else may be."""
        return self.role == "changelog"

    @property
    def exact_partitions(self) -> bool:
        """Whether the partition count must be exactly the plan's (read topics, tables)."""
        return self.role in ("input", "repartition", "changelog")

    def configs(self) -> dict[str, str]:
        """The topic configs it is created with."""
        configs = dict(self.config)
        configs["cleanup.policy"] = "compact" if self.compacted else "delete"
        return configs


def changelog_topic(names: Names, table: str) -> str:
    """The changelog topic of a table (Faust's name: <app id>-<table>-changelog)."""
    return f"{names.app_id}-{table}-changelog"


def deployment_topics(triggers: TriggerSet, names: Names, *, partitions: int,
                      replication: int = -1, config: Iterable[tuple[str, str]] = (),
                      extra: Iterable[str] = ()) -> list[TopicSpec]:
    """Every topic a deployment of `triggers` needs, in a stable order."""
    config = tuple(config)
    plan: dict[str, TopicSpec] = {}

    def add(name: str, role: str) -> None:
        if name not in plan:
            plan[name] = TopicSpec(name, role, partitions, replication, config)

    for topic in dict.fromkeys((*triggers.input_topics, *extra)):
        add(names.topic(topic), "input")
    add(names.route, "repartition")
    for name in (names.journal, names.acks, names.dead_letter):
        add(name, "internal")
    for trigger in triggers.triggers:
        for topic in (trigger.output, trigger.error, trigger.in_doubt):
            add(names.topic(topic), "output")
    for table in TABLES:
        add(changelog_topic(names, table), "changelog")
    return list(plan.values())


async def ensure_topics(where: Cluster | str, plan: list[TopicSpec], *,
                        create: bool = True) -> int:
    """Create the plan's missing topics (unless `create` is false), then check them all.

    Returns the replication factor used for the plan's -1 ("the broker's default").
    ConfigError names every topic that is missing or not as the plan needs it.
    """
    cluster = as_cluster(where)
    admin = await started(AIOKafkaAdminClient(**cluster.client_kwargs()), cluster)
    try:
        default = await default_replication(admin)
        if create:
            response = await admin.create_topics([
                NewTopic(spec.name, spec.partitions,
                         default if spec.replication == -1 else spec.replication,
                         topic_configs=spec.configs()) for spec in plan])
            for name, code, *rest in response.topic_errors:
                if code not in (0, TOPIC_ALREADY_EXISTS):
                    error = for_code(code)
                    message = f"{error.__name__} ({code})"
                    if rest and rest[0]:
                        message += f": {rest[0]}"
                    raise ConfigError("broker", f"topic {name!r}",
                                      f"cannot be created: {message}")
        problems = await check_topics(admin, plan)
    finally:
        await admin.close()
    if problems:
        how = ("create them as `onceflow topics` prints, or set ONCEFLOW_CREATE_TOPICS=true"
               if not create else "recreate them, or change the settings to match")
        raise ConfigError("broker", f"{len(problems)} topic(s)",
                          "; ".join(problems) + f" ({how})")
    return default


async def check_topics(admin: Any, plan: list[TopicSpec]) -> list[str]:
    """What is wrong with the topics of the plan, one message a mismatch."""
    # Only topics that exist are described: a Metadata request naming a missing topic
    # creates it on a broker that creates topics on first use (tansu; Kafka with
    # auto.create.topics.enable), with the broker's partition count.
    existing = set(await admin.list_topics())
    wanted = [spec.name for spec in plan if spec.name in existing]
    described = {topic["topic"]: topic for topic in (
        await admin.describe_topics(wanted) if wanted else [])}
    problems: list[str] = []
    present = []
    for spec in plan:
        topic = described.get(spec.name)
        if topic is None or topic.get("error_code") == UNKNOWN_TOPIC or not topic.get(
                "partitions"):
            problems.append(f"topic {spec.name!r} ({spec.role}) is missing")
            continue
        present.append(spec)
        count = len(topic["partitions"])
        if spec.exact_partitions and count != spec.partitions:
            problems.append(
                f"topic {spec.name!r} ({spec.role}) has {count} partitions, needs "
                f"{spec.partitions} (ONCEFLOW_PARTITIONS)")
    policies = await cleanup_policies(admin, [spec.name for spec in present])
    for spec in present:
        policy = policies.get(spec.name, DEFAULT_CLEANUP)
        flags = {part.strip() for part in policy.split(",")}
        if spec.compacted and "compact" not in flags:
            problems.append(f"topic {spec.name!r} ({spec.role}) has cleanup.policy={policy}, "
                            "needs compact")
        if not spec.compacted and spec.role != "output" and "compact" in flags:
            problems.append(f"topic {spec.name!r} ({spec.role}) has cleanup.policy={policy}, "
                            "needs delete (compaction would drop records not yet read)")
    return problems


async def cleanup_policies(admin: Any, topics: list[str]) -> dict[str, str]:
    """cleanup.policy of each topic whose DescribeConfigs answer names it."""
    if not topics:
        return {}
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in topics])
    policies: dict[str, str] = {}
    for response in responses:
        for resource in response.resources:
            error_code, _, _, name, entries = resource[:5]
            if error_code:
                continue
            for entry in entries:
                if entry[0] == "cleanup.policy" and entry[1] is not None:
                    policies[name] = entry[1]
    return policies


def kafka_topics_commands(plan: list[TopicSpec], bootstrap: str,
                          command_config: str | None = None) -> list[str]:
    """`kafka-topics.sh --create` commands that make the plan's topics."""
    lines = []
    for spec in plan:
        words = ["kafka-topics.sh", "--bootstrap-server", bootstrap]
        if command_config:
            words += ["--command-config", command_config]
        words += ["--create", "--if-not-exists", "--topic", spec.name,
                  "--partitions", str(spec.partitions)]
        if spec.replication != -1:
            words += ["--replication-factor", str(spec.replication)]
        for name, value in spec.configs().items():
            words += ["--config", f"{name}={value}"]
        lines.append(" ".join(shlex.quote(word) for word in words))
    return lines


def print_topics(triggers_path: str, settings: Any, command_config: str | None) -> int:
    """`onceflow topics --triggers FILE`: the kafka-topics.sh commands of the deployment."""
    from onceflow.triggers import load_triggers

    plan = deployment_topics(
        load_triggers(triggers_path), Names(settings.topic_prefix),
        partitions=settings.partitions, replication=settings.replication_factor,
        config=settings.topic_config, extra=settings.extra_topics)
    print(f"# {len(plan)} topics of the deployment of {triggers_path} "
          f"(ONCEFLOW_TOPIC_PREFIX={settings.topic_prefix!r}, "
          f"ONCEFLOW_PARTITIONS={settings.partitions})")
    if settings.security.security_protocol != "PLAINTEXT" and not command_config:
        print("# the cluster is secured: add --command-config with its client properties")
    for line in kafka_topics_commands(plan, settings.bootstrap_servers, command_config):
        print(line)
    return 0
