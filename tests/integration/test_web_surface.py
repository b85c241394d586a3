"""A worker's web port serves no table contents, and a hostile token gets 403.

Faust's own views (`/table/<table>/<key>/`, `/router/...`, its statistics and graph) would
serve raw table contents and internals to anyone who reaches the port; a worker serves
none of them.  An admin token that is not UTF-8 is a wrong token: 403, no traceback.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.process import http_json

from .support import orders_and_pairs, outcomes, publish, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = orders_and_pairs(join_timeout=None)
TOKEN = "s3cret"
SECRET = "very-private-body"


def raw_request(url: str, head: bytes) -> tuple[int, bytes]:
    """Send a request line and headers exactly as given; (status, whole response)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(head)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_no_table_contents_on_the_web_port_and_a_non_utf8_token_is_refused(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = wire.Names(prefix)
    worker = start_worker(triggers, prefix, partitions=2, admin_token=TOKEN)
    publish(broker.bootstrap, names, [
        ("order", orjson.dumps({"uuid": "o-1", "body": SECRET}), "o-1", {"dup-id": "d-1"}, 0),
        ("left", orjson.dumps({"uuid": "l-1", "activation": "a-1", "body": SECRET}),
         "l-1", {}, 0)])
    wait_journal(broker.bootstrap, names,
                 lambda ls: outcomes(ls, "o-1") == ["processed"]
                 and outcomes(ls, "l-1") == ["join-pending"], worker)
    url = worker.web_url

    # Faust's views: gone, whatever table or key is asked for.
    for path in ("/table/", "/table/history/", "/table/joins/", "/table/ingress/",
                 "/table/control/", "/table/history/o-1/", "/table/joins/a-1/",
                 "/table/control/time/", "/router/", "/router/history/",
                 "/router/history/o-1/", "/router/external/", "/assignment/", "/graph/",
                 "/performance/"):
        status, body = http_json(url + path)
        assert status == 404, (path, status, body)
        assert SECRET not in str(body) and "o-1" not in str(body), path
    status, body = http_json(url + "/")
    assert status == 200 and body == {"status": "OK"}

    # An admin token that is not UTF-8, in either header: 403, no traceback, no suspension.
    for header in (b"Authorization: Bearer \xff\xfe" + TOKEN.encode(),
                   b"X-Onceflow-Token: \xff\xfe", b"Authorization: Bearer s3\xc3(cret",
                   b"Authorization: \x80Bearer \x80"):
        status, data = raw_request(url, b"POST /triggers/orders/suspend HTTP/1.1\r\n"
                                   b"Host: worker\r\nContent-Length: 0\r\n" + header +
                                   b"\r\nConnection: close\r\n\r\n")
        assert status == 403, data
        assert b"Traceback" not in data and b"admin token" in data
    assert http_json(url + "/triggers?local=1")[1]["orders"]["suspended"] is False
    # The right token still works.
    status, _ = raw_request(url, b"POST /triggers/orders/suspend HTTP/1.1\r\nHost: worker\r\n"
                            b"Content-Length: 0\r\nAuthorization: Bearer " + TOKEN.encode() +
                            b"\r\nConnection: close\r\n\r\n")
    assert status == 202
    assert worker.alive
