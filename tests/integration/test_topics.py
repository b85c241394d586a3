"""Topics as a production cluster needs them: created with the replication factor and
configs the settings name, changelogs compacted, `onceflow topics` printing the commands,
and workers that may not create topics checking the pre-created ones.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from cli_runner import onceflow
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.topics import cleanup_policies

from .support import ORDERS_ONLY, publish, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = ORDERS_ONLY


def admin_call(bootstrap: str, call: Any) -> Any:
    async def run() -> Any:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return await call(admin)
        finally:
            await admin.close()
    return asyncio.run(run())


def printed_topics(output: str) -> dict[str, dict[str, Any]]:
    """{topic: {"partitions", "replication", "config"}} from kafka-topics.sh commands."""
    topics: dict[str, dict[str, Any]] = {}
    for line in output.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        words = shlex.split(line)
        assert words[0] == "kafka-topics.sh" and "--create" in words, line
        assert "--if-not-exists" in words
        spec: dict[str, Any] = {"config": {}, "replication": None}
        for flag, value in zip(words, words[1:], strict=False):
            if flag == "--topic":
                name = value
            elif flag == "--partitions":
                spec["partitions"] = int(value)
            elif flag == "--replication-factor":
                spec["replication"] = int(value)
            elif flag == "--config":
                key, _, setting = value.partition("=")
                spec["config"][key] = setting
        topics[name] = spec
    return topics


def test_topics_command_prints_every_topic_and_a_worker_runs_on_them_without_creating(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    prefix = new_prefix()
    names = Names(prefix)
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
           "ONCEFLOW_PARTITIONS": "3", "ONCEFLOW_REPLICATION_FACTOR": "1",
           "ONCEFLOW_TOPIC_CONFIG": "min.insync.replicas=1,retention.ms=86400000"}
    result = onceflow("topics", "--triggers", str(triggers), env=env)
    assert result.returncode == 0, result.stderr
    topics = printed_topics(result.stdout)
    changelogs = {f"{prefix}onceflow-{t}-changelog" for t in
                  ("ingress", "history", "joins", "control")}
    assert set(topics) == {names.topic("order"), names.route, names.journal, names.acks,
                           names.dead_letter, names.topic("orders.out"),
                           names.topic("orders.error"), names.topic("orders.in-doubt"),
                           *changelogs}
    for name, spec in topics.items():
        assert spec["partitions"] == 3 and spec["replication"] == 1, name
        assert spec["config"]["min.insync.replicas"] == "1"
        assert spec["config"]["retention.ms"] == "86400000"
        assert spec["config"]["cleanup.policy"] == (
            "compact" if name in changelogs else "delete"), name

    # Create exactly what was printed, then run a worker that may not create topics.
    admin_call(broker.bootstrap, lambda admin: admin.create_topics([
        NewTopic(name, spec["partitions"], spec["replication"], topic_configs=spec["config"])
        for name, spec in topics.items()]))
    worker = start_worker(triggers, prefix, partitions=3, create_topics="false")
    publish(broker.bootstrap, names, [("order", orjson.dumps({"uuid": "o-1", "body": {}}),
                                       "o-1", {}, None)])
    lines = wait_journal(broker.bootstrap, names,
                         lambda lines: any(line["outcome"] == "processed" for line in lines),
                         worker)
    assert [line["identity"] for line in lines if line["outcome"] == "processed"] == ["o-1"]


def test_a_worker_creates_topics_with_the_settings(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    prefix = new_prefix()
    names = Names(prefix)
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    start_worker(triggers, prefix, partitions=2, topic_config="retention.ms=3600000")
    changelog = f"{prefix}onceflow-history-changelog"
    described = admin_call(broker.bootstrap, lambda admin: admin.describe_topics(
        [names.journal, changelog]))
    for topic in described:
        assert len(topic["partitions"]) == 2
        assert all(len(p["replicas"]) == 1 for p in topic["partitions"])

    async def configs(admin: Any) -> Any:
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        responses = await admin.describe_configs([
            ConfigResource(ConfigResourceType.TOPIC, name) for name in (names.journal,
                                                                        changelog)])
        found: dict[str, dict[str, str]] = {}
        for response in responses:
            for resource in response.resources:
                found[resource[3]] = {entry[0]: entry[1] for entry in resource[4]}
        return found

    found = admin_call(broker.bootstrap, configs)
    assert found[names.journal]["retention.ms"] == "3600000"
    assert found[names.journal]["cleanup.policy"] == "delete"
    assert found[changelog]["cleanup.policy"] == "compact"
    assert admin_call(broker.bootstrap, lambda admin: cleanup_policies(
        admin, [changelog])) == {changelog: "compact"}


def test_a_worker_that_may_not_create_topics_names_every_mismatch(
        broker: EmbeddedBroker, new_prefix: Any, tmp_path: Path) -> None:
    prefix = new_prefix()
    names = Names(prefix)
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
           "ONCEFLOW_PARTITIONS": "2", "ONCEFLOW_DATA_DIR": str(tmp_path / "data"),
           "ONCEFLOW_WEB_PORT": str(free_port())}
    printed = printed_topics(onceflow("topics", "--triggers", str(triggers), env=env).stdout)
    wrong_count = names.topic("order")
    uncompacted = f"{prefix}onceflow-joins-changelog"
    compacted = names.journal
    missing = {names.topic("orders.error"), f"{prefix}onceflow-control-changelog"}
    creates = []
    for name, spec in printed.items():
        if name in missing:
            continue
        config = dict(spec["config"])
        partitions = 5 if name == wrong_count else spec["partitions"]
        if name == uncompacted:
            del config["cleanup.policy"]  # tansu then names no policy: Kafka's default, delete
        if name == compacted:
            config["cleanup.policy"] = "compact"
        creates.append(NewTopic(name, partitions, 1, topic_configs=config))
    admin_call(broker.bootstrap, lambda admin: admin.create_topics(creates))

    result = onceflow("worker", "--triggers", str(triggers),
                      env={**env, "ONCEFLOW_CREATE_TOPICS": "false"})
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    message = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(message) == 1, result.stderr
    line = message[0]
    assert "5 topic(s)" in line
    for name in missing:
        assert f"topic {name!r}" in line and "is missing" in line
    assert f"topic {wrong_count!r} (input) has 5 partitions, needs 2" in line
    assert f"topic {uncompacted!r} (changelog) has cleanup.policy=delete, needs compact" in line
    assert f"topic {compacted!r} (internal) has cleanup.policy=compact, needs delete" in line
    # The check created nothing (a Metadata request naming a missing topic would, on tansu).
    assert not missing & set(admin_call(broker.bootstrap, lambda admin: admin.list_topics()))
