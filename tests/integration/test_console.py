"""The operators' console in a real browser (headless Chromium through chromedriver).

One real worker on the embedded broker and one browser serve the whole module.  The
browser test clicks suspend and resume and reads the results on the page, looks up history
(with the activation of a join trigger), resubmits an error document and watches the live
journal.  Screenshots of each step are kept in test-output/console/ (printed with -s).
"""

from __future__ import annotations

import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.process import WorkerProcess

from .support import journal, outcomes, publish, wait_journal

pytestmark = pytest.mark.integration

TOKEN = "console-s3cret"
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "console"
HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'
SCRIPT = "<script>document.title='pwned'</script>"
TRIGGERS = """
[[trigger]]
name = "orders"
types = ["order"]
service = "scripted"
history_ttl = "1d"

[[trigger]]
name = "pairs"
types = ["left", "right"]
service = "scripted"
condition = "all"
join_timeout = "10m"
"""
SENT = [("order", orjson.dumps({"uuid": f"o-{i}"}), f"o-{i}", {}, None) for i in range(3)]
SENT += [("order", orjson.dumps({"uuid": HOSTILE}), "x", {}, None),
         ("order", orjson.dumps({"uuid": "bad-1", "body": {"raise": "fatal"}}), "b", {}, None),
         ("left", orjson.dumps({"uuid": "l-1", "activation": "act-1"}), "act-1", {}, None),
         ("left", orjson.dumps({"uuid": SCRIPT, "activation": SCRIPT}), "s", {}, None),
         ("left", orjson.dumps({"uuid": "l-2", "activation": "act-2"}), "act-2", {}, None),
         ("right", orjson.dumps({"uuid": "r-2", "activation": "act-2"}), "act-2", {}, None)]


class Console:
    """The module's worker, its topic names and the broker."""

    def __init__(self, worker: WorkerProcess, names: wire.Names, bootstrap: Any) -> None:
        self.worker, self.names, self.bootstrap = worker, names, bootstrap
        self.url = worker.web_url


@pytest.fixture(scope="module")
def console(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Console]:
    folder = tmp_path_factory.mktemp("console")
    triggers = folder / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = f"t{uuid.uuid4().hex[:10]}."
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
           "ONCEFLOW_PARTITIONS": "2", "ONCEFLOW_DATA_DIR": str(folder / "data"),
           "ONCEFLOW_WEB_PORT": str(free_port()),
           "ONCEFLOW_SECURITY_PROTOCOL": "PLAINTEXT", "ONCEFLOW_ADMIN_TOKEN": TOKEN}
    worker = WorkerProcess(triggers, env, folder / "worker.log").start()
    try:
        worker.wait_ready()
        names = wire.Names(prefix)
        publish(broker.bootstrap, names, SENT)
        wait_journal(broker.bootstrap, names, lambda ls: len(ls) >= len(SENT), worker)
        yield Console(worker, names, broker.bootstrap)
    finally:
        worker.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-dev-shm-usage", "--window-size=1400,2000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # the page is still being rendered
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"the page never showed {what} (last: {last!r})")


