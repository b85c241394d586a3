"""The operators' console in a real browser (headless Chromium through chromedriver).

A real worker on the embedded broker serves the page; the test clicks suspend and resume,
reads the results on the page, looks up history, resubmits an error document and watches
the live journal.  Screenshots of each step are kept in test-output/console/.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker

from .support import journal, outcomes, publish, wait_journal

pytestmark = pytest.mark.integration

TOKEN = "console-s3cret"
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "console"
HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'
TRIGGERS = """
[[trigger]]
name = "orders"
types = ["order"]
history_ttl = "1d"

[[trigger]]
name = "pairs"
types = ["left", "right"]
condition = "all"
join_timeout = "10m"
"""


def chrome() -> Any:
    webdriver = pytest.importorskip("selenium.webdriver")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-dev-shm-usage", "--window-size=1400,1800"):
        options.add_argument(flag)
    from selenium.webdriver.chrome.service import Service
    return webdriver.Chrome(service=Service(driver_path), options=options)


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


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = chrome()
    try:
        yield driver
    finally:
        driver.quit()


def test_console_in_a_browser(broker: EmbeddedBroker, start_worker: Any, new_prefix: Any,
                              tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    SHOTS.mkdir(parents=True, exist_ok=True)

    def shot(name: str) -> None:
        path = SHOTS / f"{name}.png"
        browser.save_screenshot(str(path))
        print(f"console screenshot: {path}")

    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = wire.Names(prefix)
    worker = start_worker(triggers, prefix, partitions=2, admin_token=TOKEN)
    sent = [("order", orjson.dumps({"uuid": f"o-{i}"}), f"o-{i}", {}, None) for i in range(3)]
    sent += [("order", orjson.dumps({"uuid": HOSTILE}), "x", {}, None),
             ("order", orjson.dumps({"uuid": "bad-1", "body": {"raise": "fatal"}}), "b", {},
              None),
             ("left", orjson.dumps({"uuid": "l-1", "activation": "act-1"}), "act-1", {}, None)]
    publish(broker.bootstrap, names, sent)
    wait_journal(broker.bootstrap, names, lambda ls: len(ls) >= len(sent), worker)

    # JSON clients keep their answers; browsers get the page, with a strict policy.
    assert httpx.get(worker.web_url + "/", headers={"Accept": "application/json"}
                     ).json()["status"] == "OK"
    page = httpx.get(worker.web_url + "/", headers={"Accept": "text/html"})
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "<script>" not in page.text and "http" not in page.text.split("<body>")[1]

    browser.get(worker.web_url + "/")
    orders = until(lambda: browser.find_element(By.CSS_SELECTOR, 'tr[data-trigger="orders"]'),
                   "the orders trigger")
    until(lambda: "processed 4" in orders.text, "4 processed orders")
    assert "error 1" in orders.text and "running" in orders.text
    assert "1d" in orders.text and "86400" not in orders.text  # durations as written
    pairs = browser.find_element(By.CSS_SELECTOR, 'tr[data-trigger="pairs"]')
    assert "10m" in pairs.text
    until(lambda: "act-1" in browser.find_element(By.ID, "joins").text, "the open join")
    assert "left: l-1" in browser.find_element(By.ID, "joins").text
    workers = browser.find_element(By.ID, "workers").text
    assert "this worker" in workers and "ready" in workers and names.route in workers
    until(lambda: HOSTILE in browser.find_element(By.ID, "journal").text,
          "the hostile identity as text in the journal")
    assert browser.title == "onceflow console"  # the identity's markup did not run
    assert not browser.find_elements(By.CSS_SELECTOR, "#journal img")
    shot("1-overview")

    # Suspend without a token: the page says so, nothing changes.
    orders.find_element(By.CSS_SELECTOR, "button.suspend").click()
    until(lambda: "admin token" in browser.find_element(By.ID, "status").text,
          "the token request")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "token-save").click()
    assert TOKEN not in browser.current_url
    assert browser.find_element(By.ID, "token").get_attribute("value") == ""

    def orders_row() -> Any:
        return browser.find_element(By.CSS_SELECTOR, 'tr[data-trigger="orders"]')

    orders_row().find_element(By.CSS_SELECTOR, "button.suspend").click()
    until(lambda: "Suspended orders" in browser.find_element(By.ID, "status").text,
          "the suspend answer")
    until(lambda: "suspended" in orders_row().find_element(By.CSS_SELECTOR, "td.state").text,
          "orders suspended")
    shot("2-suspended")
    assert any(line["outcome"] == "suspended" and line["trigger"] == "orders"
               for line in journal(broker.bootstrap, names))
    orders_row().find_element(By.CSS_SELECTOR, "button.resume").click()
    until(lambda: "Resumed orders" in browser.find_element(By.ID, "status").text,
          "the resume answer")
    until(lambda: "running" in orders_row().find_element(By.CSS_SELECTOR, "td.state").text,
          "orders running again")
    shot("3-resumed")

    # History lookup.
    Select(browser.find_element(By.ID, "history-trigger")).select_by_value("orders")
    browser.find_element(By.ID, "history-identity").send_keys("o-1")
    browser.find_element(By.ID, "history-go").click()
    until(lambda: "o-1: completed" in browser.find_element(By.ID, "history-result").text,
          "o-1's completed entry")
    assert "1d" in browser.find_element(By.ID, "history-result").text

    # Error documents, resubmitted from the page.
    Select(browser.find_element(By.ID, "docs-trigger")).select_by_value("orders")
    Select(browser.find_element(By.ID, "docs-outcome")).select_by_value("error")
    browser.find_element(By.ID, "docs-load").click()
    failed = until(lambda: browser.find_element(By.CSS_SELECTOR,
                                                '#docs tr[data-identity="bad-1"]'),
                   "the error document")
    shot("4-errors")
    failed.find_element(By.CSS_SELECTOR, "button.resubmit").click()
    until(lambda: "Resubmitted 1 error document(s) of orders"
          in browser.find_element(By.ID, "status").text, "the resubmit answer")
    wait_journal(broker.bootstrap, names,
                 lambda ls: outcomes(ls, "bad-1", "orders").count("error") == 2, worker)
    until(lambda: len(browser.find_elements(
        By.CSS_SELECTOR, '#journal tr[data-identity="bad-1"][data-outcome="error"]')) == 2,
        "the second error in the live journal")
    shot("5-resubmitted")
    assert worker.alive


def test_console_views_refuse_hostile_requests(broker: EmbeddedBroker, start_worker: Any,
                                               new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    worker = start_worker(triggers, new_prefix(), partitions=1, admin_token=TOKEN)
    url = worker.web_url
    assert httpx.get(url + "/console/..%2F..%2Fweb.py").status_code == 404
    assert httpx.get(url + "/console/index.html").status_code == 404
    assert httpx.get(url + "/documents/nope").status_code == 404
    assert httpx.get(url + "/documents/orders?outcome=%00%ff").status_code == 400
    assert httpx.get(url + "/documents/orders?outcome=error").json()["documents"] == []
    assert httpx.post(url + "/triggers/orders/resubmit", content=b"{}").status_code == 403
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for body in (b"\xff\xfe", b"[]", b'{"outcome": "processed"}',
                 b'{"outcome": "error", "identities": "x"}',
                 orjson.dumps({"outcome": "error", "identities": ["x" * 1001]})):
        answer = httpx.post(url + "/triggers/orders/resubmit", content=body, headers=auth)
        assert answer.status_code == 400, (body, answer.text)
    answer = httpx.post(url + "/triggers/orders/resubmit", headers=auth,
                        content=b'{"outcome": "in-doubt"}')
    assert answer.status_code == 202 and answer.json()["resubmitted"] == []
    assert httpx.get(url + "/overview?local=1").json()["url"] == url
    assert httpx.get(url + "/journal/tail").json()["records"] == []
    assert worker.alive
