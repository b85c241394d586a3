"""The Kafka connection settings (app/security.py) and the topic settings, without a broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from onceflow.app.security import (
    Cluster,
    ConnectionFailed,
    connection_failure,
    security_from_env,
)
from onceflow.app.settings import WorkerSettings
from onceflow.errors import ConfigError, OnceflowError

SASL = {"ONCEFLOW_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "ONCEFLOW_SASL_MECHANISM": "SCRAM-SHA-256",
        "ONCEFLOW_SASL_USERNAME": "svc", "ONCEFLOW_SASL_PASSWORD": "hunter2-secret"}


def test_plaintext_by_default() -> None:
    cluster = Cluster("b:9092", security_from_env(environ={}))
    assert cluster.client_kwargs() == {"bootstrap_servers": "b:9092",
                                       "security_protocol": "PLAINTEXT"}
    assert cluster.faust_credentials() is None


def test_sasl_kwargs_and_the_password_stays_out_of_every_description() -> None:
    security = security_from_env(environ=SASL)
    cluster = Cluster("b:9092", security)
    kwargs = cluster.client_kwargs()
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-256"
    assert kwargs["sasl_plain_username"] == "svc"
    assert kwargs["sasl_plain_password"] == "hunter2-secret"
    assert "ssl_context" not in kwargs
    credentials = cluster.faust_credentials()
    assert credentials.password == "hunter2-secret"
    for text in (repr(security), str(security), cluster.describe(), repr(cluster),
                 repr(credentials), str(connection_failure(KeyError("v"), cluster))):
        assert "hunter2" not in text, text


def test_password_file_is_read_and_its_newline_dropped(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-a-secret\n")
    env = {**SASL, "ONCEFLOW_SASL_PASSWORD_FILE": str(secret)}
    del env["ONCEFLOW_SASL_PASSWORD"]
    kwargs = Cluster("b:1", security_from_env(environ=env)).client_kwargs()
    assert kwargs["sasl_plain_password"] == "from-a-secret"


@pytest.mark.parametrize("env,named", [
    ({"ONCEFLOW_SECURITY_PROTOCOL": "TLS"}, "ONCEFLOW_SECURITY_PROTOCOL"),
    ({"ONCEFLOW_SASL_MECHANISM": "GSSAPI"}, "ONCEFLOW_SASL_MECHANISM"),
    ({"ONCEFLOW_SECURITY_PROTOCOL": "SASL_SSL"}, "ONCEFLOW_SASL_USERNAME"),
    ({**SASL, "ONCEFLOW_SASL_PASSWORD_FILE": "/etc/passwd"}, "not both"),
    ({"ONCEFLOW_SSL_CERTFILE": "/etc/hostname"}, "ONCEFLOW_SSL_KEYFILE"),
    ({"ONCEFLOW_SSL_CAFILE": "/no/such/ca.pem"}, "ONCEFLOW_SSL_CAFILE"),
])
def test_bad_security_settings_name_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        security_from_env(environ=env)
    assert named in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_a_bridge_side_falls_back_to_the_plain_settings() -> None:
    env = {**SASL, "ONCEFLOW_BRIDGE_SOURCE_SASL_USERNAME": "bridge",
           "ONCEFLOW_BRIDGE_TARGET_SECURITY_PROTOCOL": "PLAINTEXT"}
    source = security_from_env("ONCEFLOW_BRIDGE_SOURCE_", "ONCEFLOW_", environ=env)
    target = security_from_env("ONCEFLOW_BRIDGE_TARGET_", "ONCEFLOW_", environ=env)
    assert (source.security_protocol, source.sasl_username) == ("SASL_PLAINTEXT", "bridge")
    assert target.security_protocol == "PLAINTEXT"


def test_an_unparsable_ca_file_is_a_config_error(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate")
    security = security_from_env(environ={"ONCEFLOW_SECURITY_PROTOCOL": "SSL",
                                          "ONCEFLOW_SSL_CAFILE": str(ca)})
    with pytest.raises(ConfigError, match="ONCEFLOW_SSL"):
        Cluster("b:1", security).client_kwargs()


def test_failures_read_as_one_line() -> None:
    import ssl

    cluster = Cluster("b:9093", security_from_env(environ=SASL))
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    for failure in (connection_failure(untrusted, cluster),
                    connection_failure(KeyError("v"), cluster),
                    connection_failure(OSError("refused"), cluster)):
        assert isinstance(failure, ConnectionFailed)
        assert "\n" not in str(failure) and "b:9093" in str(failure)
    assert "not trusted" in str(connection_failure(untrusted, cluster))
    assert "SASL authentication failed" in str(connection_failure(KeyError("v"), cluster))


def test_topic_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_TOPIC_CONFIG", "min.insync.replicas=2, retention.ms=604800000")
    monkeypatch.setenv("ONCEFLOW_REPLICATION_FACTOR", "3")
    monkeypatch.setenv("ONCEFLOW_CREATE_TOPICS", "false")
    settings = WorkerSettings.from_env()
    assert settings.topic_config == (("min.insync.replicas", "2"), ("retention.ms", "604800000"))
    assert settings.replication_factor == 3 and settings.create_topics is False
    assert settings.faust_settings()["topic_replication_factor"] == 3
    for bad, named in (("ONCEFLOW_TOPIC_CONFIG", "min.insync.replicas"),
                       ("ONCEFLOW_TOPIC_CONFIG", "cleanup.policy=compact"),
                       ("ONCEFLOW_REPLICATION_FACTOR", "0")):
        monkeypatch.setenv(bad, named)
        with pytest.raises(ConfigError, match=bad):
            WorkerSettings.from_env()
        monkeypatch.delenv(bad)


def test_bridge_sides_and_dup_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from onceflow.app.bridge import bridge_dup_id, bridge_spec

    monkeypatch.setenv("ONCEFLOW_BROKER_URL", "kafka://target:9092")
    monkeypatch.setenv("ONCEFLOW_BRIDGE_SOURCE_BROKER_URL", "kafka://source:9093")
    monkeypatch.setenv("ONCEFLOW_BRIDGE_SOURCE_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("ONCEFLOW_BRIDGE_SOURCE_SASL_USERNAME", "reader")
    monkeypatch.setenv("ONCEFLOW_BRIDGE_SOURCE_SASL_PASSWORD", "pw")
    args = argparse.Namespace(source="a", target="b", from_broker=None, to_broker=None,
                              group=None, batch_size=10, dup_id_prefix="bridge:")
    spec = bridge_spec(args, WorkerSettings.from_env())
    assert spec.source.bootstrap == "source:9093"
    assert spec.source.security.sasl_username == "reader"
    assert spec.target.bootstrap == "target:9092"
    assert spec.target.security.security_protocol == "PLAINTEXT"
    assert spec.group == "onceflow-bridge.a.b"
    assert bridge_dup_id("bridge:", "a", 3, 17) == "bridge:a/3@17"
    same = argparse.Namespace(**{**vars(args), "from_broker": "kafka://target:9092",
                                 "target": "a"})
    with pytest.raises(OnceflowError, match="same topic"):
        bridge_spec(same, WorkerSettings.from_env())


def test_a_bridge_without_partitions_says_so_every_30_s(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import argparse

    from onceflow.app import bridge as bridge_module

    monkeypatch.setenv("ONCEFLOW_BROKER_URL", "kafka://target:9092")
    monkeypatch.setenv("ONCEFLOW_LOG_LEVEL", "info")
    args = argparse.Namespace(source="a", target="b", from_broker="kafka://source:9093",
                              to_broker=None, group=None, batch_size=10,
                              dup_id_prefix="bridge:")
    spec = bridge_module.bridge_spec(args, WorkerSettings.from_env())
    assert spec.log_level == "info"

    class Consumer:
        assigned: set[str] = set()

        def assignment(self) -> set[str]:
            return self.assigned

    clock = [1000.0]
    monkeypatch.setattr(bridge_module.time, "monotonic", lambda: clock[0])
    bridge = bridge_module.Bridge(spec)
    consumer = Consumer()
    bridge._consumer = consumer  # type: ignore[assignment]

    def warnings_after(seconds: float) -> int:
        clock[0] = 1000.0 + seconds
        caplog.clear()
        with caplog.at_level("WARNING", logger="onceflow.bridge"):
            bridge._check_assignment()
        return sum("no partition of a assigned" in r.getMessage() for r in caplog.records)

    assert warnings_after(29) == 0
    assert warnings_after(31) == 1
    assert warnings_after(45) == 0  # once per 30 s, not on every fetch
    assert warnings_after(61) == 1
    consumer.assigned = {"a-0"}
    assert warnings_after(62) == 0  # assigned: the wait starts again
    consumer.assigned = set()
    assert warnings_after(91) == 0
    assert warnings_after(93) == 1


def test_the_client_id_carries_the_trigger_fingerprint_into_member_ids() -> None:
    from onceflow.app.membership import _id_facts, _id_print, client_id

    mine = "14f81253f9502a80"
    uuid = "-a609c02c-a4a2-40b0-95ce-b31d16c0a4af"
    named = client_id(mine, False, "http://10.0.0.5:6066")
    assert named == f"onceflow-{mine}-6066-10.0.0.5"
    assert _id_facts(named + uuid) == (mine, "http://10.0.0.5:6066")
    assert _id_facts(client_id(mine, False, "http://[::1]:7000") + uuid) == (
        mine, "http://[::1]:7000")
    assert _id_facts(client_id(mine, False, "http://my-host.example:80")) == (
        mine, "http://my-host.example:80")
    assert _id_facts(f"onceflow-{mine}{uuid}") == (mine, None)
    assert _id_print(client_id(mine, True, "http://h:1") + uuid) is None  # a rolling change
    for other in ("faust-0.15.3-d7e29b70", "", None, f"onceflow-{mine}x", "onceflow-zz"):
        assert _id_print(other) is None
