"""Generated workloads in the scenario format, shared by the benchmarks and large tests."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

TRIGGERS_TOML = """\
[[trigger]]
name = "billing"
types = ["invoice"]
service = "scripted"

[[trigger]]
name = "fulfil"
types = ["order", "payment", "shipment"]
condition = "all"
join_timeout = "5m"
service = "scripted"

[[trigger]]
name = "promo"
types = ["click", "view", "share"]
condition = "only_one"
join_timeout = "1h"
service = "scripted"
"""

AND_TYPES = ("order", "payment", "shipment")
XOR_TYPES = ("click", "view", "share")


def generate_lines(count: int, *, seed: int = 7, resend_rate: float = 0.10,
                   bad_rate: float = 0.01, join_share: float = 0.5,
                   partitions: int = 4) -> list[dict[str, Any]]:
    """`count` input lines: resends, AND/XOR joins over 3 types, bad input, simple documents."""
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []
    open_and: list[tuple[str, list[str]]] = []
    ts = 0.0
    serial = 0
    while len(lines) < count:
        ts += 0.001
        roll = rng.random()
        if roll < bad_rate:
            lines.append({"ts": round(ts, 3), "topic": "invoice",
                          "partition": rng.randrange(partitions), "raw": "not json {"})
            continue
        if roll < bad_rate + resend_rate and sent:
            again = dict(rng.choice(sent))
            again["ts"] = round(ts, 3)
            lines.append(again)
            continue
        serial += 1
        if rng.random() < join_share:
            if rng.random() < 0.5:
                # AND: documents of one activation arrive over a short span.
                if open_and and rng.random() < 0.7:
                    index = rng.randrange(len(open_and))
                    activation, missing = open_and[index]
                    doc_type = missing.pop()
                    if not missing:
                        open_and.pop(index)
                else:
                    activation = f"cart-{serial}"
                    missing = list(AND_TYPES)
                    rng.shuffle(missing)
                    doc_type = missing.pop()
                    if rng.random() < 0.95:  # a few joins never complete and expire
                        open_and.append((activation, missing))
                topic = doc_type
            else:
                activation = f"user-{rng.randrange(max(1, count // 20))}"
                doc_type = rng.choice(XOR_TYPES)
                topic = doc_type
        else:
            activation = None
            doc_type = "invoice"
            topic = "invoice"
        value: dict[str, Any] = {"uuid": f"d-{serial}", "body": {"n": serial}}
        if activation is not None:
            value["activation"] = activation
        line = {"ts": round(ts, 3), "topic": topic, "partition": rng.randrange(partitions),
                "value": value}
        lines.append(line)
        sent.append(line)
    return lines


def write_scenario(folder: Path, lines: list[dict[str, Any]]) -> Path:
    """Write a scenario folder (triggers.toml and input.jsonl)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "triggers.toml").write_text(TRIGGERS_TOML)
    with (folder / "input.jsonl").open("wb") as handle:
        for line in lines:
            handle.write(orjson.dumps(line))
            handle.write(b"\n")
    return folder
