"""The figures of the audit report: counts, lists, and the data of its charts."""

from __future__ import annotations

from typing import Any

from onceflow import journal as J
from onceflow.triggers import ALL, TriggerSet

from .audit_result import DUPLICATES, KEY, RAN, AuditResult

TIME_BUCKETS = 40
INGRESS = "(ingress)"


def gather_figures(triggers: TriggerSet, by_key: Any, journal: Any, result: AuditResult,
                   limit: int) -> None:
    """Counts by trigger and outcome, in-doubt and error documents, and chart data."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    result.counts = {(row["trigger"], row["outcome"]): row["count"]
                     for row in journal.groupBy("trigger", "outcome").count().collect()}
    columns = ["trigger", "identity", "activation", "ts", "topic", "partition", "offset",
               "reason"]
    for outcome, target in ((J.IN_DOUBT, result.in_doubt), (J.ERROR, result.errors)):
        rows = (journal.where(F.col("outcome") == outcome).orderBy("ts", "trigger")
                .select(*columns).limit(limit).collect())
        target.extend(row.asDict() for row in rows)

    first, last = result.first_ts, result.last_ts
    if first is not None and last is not None:
        width = (last - first) / TIME_BUCKETS or 1.0
        bucket = F.least(F.floor((F.col("ts") - F.lit(first)) / F.lit(width)),
                         F.lit(TIME_BUCKETS - 1)).cast("int")
        timeline = (journal.where(F.col("outcome").isin(*sorted(J.TERMINAL))
                                  & F.col("ts").isNotNull())
                    .select(F.coalesce("trigger", F.lit(INGRESS)).alias("trigger"),
                            "outcome", bucket.alias("bucket"))
                    .groupBy("trigger", "outcome", "bucket").count())
        result.timeline = [
            {"trigger": r["trigger"], "outcome": r["outcome"],
             "start": first + r["bucket"] * width, "width": width, "count": r["count"]}
            for r in timeline.collect()
        ]

    # A completed All join runs once for one member of each type; its members' processed
    # (or error) records, in file order, come in groups of that many per activation.
    arity = {t.name: t.join_arity for t in triggers.triggers if t.kind == ALL}
    if arity:
        positions = by_key.select(*KEY, "pos")
        size = F.lit(1)
        for name, count in arity.items():
            size = F.when(F.col("trigger") == name, F.lit(count)).otherwise(size)
        members = (journal.where(F.col("outcome").isin(*RAN)
                                 & F.col("trigger").isin(*arity))
                   .join(positions, list(KEY), "left")
                   .withColumn("n", F.row_number().over(
                       Window.partitionBy("trigger", "activation").orderBy("pos", "ts")))
                   .withColumn("run", F.floor((F.col("n") - 1) / size)))
        runs = (members.groupBy("trigger", "activation", "run")
                .agg((F.max_by("ts", "n") - F.min_by("ts", "n")).alias("seconds")))
        for row in runs.select("trigger", "seconds").collect():
            result.join_times.setdefault(row["trigger"], []).append(float(row["seconds"]))

    sources = (journal.where(F.col("outcome").isin(*DUPLICATES))
               .groupBy("topic", "partition").count()
               .orderBy(F.desc("count"), "topic", "partition").limit(10).collect())
    result.duplicate_sources = [(f"{row['topic']}/{row['partition']}", row["count"])
                                for row in sources]
