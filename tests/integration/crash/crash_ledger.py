"""The ledger service and resolver of the crash test (loaded by the workers).

`record` inserts one row per document it runs for (with the worker's pid and the wall-clock
time of the run); the key is unique, so a second run of
the same document lands in `doubles` instead.  `resolve` answers DUPLICATE when the
ledger has the document (for a join document, any of its members), NEW when it has not.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from typing import Any

from onceflow import CallContext

_connection: sqlite3.Connection | None = None
_lock = threading.Lock()


def connect(path: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=60, isolation_level=None,
                                 check_same_thread=False)
    # Two workers open the ledger at once: switching a new file to WAL takes a lock that
    # SQLite does not wait for (its busy timeout does not cover it), so try again.
    deadline = time.monotonic() + 60
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute(
        "CREATE TABLE IF NOT EXISTS runs (key TEXT PRIMARY KEY, pid INTEGER, at REAL)")
    connection.execute("CREATE TABLE IF NOT EXISTS doubles (key TEXT, pid INTEGER, at REAL)")
    return connection


def _db() -> sqlite3.Connection:
    global _connection
    with _lock:
        if _connection is None:
            _connection = connect(os.environ["ONCEFLOW_TEST_LEDGER"])
        return _connection


def member_keys(document: Any, context: CallContext) -> list[str]:
    documents = document.get("documents") if isinstance(document, dict) else None
    if isinstance(documents, dict) and "activation" in document:
        return [f"{context.trigger}:{member['uuid']}" for member in documents.values()]
    return [f"{context.trigger}:{context.identity}"]


async def record(document: Any, context: CallContext) -> dict[str, Any]:
    # In a thread: two workers share the ledger, and SQLite's wait for the other one's
    # write lock must not hold up the worker's event loop.
    return await asyncio.to_thread(_record, document, context)


def _record(document: Any, context: CallContext) -> dict[str, Any]:
    db = _db()
    keys = member_keys(document, context)
    at = time.time()
    with _lock:  # one connection, used by one thread at a time
        db.execute("BEGIN IMMEDIATE")
        try:
            for key in keys:
                try:
                    db.execute("INSERT INTO runs VALUES (?, ?, ?)", (key, os.getpid(), at))
                except sqlite3.IntegrityError:
                    db.execute("INSERT INTO doubles VALUES (?, ?, ?)", (key, os.getpid(), at))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return {"ran": keys}


def resolve(document: Any, context: CallContext) -> str:
    # A join's interrupted run is asked about once, with the join document (spec section
    # 4): its members were recorded together, so any of them found means it ran.
    keys = member_keys(document, context)
    db = _db()
    with _lock:
        found = any(db.execute("SELECT 1 FROM runs WHERE key = ?", (key,)).fetchone()
                    for key in keys)
    return "DUPLICATE" if found else "NEW"
