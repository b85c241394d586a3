"""Where a worker's web server listens and what address it tells the others.

ONCEFLOW_WEB_BIND and ONCEFLOW_WEB_ADVERTISE split what ONCEFLOW_WEB_HOST alone set, so
a container or a pod listens on every address and advertises its own (Kubernetes: the pod
IP) with no shell wrapper.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from onceflow.app.probe import probe_url
from onceflow.app.settings import WorkerSettings, own_address
from onceflow.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ONCEFLOW_WEB_HOST", "ONCEFLOW_WEB_BIND", "ONCEFLOW_WEB_ADVERTISE",
                 "ONCEFLOW_WEB_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("env", "bind", "url"), [
    ({}, "127.0.0.1", "http://127.0.0.1:6066"),
    # The old single setting still sets both.
    ({"ONCEFLOW_WEB_HOST": "10.1.2.3"}, "10.1.2.3", "http://10.1.2.3:6066"),
    ({"ONCEFLOW_WEB_BIND": "0.0.0.0", "ONCEFLOW_WEB_ADVERTISE": "10.1.2.3"},
     "0.0.0.0", "http://10.1.2.3:6066"),
    ({"ONCEFLOW_WEB_BIND": "127.0.0.1", "ONCEFLOW_WEB_ADVERTISE": "worker-0.workers"},
     "127.0.0.1", "http://worker-0.workers:6066"),
    ({"ONCEFLOW_WEB_HOST": "0.0.0.0", "ONCEFLOW_WEB_ADVERTISE": "fd00::7",
      "ONCEFLOW_WEB_PORT": "7000"}, "0.0.0.0", "http://[fd00::7]:7000"),
    # WEB_BIND wins over WEB_HOST for the server; WEB_HOST is still what is advertised.
    ({"ONCEFLOW_WEB_HOST": "node-a", "ONCEFLOW_WEB_BIND": "0.0.0.0"},
     "0.0.0.0", "http://node-a:6066"),
])
def test_bind_and_advertised_address(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                      bind: str, url: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = WorkerSettings.from_env()
    assert settings.bind_host == bind
    assert settings.web_url == url
    faust = settings.faust_settings()
    assert faust["web_bind"] == bind
    assert faust["canonical_url"] == url


@pytest.mark.parametrize("env", [{"ONCEFLOW_WEB_BIND": "0.0.0.0"},
                                 {"ONCEFLOW_WEB_HOST": "0.0.0.0"},
                                 {"ONCEFLOW_WEB_HOST": "::"}])
def test_a_wildcard_bind_advertises_the_host_names_address(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = WorkerSettings.from_env()
    assert settings.advertised_host == own_address()
    assert settings.advertised_host not in ("0.0.0.0", "::")


def test_own_address_survives_a_host_name_that_resolves_to_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "no-such-host.invalid")
    assert own_address() == "127.0.0.1"


def test_a_bad_port_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_WEB_PORT", "http")
    with pytest.raises(ConfigError, match="ONCEFLOW_WEB_PORT"):
        WorkerSettings.from_env()


@pytest.mark.parametrize(("env", "url"), [
    ({"ONCEFLOW_WEB_BIND": "0.0.0.0", "ONCEFLOW_WEB_PORT": "7001"},
     "http://127.0.0.1:7001/livez"),
    ({"ONCEFLOW_WEB_BIND": "10.0.0.5", "ONCEFLOW_WEB_ADVERTISE": "a"},
     "http://10.0.0.5:6066/livez"),
    ({"ONCEFLOW_WEB_BIND": "::1"}, "http://[::1]:6066/livez"),
])
def test_the_health_probe_asks_the_address_the_server_listens_on(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert probe_url(WorkerSettings.from_env(), "/livez") == url


def test_the_probe_fails_plainly_when_nothing_listens(unused_tcp_port: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "onceflow.app.probe", "/livez"], capture_output=True,
        text=True, timeout=60,
        env={"ONCEFLOW_WEB_PORT": str(unused_tcp_port), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1
    assert f"127.0.0.1:{unused_tcp_port}/livez" in done.stderr
    assert "Traceback" not in done.stderr
