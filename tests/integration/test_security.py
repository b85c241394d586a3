"""Secured clusters: a worker and `onceflow send` over TLS and over SASL/SCRAM, and the
failures an operator meets (wrong password, untrusted certificate) as one clear line.

tansu cannot serve TLS or keep SCRAM users (see secure.py): the TLS and SCRAM ends are a
front in front of it; tansu's own `--authentication` is used for its failure.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from cli_runner import onceflow
from onceflow.agents.wire import Names
from onceflow.app.broker import free_port
from onceflow.app.process import WorkerProcess

from .secure import Certificates, SecureBroker, make_certificates
from .support import ORDERS_ONLY, journal

pytestmark = pytest.mark.integration

TRIGGERS = ORDERS_ONLY
USERS = {"SCRAM-SHA-256": {"alice": "alice-pw"}, "SCRAM-SHA-512": {"bob": "bob-pw, with ="},
         "PLAIN": {"dave": "dave-pw"}}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory,
                  certificates: Certificates) -> Iterator[SecureBroker]:
    """TLS and SCRAM logins in front of tansu."""
    broker = SecureBroker(tmp_path_factory.mktemp("secure") / "tansu.log",
                          certificates=certificates, users=USERS).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """SCRAM and PLAIN logins without TLS in front of tansu."""
    broker = SecureBroker(tmp_path_factory.mktemp("sasl") / "tansu.log", users=USERS).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory,
               certificates: Certificates) -> Iterator[SecureBroker]:
    """TLS (no SASL) in front of tansu."""
    broker = SecureBroker(tmp_path_factory.mktemp("tls") / "tansu.log",
                          certificates=certificates).start()
    yield broker
    broker.stop()


def security_env(certificates: Certificates, protocol: str, mechanism: str | None = None,
                 user: str | None = None, password_file: Path | None = None
                 ) -> dict[str, str]:
    env = {"ONCEFLOW_SECURITY_PROTOCOL": protocol}
    if protocol.endswith("SSL"):
        env["ONCEFLOW_SSL_CAFILE"] = str(certificates.ca)
    if mechanism is not None and user is not None:
        env["ONCEFLOW_SASL_MECHANISM"] = mechanism
        env["ONCEFLOW_SASL_USERNAME"] = user
        if password_file is not None:
            password_file.write_text(USERS[mechanism][user] + "\n")
            env["ONCEFLOW_SASL_PASSWORD_FILE"] = str(password_file)
        else:
            env["ONCEFLOW_SASL_PASSWORD"] = USERS[mechanism][user]
    return env


def orders_file(path: Path, count: int) -> Path:
    path.write_text("".join(
        orjson.dumps({"ts": 0, "topic": "order", "key": f"o-{i}",
                      "value": {"uuid": f"o-{i}", "body": {"n": i}}}).decode() + "\n"
        for i in range(count)))
    return path


@pytest.mark.parametrize("protocol,mechanism,user", [
    ("SSL", None, None),
    ("SASL_SSL", "SCRAM-SHA-256", "alice"),
    ("SASL_SSL", "SCRAM-SHA-512", "bob"),
    ("SASL_SSL", "PLAIN", "dave"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256", "alice"),
])
def test_worker_and_send_over_a_secured_connection(
        request: pytest.FixtureRequest, certificates: Certificates, tmp_path: Path,
        protocol: str, mechanism: str | None, user: str | None) -> None:
    secure_broker: SecureBroker = request.getfixturevalue(
        {"SSL": "tls_broker", "SASL_SSL": "secure_broker", "SASL_PLAINTEXT": "sasl_broker"}[
            protocol])
    prefix = f"sec{os.getpid()}{int(time.time() * 1000) % 100000}."
    names = Names(prefix)
    # The SCRAM-SHA-512 user's password comes from a file, as a Kubernetes Secret mounts it.
    secret = tmp_path / "password" if mechanism == "SCRAM-SHA-512" else None
    security = security_env(certificates, protocol, mechanism, user, secret)
    env = {"ONCEFLOW_BROKER_URL": secure_broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
           "ONCEFLOW_PARTITIONS": "2", "ONCEFLOW_DATA_DIR": str(tmp_path / "data"),
           "ONCEFLOW_WEB_PORT": str(free_port()), **security}
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    worker = WorkerProcess(triggers, env, tmp_path / "worker.log").start()
    try:
        worker.wait_ready()
        sent = onceflow("send", str(orders_file(tmp_path / "orders.jsonl", 20)), env=env)
        assert sent.returncode == 0, sent.stderr
        assert "sent 20 record(s)" in sent.stdout
        deadline = time.monotonic() + 60
        from onceflow.app.security import Cluster, security_from_env

        cluster = Cluster(secure_broker.bootstrap, security_from_env(environ=env))
        lines: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            lines = journal(cluster, names)
            if len([line for line in lines if line["outcome"] == "processed"]) == 20:
                break
            assert worker.alive, worker.log_path.read_text()[-3000:]
            time.sleep(0.3)
        done = sorted(str(line["identity"]) for line in lines if line["outcome"] == "processed")
        assert done == sorted(f"o-{i}" for i in range(20))
    finally:
        worker.stop()
    assert USERS.get(mechanism or "", {}).get(user or "", "no password") not in \
        worker.log_path.read_text()


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_wrong_password_and_untrusted_certificate_fail_with_one_line(
        secure_broker: SecureBroker, certificates: Certificates, tmp_path: Path) -> None:
    orders = orders_file(tmp_path / "orders.jsonl", 1)
    base = {"ONCEFLOW_BROKER_URL": secure_broker.url, "ONCEFLOW_TOPIC_PREFIX": "bad.",
            "ONCEFLOW_DATA_DIR": str(tmp_path / "data"), "ONCEFLOW_WEB_PORT": str(free_port())}
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    wrong = {**base, **security_env(certificates, "SASL_SSL", "SCRAM-SHA-256", "alice"),
             "ONCEFLOW_SASL_PASSWORD": "not-alices-password"}
    for command in (["send", str(orders)], ["worker", "--triggers", str(triggers)],
                    ["bridge", "--from", "a", "--to", "b"]):
        result = onceflow(*command, env=wrong)
        assert_one_clear_line(result, "SASL authentication failed", "alice")
        assert "not-alices-password" not in result.stderr + result.stdout
    untrusted = {**base, **security_env(certificates, "SASL_SSL", "SCRAM-SHA-256", "alice"),
                 "ONCEFLOW_SSL_CAFILE": str(certificates.other_ca)}
    for command in (["send", str(orders)], ["worker", "--triggers", str(triggers)]):
        assert_one_clear_line(onceflow(*command, env=untrusted),
                              "certificate is not trusted", "ONCEFLOW_SSL_CAFILE")
    # A plaintext client at a TLS listener: refused at once, not a 40 s wait.
    assert_one_clear_line(onceflow("send", str(orders), env=base), "cannot connect")


def test_tansu_authentication_refuses_a_login_in_one_line(tmp_path: Path) -> None:
    """tansu's own SASL (it keeps no users, so every login fails): one clear line."""
    broker = SecureBroker(tmp_path / "tansu.log", tansu_authentication=True).start()
    try:
        env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
               "ONCEFLOW_SASL_MECHANISM": "SCRAM-SHA-512", "ONCEFLOW_SASL_USERNAME": "carol",
               "ONCEFLOW_SASL_PASSWORD": "carol-pw"}
        result = onceflow("send", str(orders_file(tmp_path / "o.jsonl", 1)), env=env)
        assert_one_clear_line(result, "SASL authentication failed", "carol")
    finally:
        broker.stop()


