"""The audit's history-key column agrees with the core's history keys (state_keys)."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pytest
from onceflow.history import state_keys
from onceflow.pipeline.audit_checks import history_key_column
from onceflow.triggers import parse_triggers

pytestmark = pytest.mark.spark


def test_the_audit_groups_runs_by_the_history_key_the_core_keeps(spark: Any) -> None:
    triggers = parse_triggers({"trigger": [{"name": "s", "service": "scripted", "types": ["a"]},
                                           {"name": "j", "service": "scripted",
                                            "types": ["a", "b"], "join": "all"}]})
    by_name = {t.name: t for t in triggers.triggers}
    cases = [("s", "u-1", None), ("s", "u-1", "act"), ("s", "u-2", "act"),
             ("j", "u-1", "act"), ("j", "u-1", "other"), ("j", "u-1", None),
             ("j", "x\x1fy", None), ("j", "y", "x")]
    frame = spark.createDataFrame(cases, "trigger string, identity string, activation string")
    rows = frame.select("trigger", "identity", "activation",
                        history_key_column(["j"]).alias("hkey")).collect()
    assert len(rows) == len(cases)
    keyed = [((row["trigger"], row["hkey"]),
              (row["trigger"], state_keys(by_name[row["trigger"]], row["identity"],
                                          row["activation"])[0])) for row in rows]
    for (spark_a, core_a), (spark_b, core_b) in combinations(keyed, 2):
        assert (spark_a == spark_b) == (core_a == core_b), (spark_a, spark_b)
