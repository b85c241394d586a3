"""How every Kafka client of onceflow connects: bootstrap servers and security settings.

One place builds what the clients need from the ONCEFLOW_* settings: the keyword
arguments of aiokafka's producers, consumers and admin clients (the commands, the worker's
own producer and admin client) and the credentials of the Faust app (its consumer and
producer).  The bridge reads a second and a third set under ONCEFLOW_BRIDGE_SOURCE_ and
ONCEFLOW_BRIDGE_TARGET_ (see `cluster_from_env`).

A connection that cannot be made (a wrong password, a certificate the client does not
trust, nothing listening) becomes a `ConnectionFailed` with one line that says what to
check; the password is never part of a message or a log line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from onceflow.errors import ConfigError, OnceflowError
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

# The security settings, each read from ONCEFLOW_<NAME> (or a bridge side's prefix).
SECURITY_FIELDS = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password",
                   "sasl_password_file", "ssl_cafile", "ssl_certfile", "ssl_keyfile")
# How long a client may take to connect before the command gives up (seconds): a TLS
# client on a plain listener, or the other way round, otherwise waits for its request
# timeout (40 s).
CONNECT_TIMEOUT = 10.0


class ConnectionFailed(OnceflowError):
    """A Kafka client could not connect or authenticate; the message says what to check."""


class SecuritySettings(BaseModel):
    """The security settings of one cluster connection (ONCEFLOW_SECURITY_PROTOCOL etc.)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    security_protocol: Protocol = Field(
        "PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
    sasl_mechanism: Mechanism = Field(
        "PLAIN", description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL_* protocols)")
    sasl_username: str | None = Field(None, description="SASL user name")
    sasl_password: SecretStr | None = Field(None, description="SASL password")
    sasl_password_file: Path | None = Field(
        None, description="file holding the SASL password (a mounted Kubernetes Secret)")
    ssl_cafile: Path | None = Field(
        None, description="CA certificates to trust (PEM); default: the system's")
    ssl_certfile: Path | None = Field(None, description="client certificate (PEM, mutual TLS)")
    ssl_keyfile: Path | None = Field(None, description="client certificate's key (PEM)")

    @model_validator(mode="after")
    def _consistent(self) -> SecuritySettings:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and not self.sasl_username:
            raise ValueError(f"{self.security_protocol} needs ONCEFLOW_SASL_USERNAME")
        if sasl and self.sasl_password is None and self.sasl_password_file is None:
            raise ValueError(f"{self.security_protocol} needs ONCEFLOW_SASL_PASSWORD or "
                             "ONCEFLOW_SASL_PASSWORD_FILE")
        if self.sasl_password is not None and self.sasl_password_file is not None:
            raise ValueError("set ONCEFLOW_SASL_PASSWORD or ONCEFLOW_SASL_PASSWORD_FILE, "
                             "not both")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ONCEFLOW_SSL_CERTFILE and ONCEFLOW_SSL_KEYFILE go together")
        for name in ("sasl_password_file", "ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"ONCEFLOW_{name.upper()}: no such file: {path}")
        return self

    @property
    def uses_tls(self) -> bool:
        """Whether connections are encrypted."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """Whether connections authenticate with SASL."""
        return self.security_protocol.startswith("SASL_")

    def password(self) -> str:
        """The SASL password (from the file when one is named; trailing newline dropped)."""
        if self.sasl_password_file is not None:
            try:
                return self.sasl_password_file.read_text().rstrip("\r\n")
            except OSError as exc:
                raise ConfigError("environment", "ONCEFLOW_SASL_PASSWORD_FILE",
                                  f"cannot be read: {exc.strerror}") from None
        return self.sasl_password.get_secret_value() if self.sasl_password else ""

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the clients (None without TLS); verifies the broker's name."""
        if not self.uses_tls:
            return None
        try:
            context = ssl.create_default_context(
                cafile=str(self.ssl_cafile) if self.ssl_cafile else None)
            if self.ssl_certfile is not None:
                context.load_cert_chain(str(self.ssl_certfile),
                                        str(self.ssl_keyfile) if self.ssl_keyfile else None)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError("environment", "ONCEFLOW_SSL_* files",
                              f"cannot be loaded: {exc}") from None
        return context


@dataclass(frozen=True)
class Cluster:
    """Where a Kafka cluster is and how to connect to it."""

    bootstrap: str
    security: SecuritySettings = field(default_factory=SecuritySettings)
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of aiokafka clients (producer, consumer, admin)."""
        cached = self._cache.get("kwargs")
        if cached is None:
            security = self.security
            cached = {"bootstrap_servers": self.bootstrap,
                      "security_protocol": security.security_protocol}
            if security.uses_tls:
                cached["ssl_context"] = security.ssl_context()
            if security.uses_sasl:
                cached.update(sasl_mechanism=security.sasl_mechanism,
                              sasl_plain_username=security.sasl_username,
                              sasl_plain_password=security.password())
            self._cache["kwargs"] = cached
        return dict(cached)

    def faust_credentials(self) -> Any:
        """The Faust app's `broker_credentials` (None for PLAINTEXT)."""
        import faust

        security = self.security
        kwargs = self.client_kwargs()
        if security.uses_sasl:
            return faust.SASLCredentials(
                username=security.sasl_username, password=kwargs["sasl_plain_password"],
                mechanism=security.sasl_mechanism, ssl_context=kwargs.get("ssl_context"))
        if security.uses_tls:
            return faust.SSLCredentials(kwargs["ssl_context"])
        return None

    def describe(self) -> str:
        """The bootstrap servers and how they are reached (never the password)."""
        security = self.security
        how = security.security_protocol
        if security.uses_sasl:
            how += f" {security.sasl_mechanism} as {security.sasl_username!r}"
        return f"{self.bootstrap} ({how})"


def as_cluster(where: Cluster | str) -> Cluster:
    """A Cluster; a plain "host:port,..." string is a PLAINTEXT cluster."""
    return where if isinstance(where, Cluster) else Cluster(where)


def bootstrap_servers(broker_url: str) -> str:
    """host:port,... of a broker URL (kafka://host:port[,...] or host:port[,...])."""
    servers = []
    for part in broker_url.split(","):
        part = part.strip()
        if "://" in part:
            part = part.split("://", 1)[1]
        servers.append(part.rstrip("/"))
    return ",".join(servers)


def security_from_env(prefix: str = "ONCEFLOW_", fallback: str | None = None,
                      environ: Mapping[str, str] | None = None) -> SecuritySettings:
    """The security settings under `prefix`; unset ones from `fallback`'s when given."""
    env = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for name in SECURITY_FIELDS:
        for where in (prefix, fallback):
            if where is not None and f"{where}{name.upper()}" in env:
                values[name] = env[f"{where}{name.upper()}"]
                break
    try:
        return SecuritySettings(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(_problem(prefix, error) for error in exc.errors())
        raise ConfigError("environment", "Kafka security settings", problems) from None


def _problem(prefix: str, error: Any) -> str:
    location = "_".join(str(p) for p in error["loc"]).upper()
    message = str(error["msg"]).removeprefix("Value error, ")
    if not location:
        return message if prefix == "ONCEFLOW_" else f"{prefix}*: {message}"
    return f"{prefix}{location}: {message}"


def connection_failure(exc: BaseException, cluster: Cluster) -> ConnectionFailed:
    """A one-line account of why a client could not connect to `cluster`."""
    where = cluster.describe()
    text = str(exc) or type(exc).__name__
    if isinstance(exc, socket.gaierror):  # its errno is getaddrinfo's, not the system's
        text = f"the host name cannot be resolved ({exc.strerror or exc})"
    elif isinstance(exc, OSError) and exc.errno and not isinstance(exc, ssl.SSLError):
        text = os.strerror(exc.errno).lower()  # "connection refused", not asyncio's words
    security = cluster.security
    if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        reason = getattr(exc, "verify_message", None) or "certificate verify failed"
        return ConnectionFailed(
            f"cannot connect to {where}: the broker's TLS certificate is not trusted "
            f"({reason}); set ONCEFLOW_SSL_CAFILE to the CA that signed it")
    if isinstance(exc, ssl.SSLError) or "SSL" in type(exc).__name__:
        return ConnectionFailed(f"cannot connect to {where}: TLS handshake failed ({text}); "
                                "does the broker listen with TLS on that port?")
    if security.uses_sasl and _is_auth_failure(exc):
        return ConnectionFailed(
            f"cannot connect to {where}: SASL authentication failed (wrong user name or "
            "password, or a mechanism the broker does not offer for this user); check "
            "ONCEFLOW_SASL_USERNAME, ONCEFLOW_SASL_PASSWORD(_FILE) and ONCEFLOW_SASL_MECHANISM")
    return ConnectionFailed(f"cannot connect to {where}: {text}; check ONCEFLOW_BROKER_URL and "
                            "ONCEFLOW_SECURITY_PROTOCOL")


def _is_auth_failure(exc: BaseException) -> bool:
    from aiokafka import errors

    if isinstance(exc, (errors.SaslAuthenticationFailed, errors.AuthenticationFailedError,
                        errors.AuthenticationMethodNotSupported,
                        errors.UnsupportedSaslMechanismError, errors.IllegalSaslStateError)):
        return True
    # aiokafka's SCRAM client reads the server's final message without checking it for an
    # error: a refused proof surfaces as KeyError('v'), a refused user as other parse errors.
    return isinstance(exc, (KeyError, ValueError, AssertionError))


class _Causes(logging.Handler):
    """Keeps what aiokafka logs while a client starts: its bootstrap error hides the cause."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        for arg in record.args if isinstance(record.args, tuple) else ():
            if isinstance(arg, BaseException):
                self.errors.append(arg)


async def started(client: Any, cluster: Cluster, timeout: float = CONNECT_TIMEOUT) -> Any:
    """Start an aiokafka client; a failure becomes ConnectionFailed (one line).

    aiokafka logs why each bootstrap connection failed and then raises a bare "Unable to
    bootstrap"; the logged cause (an untrusted certificate, a refused login) is what the
    message reports, and those log lines are kept off the terminal.
    """
    logger = logging.getLogger("aiokafka")
    causes = _Causes()
    propagate = logger.propagate
    logger.addHandler(causes)
    logger.propagate = False
    try:
        await asyncio.wait_for(client.start(), timeout)
    except Exception as exc:
        await _stop(client)
        cause = causes.errors[-1] if causes.errors else exc
        if isinstance(exc, TimeoutError) and not causes.errors:
            raise ConnectionFailed(
                f"cannot connect to {cluster.describe()}: no answer within {timeout:g} s; "
                "check ONCEFLOW_BROKER_URL, and that ONCEFLOW_SECURITY_PROTOCOL matches the "
                "listener (TLS or not)") from None
        raise connection_failure(cause, cluster) from None
    finally:
        logger.removeHandler(causes)
        logger.propagate = propagate
    return client


async def _stop(client: Any) -> None:
    stop = getattr(client, "stop", None) or getattr(client, "close", None)
    try:
        if stop is not None:
            await stop()
    except Exception:
        pass