def test_bad_security_settings_stop_the_command_naming_the_variable(tmp_path: Path) -> None:
    orders = orders_file(tmp_path / "orders.jsonl", 1)
    cases = [
        ({"ONCEFLOW_SECURITY_PROTOCOL": "TLS"}, "ONCEFLOW_SECURITY_PROTOCOL"),
        ({"ONCEFLOW_SECURITY_PROTOCOL": "SASL_SSL"}, "ONCEFLOW_SASL_USERNAME"),
        ({"ONCEFLOW_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "ONCEFLOW_SASL_USERNAME": "u"},
         "ONCEFLOW_SASL_PASSWORD"),
        ({"ONCEFLOW_SECURITY_PROTOCOL": "SSL", "ONCEFLOW_SSL_CAFILE": str(tmp_path / "nope")},
         "ONCEFLOW_SSL_CAFILE"),
        ({"ONCEFLOW_SASL_MECHANISM": "GSSAPI"}, "ONCEFLOW_SASL_MECHANISM"),
        ({"ONCEFLOW_SECURITY_PROTOCOL": "SSL", "ONCEFLOW_SSL_CAFILE": str(orders)},
         "ONCEFLOW_SSL"),
    ]
    for env, variable in cases:
        result = onceflow("send", str(orders), env={
            "ONCEFLOW_BROKER_URL": f"kafka://127.0.0.1:{free_port()}", **env})
        assert_one_clear_line(result, variable)
