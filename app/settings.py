"""Worker settings, from the environment (prefix ONCEFLOW_), typed and frozen.

A wrong value stops the worker at start with the variable's name and what was expected.
"""

from __future__ import annotations

import re
import socket
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from onceflow.agents.context import WorkerOptions
from onceflow.agents.signing import RouteSigner, route_key
from onceflow.errors import ConfigError
from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .flags import WORKER_FLAGS
from .security import Cluster, SecuritySettings, bootstrap_servers, security_from_env

LOG_LEVELS = {"crit": "critical", "critical": "critical", "error": "error", "warn": "warning",
              "warning": "warning", "info": "info", "debug": "debug"}

WILDCARDS = frozenset({"0.0.0.0", "::", ""})
# A token's name goes into journal reasons and the console: short, printable, one line.
TOKEN_NAME = r"[A-Za-z0-9][A-Za-z0-9 ._@+-]{0,63}"

# The consumer's request timeout (Faust's broker_request_timeout, passed as set): the group
# session may not be longer (Faust refuses to start the consumer otherwise).
REQUEST_TIMEOUT = 90.0
# The fetch loop waits up to this long for records (agents/transport.py): a poll interval
# no longer than that would make an idle worker leave its group.
FETCH_WAIT = 1.0


def own_address() -> str:
    """The address this machine's host name resolves to (127.0.0.1 when it resolves to none)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class WorkerSettings(BaseSettings):
    """Everything a worker (and the commands that talk to it) needs to know."""

    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", frozen=True, extra="ignore")

    broker_url: str = Field("kafka://127.0.0.1:9092",
                            description="Kafka bootstrap servers, kafka://host:port[,...]")
    data_dir: Path = Field(Path("onceflow-data"), description="where RocksDB tables live")
    web_host: str = Field(
        "127.0.0.1", description="web address: both WEB_BIND and WEB_ADVERTISE when unset")
    web_bind: str | None = Field(
        None, description="address the web server listens on (0.0.0.0: every address)")
    web_advertise: str | None = Field(
        None, description="host name or address the other workers and the commands reach "
        "this worker at (a wildcard bind: this host name's address)")
    web_port: int = Field(6066, ge=1, le=65535, description="port of the web views")
    partitions: int = Field(4, ge=1, description="partitions of every onceflow topic")
    admin_token: SecretStr | None = Field(
        None, description="token for POST views; signs the records of onceflow.route")
    second_admin_token: SecretStr | None = Field(
        None, description="also accepted, never used to sign (rotating the token)")
    admin_token_name: str = Field(
        "admin", description="who holds the admin token: journal reasons of what it asks "
        "for name it")
    second_admin_token_name: str = Field(
        "second", description="who holds the second admin token")
    topic_prefix: str = Field("", description="prefix of every topic name (isolation)")
    batch_size: int = Field(5000, ge=1, description="most records taken in one batch")
    chunk_size: int = Field(
        1000, ge=1, le=1_000_000,
        description="most records of a batch decided and made durable together; a "
        "rebalance waits for the chunk in hand (larger: fewer broker round trips)")
    service_concurrency: int = Field(64, ge=1, description="services running at once")
    tick_interval: float = Field(1.0, gt=0, description="seconds between clock checks")
    idle_ticks: bool = Field(True, description="move idle partitions' time to the wall clock")
    idle_after: float = Field(2.0, ge=0, description="seconds without records = idle")
    history_sweeps: bool = Field(True, description="remove history entries past their TTL")
    max_document_bytes: int = Field(1_000_000, ge=1, description="larger values: bad input")
    max_record_bytes: int = Field(
        1_048_588, ge=16_384,
        description="largest record batch the broker takes (Kafka's message.max.bytes)")
    max_clock_skew: float = Field(
        300.0, gt=0, allow_inf_nan=False,
        description="seconds partition time may run ahead of the wall clock")
    extra_topics: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="comma-separated topics read although no trigger reads them")
    session_timeout: float = Field(
        10.0, ge=0.001, le=REQUEST_TIMEOUT, allow_inf_nan=False,
        description=f"consumer group session, seconds (at most {REQUEST_TIMEOUT:g}, the "
        "consumer's request timeout)")
    heartbeat_interval: float = Field(
        1.0, ge=0.001, allow_inf_nan=False,
        description="group heartbeat, seconds (less than the session timeout)")
    max_poll_interval: float = Field(
        1000.0, gt=FETCH_WAIT, le=2_147_483, allow_inf_nan=False,
        description="seconds the consumer may go without fetching (a chunk whose services "
        "run longer) before it leaves the group and its partitions move")
    broker_lost_timeout: float = Field(
        60.0, ge=1, le=3600, allow_inf_nan=False,
        description="seconds a worker goes on while no broker answers; then it stops "
        "(exit 3)")
    stuck_after: float = Field(
        120.0, gt=0, description="seconds without fetching (or taking waiting records) "
        "after which /livez reports the consumer stuck")
    log_level: str = Field("warn", description="crit, error, warn, info or debug")
    debug_batches: bool = Field(False, description="log the offsets of every batch")
    # How clients connect: ONCEFLOW_SECURITY_PROTOCOL, ONCEFLOW_SASL_*, ONCEFLOW_SSL_*
    # (security.py reads them; a wrong one stops the worker at start).
    security: SecuritySettings = Field(default_factory=security_from_env, exclude=True)
    replication_factor: int = Field(
        -1, ge=-1, description="replicas of every topic onceflow creates; -1: the broker's "
        "default.replication.factor")
    topic_config: Annotated[tuple[tuple[str, str], ...], NoDecode] = Field(
        (), description="name=value,... topic configs of every topic onceflow creates "
        "(e.g. min.insync.replicas=2)")
    create_topics: bool = Field(
        True, description="create missing topics; false: only check the pre-created ones")

    @field_validator("admin_token_name", "second_admin_token_name")
    @classmethod
    def _token_name(cls, value: str) -> str:
        if not re.fullmatch(TOKEN_NAME, value):
            raise ValueError(f"{value[:80]!r}: expected 1 to 64 letters, digits, spaces or "
                             "._@+- starting with a letter or digit (it is written into "
                             "journal reasons and shown in the console)")
        return value

    @field_validator("heartbeat_interval")
    @classmethod
    def _heartbeat_within_session(cls, value: float, info: ValidationInfo) -> float:
        session = info.data.get("session_timeout")
        if session is not None and value >= session:
            raise ValueError(f"{value:g} s is not less than ONCEFLOW_SESSION_TIMEOUT "
                             f"({session:g} s); about a third of it or less")
        return value

    @field_validator("replication_factor")
    @classmethod
    def _replicas(cls, value: int) -> int:
        if value == 0:
            raise ValueError("0 replicas: use -1 (the broker's default) or 1 or more")
        return value

    @field_validator("topic_config", mode="before")
    @classmethod
    def _split_config(cls, value: Any) -> Any:
        if isinstance(value, str):
            pairs = []
            for item in (part.strip() for part in value.split(",")):
                if not item:
                    continue
                name, equals, setting = item.partition("=")
                if not equals or not name.strip() or not setting.strip():
                    raise ValueError(f"{item!r} is not name=value")
                if name.strip() == "cleanup.policy":
                    raise ValueError("cleanup.policy is onceflow's to set (changelogs are "
                                     "compacted, every other topic is not)")
                pairs.append((name.strip(), setting.strip()))
            return tuple(pairs)
        return value

    gc_threshold: Annotated[tuple[int, int, int], NoDecode] = Field(
        (50_000, 20, 100),
        description="the garbage collector's thresholds (gen0,gen1,gen2; Python's own: "
        "700,10,10); the worker allocates many short-lived objects a record")

    @field_validator("gc_threshold", mode="before")
    @classmethod
    def _split_threshold(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [part.strip() for part in value.split(",")]
            if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ValueError("three whole numbers above 0, as gen0,gen1,gen2 "
                                 "(Python's own: 700,10,10)")
            return tuple(int(p) for p in parts)
        return value

    allow_trigger_change: bool = Field(
        False, description="join a group whose workers run another trigger file "
        "(a rolling change of the file)")

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, value: str) -> str:
        servers = [part.strip() for part in value.split(",")]
        for server in servers:
            scheme, sep, address = server.rpartition("://")
            if sep and scheme.lower() != "kafka":
                raise ValueError(f"{server!r} has the scheme {scheme + '://'!r}; Kafka "
                                 "bootstrap servers are kafka://HOST:PORT (the kafka:// "
                                 "is optional)")
            host, colon, port = address.rstrip("/").rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{server!r} is not HOST:PORT; expected "
                                 "kafka://HOST:PORT[,HOST:PORT...]")
        return value

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        level = LOG_LEVELS.get(value.strip().lower())
        if level is None:
            raise ValueError(f"{value!r} is not a log level; expected crit, error, warn, "
                             "info or debug")
        return level

    @field_validator("extra_topics", mode="before")
    @classmethod
    def _split_topics(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(t.strip() for t in value.split(",") if t.strip())
        return value

    @classmethod
    def from_env(cls, **overrides: Any) -> WorkerSettings:
        """Read the environment; ConfigError names the variable and what was expected."""
        try:
            return cls(**overrides)
        except ValidationError as exc:
            problems = "; ".join(
                f"ONCEFLOW_{'_'.join(str(p) for p in error['loc']).upper()}: "
                + error["msg"].removeprefix("Value error, ")
                for error in exc.errors())
            raise ConfigError("environment", "worker settings", problems) from None

    @property
    def bootstrap_servers(self) -> str:
        """host:port,... for Kafka clients."""
        return bootstrap_servers(self.broker_url)

    @cached_property
    def cluster(self) -> Cluster:
        """The cluster and how every client connects to it (security.py)."""
        return Cluster(self.bootstrap_servers, self.security)

    @property
    def bind_host(self) -> str:
        """The address the web server listens on."""
        return self.web_bind or self.web_host

    @property
    def advertised_host(self) -> str:
        """The host the other workers forward requests to (Faust's canonical URL).

        A wildcard (0.0.0.0, ::) is no address to forward to: with no WEB_ADVERTISE, a
        worker that listens on every address advertises what its host name resolves to,
        the container's own address in a container.
        """
        if self.web_advertise is not None:
            return self.web_advertise
        if "web_host" in self.model_fields_set and self.web_host not in WILDCARDS:
            return self.web_host
        return self.bind_host if self.bind_host not in WILDCARDS else own_address()

    @property
    def web_url(self) -> str:
        """Where this worker's web views answer, for the other workers and the commands."""
        host = self.advertised_host
        return f"http://[{host}]:{self.web_port}" if ":" in host else \
            f"http://{host}:{self.web_port}"

    def options(self) -> WorkerOptions:
        """The agents' view of these settings."""
        return WorkerOptions(
            partitions=self.partitions, prefix=self.topic_prefix,
            service_concurrency=self.service_concurrency,
            tick_interval=self.tick_interval,
            idle_ticks=self.idle_ticks, idle_after=self.idle_after,
            history_sweeps=self.history_sweeps, max_document_bytes=self.max_document_bytes,
            max_record_bytes=self.max_record_bytes, extra_topics=self.extra_topics,
            replication_factor=self.replication_factor, topic_config=self.topic_config,
            create_topics=self.create_topics, max_clock_skew=self.max_clock_skew,
            stuck_after=self.stuck_after, chunk_size=self.chunk_size,
            route_keys=tuple(key for key in (route_key(_secret(self.admin_token)),
                                             route_key(_secret(self.second_admin_token)))
                             if key is not None))

    def route_signer(self) -> RouteSigner:
        """What signs the records a command writes to onceflow.route (as the workers do)."""
        return RouteSigner.from_tokens(_secret(self.admin_token))

    def faust_settings(self) -> dict[str, Any]:
        """Settings of the Faust app (see docs/operations.md for why each is set)."""
        return {
            "broker": ";".join(f"kafka://{s}" for s in self.bootstrap_servers.split(",")),
            "store": "onceflow-rocksdb://",  # agents/store.py
            "datadir": str(self.data_dir),
            "broker_credentials": self.cluster.faust_credentials(),
            "topic_partitions": self.partitions,
            "topic_replication_factor": self.replication_factor,
            # onceflow creates (or checks) every topic before the worker starts, with its
            # replication factor and configs (app/topics.py): Faust creates none.
            "topic_allow_declare": False,
            "topic_disable_leader": True,
            "table_standby_replicas": 0,
            "consumer_auto_offset_reset": "earliest",
            "broker_session_timeout": self.session_timeout,
            "broker_heartbeat_interval": self.heartbeat_interval,
            "broker_request_timeout": REQUEST_TIMEOUT,
            "broker_max_poll_interval": self.max_poll_interval,
            "producer_acks": -1,
            "broker_max_poll_records": self.batch_size,
            "web_host": self.advertised_host,
            "web_bind": self.bind_host,
            "web_port": self.web_port,
            "canonical_url": self.web_url,
        }


def settings_help() -> str:
    """Every ONCEFLOW_ variable with its default and meaning (for `worker --help`)."""
    flags = {field: flag for flag, (field, _) in WORKER_FLAGS.items()}
    fields = [(name, info) for name, info in WorkerSettings.model_fields.items()
              if name != "security"]
    fields += list(SecuritySettings.model_fields.items())  # read from ONCEFLOW_* as well
    rows = []
    for name, info in fields:
        flag = f" [{flags[name]}]" if name in flags else ""
        rows.append((f"ONCEFLOW_{name.upper()}", _shown(info.default),
                     f"{info.description or ''}{flag}"))
    width = max(len(row[0]) for row in rows)
    shown_width = max(len(row[1]) for row in rows)
    lines = ["settings (environment variables; default, meaning [flag]):"]
    lines += [f"  {var.ljust(width)}  {shown.ljust(shown_width)}  {meaning}"
              for var, shown, meaning in rows]
    return "\n".join(lines)


def _shown(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, tuple):
        return ",".join(item if isinstance(item, str) else str(item)
                        if isinstance(item, int) else "=".join(item)
                        for item in default) or "empty"
    return str(default) or "empty"


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None