def raw_request(url: str, head: bytes) -> tuple[int, bytes]:
    """Send bytes exactly as given; (status, whole response)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(head)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_browsers_get_the_page_and_json_clients_keep_json(console: Console) -> None:
    url = console.url
    for accept in ("application/json", "*/*", "application/json, text/html"):
        answer = httpx.get(url + "/", headers={"Accept": accept})
        assert answer.json() == {"status": "OK"}, accept
    assert httpx.get(url + "/").json() == {"status": "OK"}  # httpx, curl: no text/html
    page = httpx.get(url + "/", headers={
        "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"})
    assert page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    body = page.text.split("<body>")[1]
    assert "<script" not in body and "http" not in body  # no inline script, no other origin
    script = httpx.get(url + "/console/console.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in script.text and "http" not in script.text
    assert httpx.get(url + "/console/console.css").headers["content-type"].startswith(
        "text/css")
    # The JSON views keep their paths and answers, and are not sniffed either.
    triggers = httpx.get(url + "/triggers", headers={"Accept": "text/html"})
    assert set(triggers.json()["triggers"]) == {"orders", "pairs"}
    assert triggers.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(url + "/readyz").json()["ready"] is True
    overview = httpx.get(url + "/overview").json()
    assert overview["triggers"]["orders"]["definition"]["history_ttl"] == "1d"
    assert overview["triggers"]["pairs"]["definition"]["join_timeout"] == "10m"
    # Lag per input topic of the group: the trigger files' topics and the route topic,
    # never a changelog; every partition of each once.
    lag = overview["lag"]
    assert lag["group"] == console.names.app_id
    by_topic = {t["topic"]: t for t in lag["topics"]}
    assert set(by_topic) == {"order", "left", "right", "onceflow.route"}
    assert by_topic["order"]["triggers"] == ["orders"]
    assert by_topic["onceflow.route"]["route"] is True
    for facts in by_topic.values():
        assert [p["partition"] for p in facts["partitions"]] == [0, 1]
        known = [p["lag"] for p in facts["partitions"] if p["lag"] is not None]
        assert facts["lag"] == (sum(known) if known else None)
        assert facts["unknown"] == 2 - len(known)
        assert facts["name"] == console.names.topic(facts["topic"])


def test_console_in_a_browser(console: Console, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    SHOTS.mkdir(parents=True, exist_ok=True)

    def shot(name: str) -> None:
        path = SHOTS / f"{name}.png"
        browser.save_screenshot(str(path))
        print(f"console screenshot: {path}")

    def text(element_id: str) -> str:
        return str(browser.find_element(By.ID, element_id).text)

    names = console.names
    browser.get(console.url + "/")

    def row_text(trigger: str) -> str:
        # One read of a row (the table is redrawn every few seconds; a row kept across a
        # redraw would be stale).
        return str(browser.find_element(By.CSS_SELECTOR, f'tr[data-trigger="{trigger}"]').text)

    orders = until(lambda: (lambda t: t if "processed 4" in t else "")(row_text("orders")),
                   "4 processed orders")
    assert "error 1" in orders and "running" in orders
    assert "1d" in orders and "86400" not in orders  # durations as written
    pairs = until(lambda: row_text("pairs"), "the pairs trigger")
    assert "10m" in pairs and "600" not in pairs
    until(lambda: "act-1" in text("joins"), "the open join")
    assert "left: l-1" in text("joins")
    assert "(in 9m " in text("joins") or "(in 10m)" in text("joins")  # not "(in 600)"
    assert " UTC (in " in text("joins") and "expires (UTC)" in text("joins")
    workers = text("workers")
    assert "this worker" in workers and "ready" in workers
    # Lag: summed per input topic of the consumer group, partitions on demand only.
    lag = until(lambda: (lambda t: t if "onceflow.route" in t else "")(text("lag")),
                "the lag of the route topic")
    assert f"Consumer group {names.app_id}" in text("lag-group")
    def lag_row(topic: str) -> tuple[str, str]:
        row_of = browser.find_element(By.CSS_SELECTOR, f'#lag tr[data-topic="{topic}"]')
        return row_of.find_element(By.CSS_SELECTOR, "td.lag").text, row_of.text

    def drained(topic: str) -> tuple[str, str] | None:
        shown, row = lag_row(topic)
        return (shown, row) if shown.startswith(("0", "not known yet")) else None

    for topic in ("order", "left", "right"):
        # (until: one read of the row, again if a redraw made it stale, and until the
        # worker's commit of the records it processed has reached the page: on a quiet
        # machine the page can show the lag before that commit)
        shown, row = until(lambda topic=topic: drained(topic), f"no lag on {topic}")
        assert "2 partition(s)" in row
    assert "-changelog" not in lag and "committed" not in lag  # details closed
    assert "-changelog" not in workers  # the worker's own partition list: closed too
    until(lambda: browser.find_element(
        By.CSS_SELECTOR, '#lag tr[data-topic="order"] summary').click() or True,
          "a clickable summary in the order row")
    until(lambda: "committed" in browser.find_element(
        By.CSS_SELECTOR, '#lag tr[data-topic="order"]').text, "the order partitions")
    time.sleep(3.5)  # a redraw keeps it open
    assert "committed" in until(lambda: browser.find_element(
        By.CSS_SELECTOR, '#lag tr[data-topic="order"]').text, "the order row")
    until(lambda: browser.find_element(By.CSS_SELECTOR, "#workers summary").click() or True,
          "a clickable summary of the workers")
    until(lambda: "-changelog" in text("workers") and names.route in text("workers"),
          "every partition of the worker, changelogs included")

    # The live journal shows the documents sent, ids with markup as plain text.
    until(lambda: all(f"o-{i}" in text("journal") for i in range(3)), "the sent orders")
    until(lambda: HOSTILE in text("journal"), "the <img> identity as text in the journal")
    assert "time (UTC)" in text("journal") and " UTC" in text("journal").split("\n")[1]
    assert SCRIPT in text("journal") and SCRIPT in text("joins")
    assert browser.title == "onceflow console"  # no identity's markup ran
    assert not browser.find_elements(By.CSS_SELECTOR, "#journal img, #joins script")
    shot("1-overview")

    def orders_row() -> Any:
        return browser.find_element(By.CSS_SELECTOR, 'tr[data-trigger="orders"]')

    def click_in_orders_row(button: str) -> None:
        # The overview table is redrawn every few seconds: a row found just before a
        # redraw is stale and its click never happens, so find it again and retry.
        until(lambda: orders_row().find_element(By.CSS_SELECTOR, button).click() or True,
              f"a clickable {button} in the orders row")

    # Suspend without a token: the page says so, nothing changes.
    click_in_orders_row("button.suspend")
    until(lambda: "admin token" in text("status"), "the token request")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "token-save").click()
    assert TOKEN not in browser.current_url
    assert browser.find_element(By.ID, "token").get_attribute("value") == ""
    assert browser.execute_script(
        "return sessionStorage.getItem('onceflow-admin-token')") == TOKEN

    click_in_orders_row("button.suspend")
    until(lambda: "Suspended orders" in text("status"), "the suspend answer")
    assert "as admin." in text("status")  # the default name of ONCEFLOW_ADMIN_TOKEN
    until(lambda: "suspended" in orders_row().find_element(By.CSS_SELECTOR, "td.state").text,
          "orders suspended")
    shot("2-suspended")
    assert httpx.get(console.url + "/triggers").json()["triggers"]["orders"]["suspended"]
    assert any(line["outcome"] == "suspended" and line["trigger"] == "orders"
               and line["reason"] == "suspended by command (admin)"
               for line in journal(console.bootstrap, names))
    click_in_orders_row("button.resume")
    until(lambda: "Resumed orders" in text("status"), "the resume answer")
    until(lambda: "running" in orders_row().find_element(By.CSS_SELECTOR, "td.state").text,
          "orders running again")
    assert not httpx.get(console.url + "/triggers").json()["triggers"]["orders"]["suspended"]
    shot("3-resumed")

    # History lookup: a simple trigger, then a join trigger with its activation.
    Select(browser.find_element(By.ID, "history-trigger")).select_by_value("orders")
    browser.find_element(By.ID, "history-identity").send_keys("o-1")
    browser.find_element(By.ID, "history-go").click()
    until(lambda: "o-1: completed" in text("history-result"), "o-1's completed entry")
    assert "kept for 1d" in text("history-result")
    Select(browser.find_element(By.ID, "history-trigger")).select_by_value("pairs")
    browser.find_element(By.ID, "history-identity").clear()
    browser.find_element(By.ID, "history-identity").send_keys("l-2")
    browser.find_element(By.ID, "history-activation").send_keys("act-2")
    browser.find_element(By.ID, "history-go").click()
    until(lambda: "l-2: completed" in text("history-result"), "l-2's entry in act-2")
    browser.find_element(By.ID, "history-identity").clear()
    browser.find_element(By.ID, "history-identity").send_keys("nobody")
    browser.find_element(By.ID, "history-go").click()
    until(lambda: "nobody: no history entry" in text("history-result"), "no entry")
    shot("4-history")

    # Error documents, resubmitted from the page.
    Select(browser.find_element(By.ID, "docs-trigger")).select_by_value("orders")
    Select(browser.find_element(By.ID, "docs-outcome")).select_by_value("error")
    browser.find_element(By.ID, "docs-load").click()
    failed = until(lambda: browser.find_element(By.CSS_SELECTOR,
                                                '#docs tr[data-identity="bad-1"]'),
                   "the error document")
    shot("5-errors")
    assert " UTC" in failed.text  # the record time says its zone
    confirm = browser.find_element(By.ID, "docs-confirm")
    assert not confirm.is_displayed()
    # The page asks first; cancelled, nothing is sent.
    failed.find_element(By.CSS_SELECTOR, "button.resubmit").click()
    until(lambda: confirm.is_displayed(), "the resubmit confirmation")
    assert "Resubmit 1 error document(s) of orders (bad-1)?" in text("docs-confirm-text")
    shot("5a-confirm")
    browser.find_element(By.ID, "docs-confirm-no").click()
    until(lambda: "nothing was sent" in text("docs-result"), "the cancelled resubmit")
    assert not confirm.is_displayed()
    assert outcomes(journal(console.bootstrap, names), "bad-1", "orders").count("error") == 1
    # Confirmed: the answer is shown beside the documents, and the row says so.
    failed.find_element(By.CSS_SELECTOR, "button.resubmit").click()
    until(lambda: confirm.is_displayed(), "the resubmit confirmation")
    browser.find_element(By.ID, "docs-confirm-yes").click()
    until(lambda: "Resubmitted 1 error document(s) of orders" in text("status"),
          "the resubmit answer")
    until(lambda: "Resubmitted 1 error document(s) of orders as admin: bad-1 ("
          in text("docs-result"), "the resubmit result beside the documents")
    assert "resubmitted" in browser.find_element(
        By.CSS_SELECTOR, '#docs tr[data-identity="bad-1"]').text
    wait_journal(console.bootstrap, names,
                 lambda ls: outcomes(ls, "bad-1", "orders").count("error") == 2,
                 console.worker)
    until(lambda: len(browser.find_elements(
        By.CSS_SELECTOR, '#journal tr[data-identity="bad-1"][data-outcome="error"]')) == 2,
        "the second error in the live journal")
    shot("6-resubmitted")
    assert console.worker.alive


def test_hostile_requests_get_a_clear_4xx_and_the_worker_goes_on(console: Console) -> None:
    url = console.url
    for path in ("/console/..%2F..%2Fweb.py", "/console/index.html", "/console/../web.py",
                 "/nothing-here", "/documents/nope", "/documents/%3Cscript%3E"):
        answer = httpx.get(url + path)
        assert answer.status_code == 404, (path, answer.text)
        assert "Traceback" not in answer.text
        # Echoed names are JSON, never a page a browser would run.
        assert not answer.headers.get("content-type", "").startswith("text/html")
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(url + "/documents/orders?outcome=%00%ff").status_code == 400
    assert httpx.get(url + "/documents/pairs?outcome=error").json()["documents"] == []
    # A huge query string, a request line of bytes that are not UTF-8, a huge header.
    huge = b"GET /overview?" + b"a=" + b"x" * 200_000 + b" HTTP/1.1\r\nHost: w\r\n" \
        b"Connection: close\r\n\r\n"
    for head in (huge,
                 b"GET /\xff\xfe/\xc3( HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n",
                 b"GET /history/orders/\xff?activation=\xfe HTTP/1.1\r\nHost: w\r\n"
                 b"Connection: close\r\n\r\n",
                 b"GET /journal/tail HTTP/1.1\r\nHost: w\r\nX-Big: " + b"y" * 100_000 +
                 b"\r\nConnection: close\r\n\r\n",
                 b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64):  # TLS hello
        status, data = raw_request(url, head)
        assert 400 <= status < 500, (head[:40], data[:300])
        assert b"Traceback" not in data
    # Resubmit: the token, then a body that is not what it must be.
    assert httpx.post(url + "/triggers/orders/resubmit", content=b"{}").status_code == 403
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for body in (b"\xff\xfe", b"[]", b"null", b'{"outcome": "processed"}',
                 b'{"outcome": "error", "identities": "x"}',
                 b'{"outcome": "error", "identities": [1]}',
                 orjson.dumps({"outcome": "error", "identities": ["x" * 1001]}),
                 orjson.dumps({"outcome": "error", "identities": ["x"] * 1001})):
        answer = httpx.post(url + "/triggers/orders/resubmit", content=body, headers=auth)
        assert answer.status_code == 400, (body[:40], answer.text)
    huge_body = httpx.post(url + "/triggers/orders/resubmit", headers=auth,
                           content=b'{"outcome": "error", "identities": ["' + b"x" * 3_000_000
                           + b'"]}')
    assert 400 <= huge_body.status_code < 500
    for method, path in (("POST", "/overview"), ("DELETE", "/"), ("GET",
                         "/triggers/orders/suspend"), ("PUT", "/console/console.js")):
        answer = httpx.request(method, url + path, headers=auth)
        assert answer.status_code == 405, (method, path, answer.status_code)
    assert not httpx.get(url + "/triggers").json()["triggers"]["orders"]["suspended"]
    answer = httpx.post(url + "/triggers/%3Cscript%3E/resubmit", headers=auth,
                        content=b'{"outcome": "error"}')
    assert answer.status_code == 404 and "<script>" in answer.json()["error"]
    answer = httpx.post(url + "/triggers/orders/resubmit", headers=auth,
                        content=b'{"outcome": "in-doubt"}')
    assert answer.status_code == 202 and answer.json()["resubmitted"] == []
    assert httpx.get(url + "/overview?local=1").json()["url"] == url
    assert httpx.get(url + "/livez").status_code == 200
    assert console.worker.alive


def test_dead_letters_are_listed_as_text_bounded_and_never_fail(console: Console,
                                                                browser: Any) -> None:
    """Bad input a publisher sent, and records anyone wrote to the dead-letter topic."""
    import asyncio

    from onceflow.app.kafka import Producer
    from selenium.webdriver.common.by import By

    names = console.names
    hostile = b"<script>document.title='pwned'</script> is not JSON"
    publish(console.bootstrap, names, [("order", hostile, "k-hostile", {}, None)])
    big = orjson.dumps({"reason": SCRIPT, "topic": "order", "partition": 0, "offset": 7,
                        "ts": 1.5, "value": {"text": "y" * 50_000}})
    deep = orjson.dumps({"reason": "deep", "topic": "order", "partition": 1, "offset": 2,
                         "value": [[[[[]]]]]}).replace(b"[[[[[]]]]]",
                                                       b"[" * 400 + b"]" * 400)

    async def write() -> None:
        async with Producer(console.bootstrap) as producer:
            for value, key, headers in (
                    (b"\xff\xfe not json <b>bold</b>", b"\xff\x00key",
                     [("reason", None), ("x", b"\xc3(")]),
                    (None, b"null-value", [("reason", b"a null value")]),
                    (b"[1, 2]", b"list", []),
                    (big, b"big", []),
                    (deep, b"deep", [])):
                await producer.send_and_wait(names.dead_letter, value, key=key, partition=0,
                                             headers=headers)
            # The in-doubt list reads its topic the same way: a null header is no failure.
            await producer.send_and_wait(names.topic("orders.in-doubt"), b"not json",
                                         key=b"k", headers=[("identity", None)])

    asyncio.run(write())

    def listed() -> Any:
        answer = httpx.get(console.url + "/dead-letters?limit=100")
        assert answer.status_code == 200, answer.text
        found = answer.json()["records"]
        return found if len(found) >= 6 else None

    found = until(listed, "the six dead letters")
    copy = next(r for r in found if r["key"] == "k-hostile")
    assert copy["onceflow_copy"] and copy["original"]["topic"] == "order"
    assert copy["preview"].startswith("<script>") and copy["reason"]
    by_key = {r["key"]: r for r in found}
    odd = by_key["\ufffd\x00key"]
    assert odd["reason"] is None and odd["original"] is None
    assert odd["headers"] == {"reason": None, "x": "\ufffd("}
    assert "<b>bold</b>" in odd["preview"]
    null = by_key["null-value"]
    assert null["preview"] is None and null["reason"] == "a null value"
    assert null["value_bytes"] == 0
    assert by_key["list"]["preview"] == "[1, 2]" and by_key["list"]["original"] is None
    large = by_key["big"]
    assert large["reason"] == SCRIPT and large["original"]["offset"] == 7
    assert len(large["preview"]) < 1100 and "(50011 characters)" in large["preview"]
    assert large["value_bytes"] == len(big)
    assert by_key["deep"]["preview"].startswith("{")  # too deep to write again: as sent
    in_doubt = httpx.get(console.url + "/documents/orders?outcome=in-doubt")
    assert in_doubt.status_code == 200, in_doubt.text
    assert [(d["identity"], d["value"]) for d in in_doubt.json()["documents"]] == [
        (None, "not json")]
    # Bounded: at most 100, the newest first asked; anything else is 400.
    assert len(httpx.get(console.url + "/dead-letters?limit=2").json()["records"]) == 2
    for limit in ("0", "101", "-1", "x", "9" * 5000, "1e2"):
        answer = httpx.get(console.url + "/dead-letters", params={"limit": limit})
        assert answer.status_code == 400, limit

    # The page shows them as text: no markup in them runs.
    def page() -> Any:
        # Once in a full run on two cores (2026-11-27) the load ended on a page without
        # the console's button: the page is asked for again, and what it was is kept.
        browser.get(console.url + "/")
        found = browser.find_elements(By.ID, "dead-load")
        if not found:
            raise AssertionError(f"a page without it: {browser.page_source[:300]!r}")
        return found

    until(page, "the dead-letter button")[0].click()
    until(lambda: "(50011 characters)" in browser.find_element(By.ID, "dead").text,
          "the clipped dead letter")
    shown = browser.find_element(By.ID, "dead").text
    assert "<script>document.title='pwned'</script> is not JSON" in shown
    assert SCRIPT in shown and "<b>bold</b>" in shown and "order/0@7" in shown
    assert "(not a copy onceflow wrote)" in shown and " UTC" in shown
    assert browser.title == "onceflow console"
    assert not browser.find_elements(By.CSS_SELECTOR, "#dead script, #dead b")
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "7-dead-letters.png"))
    assert console.worker.alive
