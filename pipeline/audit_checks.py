"""The two checks of the audit, as Spark queries that collect only what they report."""

from __future__ import annotations

from typing import Any

from onceflow import journal as J
from onceflow.envelope import MAX_IDENTITY_LENGTH, record_time
from onceflow.triggers import TriggerSet

from .archive import Archive
from .audit_result import KEY, RAN, AuditResult, Violation

# Outcomes that end a join for every member at once.
JOIN_ENDS = (J.PROCESSED, J.ERROR, J.JOIN_EXPIRED)


def _file_of(archive: Archive, pos: int | None) -> str:
    if pos is None or pos < 0:
        return "?"
    rank = pos >> 40
    return archive.files[rank] if rank < len(archive.files) else "?"


def _describe(archive: Archive, row: Any) -> str:
    """How an operator finds a record: its file, coordinates, time and identity."""
    if row["topic"] is None:
        return f"{row['where'] or _file_of(archive, row['pos'])} (not a record)"
    return (f"{_file_of(archive, row['pos'])}: {row['topic']}/{row['partition']}"
            f"@{row['offset']} ts {row['ts']} identity {row['identity']!r}")


def check_outcomes(archive: Archive, triggers: TriggerSet, by_key: Any, journal: Any,
                   final_now: float | None, result: AuditResult, limit: int) -> None:
    """Check 1: one terminal outcome per (record, trigger), with the allowed exceptions."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    keep = StorageLevel.MEMORY_AND_DISK
    terminal = F.col("outcome").isin(*sorted(J.TERMINAL))
    per_trigger = journal.groupBy(*KEY, "trigger").agg(
        F.sum(F.when(terminal, 1).otherwise(0)).alias("terms"),
        F.sum(F.when(F.col("outcome") == J.JOIN_PENDING, 1).otherwise(0)).alias("pend"),
        F.sum(F.when(F.col("outcome").isin(*JOIN_ENDS), 1).otherwise(0)).alias("ends"))
    at_ingress = (per_trigger.where(F.col("trigger").isNull())
                  .select(*KEY, F.col("terms").alias("ingress")))
    cutoffs = {row["trigger"]: row["first"] for row in
               journal.where(F.col("outcome") == J.SUSPENDED).join(by_key, list(KEY))
               .groupBy("trigger").agg(F.min("pos").alias("first")).collect()}
    expected = (by_key.select("*", F.explode("targets").alias("trigger"))
                .join(per_trigger.where(F.col("trigger").isNotNull()),
                      [*KEY, "trigger"], "left")
                .join(at_ingress, list(KEY), "left")
                .fillna(0, ["terms", "pend", "ends", "ingress"])).persist(keep)
    open_frame = _open_joins(triggers, expected, final_now)
    cutoff = F.lit(None).cast("long")
    for name, pos in cutoffs.items():
        cutoff = F.when(F.col("trigger") == name, F.lit(pos)).otherwise(cutoff)
    # A delivery of a record that was waiting in its open join is journaled join-pending
    # again; the record's terminal record is its waiting member's.  So join-pending
    # records beyond the first count as covered where the record (its topic, partition
    # and offset, whatever the line's ts) has a terminal record for the trigger.
    record = ["k_topic", "k_partition", "k_offset", "trigger"]
    answered = (per_trigger.where(F.col("trigger").isNotNull() & (F.col("terms") > 0))
                .select(*record).distinct().withColumn("answered", F.lit(True)))
    absorbed = (F.when(F.col("terms") > 0, F.greatest(F.col("pend") - 1, F.lit(0)))
                .when(F.coalesce("answered", F.lit(False)), F.col("pend")).otherwise(0))
    checked = (expected.join(F.broadcast(open_frame), ["trigger", "activation"], "left")
               .join(answered, record, "left")
               .withColumn("held", F.coalesce(F.col("pos") >= cutoff, F.lit(False)))
               .withColumn("waiting", F.coalesce("open", F.lit(False))
                           & (F.col("pend") > 0) & (F.col("terms") == 0)
                           & (F.col("pos") > F.coalesce("last_end", F.lit(-1))))
               .withColumn("covered", F.col("terms") + F.col("ingress") + absorbed))
    short = F.col("covered") < F.col("n")
    stats = checked.agg(F.sum(F.when(F.col("held") & short, 1).otherwise(0)),
                        F.sum(F.when(F.col("waiting") & ~F.col("held"), 1).otherwise(0))).first()
    result.exempt_held, result.exempt_pending = int(stats[0] or 0), int(stats[1] or 0)
    columns = ["pos", "trigger", "topic", "partition", "offset", "ts", "identity", "where",
               "n", "covered", "pend", "outcome", "problem"]
    for_triggers = checked.select(
        "*", F.lit(None).cast("string").alias("outcome"),
        F.when(short & ~F.col("held") & ~F.col("waiting"), "missing")
        .when(F.col("covered") > F.col("n"), "extra").alias("problem"))
    at_ingress_only = (by_key.where(F.size("targets") == 0).join(at_ingress, list(KEY), "left")
                       .fillna(0, ["ingress"])
                       .select("*", F.lit(None).cast("string").alias("trigger"),
                               F.col("ingress").alias("covered"), F.lit(0).alias("pend"),
                               F.lit(None).cast("string").alias("outcome"),
                               F.when(F.col("ingress") < F.col("n"), "missing-ingress")
                               .when(F.col("ingress") > F.col("n"), "extra-ingress")
                               .alias("problem")))
    unknown = (journal.join(by_key.select(*KEY), list(KEY), "left_anti")
               .select("*", F.lit(None).cast("long").alias("pos"),
                       F.lit(None).cast("string").alias("where"), F.lit(0).alias("n"),
                       F.lit(0).alias("covered"), F.lit(0).alias("pend"),
                       F.lit("unknown").alias("problem")))
    # A journal record names its input record by coordinates; it must also carry that
    # record's identity (an input key shared by redeliveries may hold several).
    forged = (journal.where(F.col("topic").isNotNull())
              .join(by_key.where(F.col("topic").isNotNull())
                    .select(*KEY, "pos", "identities"), list(KEY))
              .where(~F.coalesce(F.array_contains("identities", F.col("identity")),
                                 F.lit(False)))
              .select("*", F.lit(None).cast("string").alias("where"), F.lit(0).alias("n"),
                      F.lit(0).alias("covered"), F.lit(0).alias("pend"),
                      F.lit("identity").alias("problem")))
    problems = (for_triggers.select(*columns).unionByName(at_ingress_only.select(*columns))
                .unionByName(unknown.select(*columns)).unionByName(forged.select(*columns))
                .where(F.col("problem").isNotNull())
                .persist(keep))
    try:
        result.violation_count += problems.count()
        for row in problems.orderBy(F.col("pos").asc_nulls_last()).limit(limit).collect():
            result.violations.append(Violation("terminal", row["trigger"],
                                               _problem(archive, row), row["pos"]))
    finally:
        for frame in (problems, expected):
            frame.unpersist()


def _problem(archive: Archive, row: Any) -> str:
    problem = row["problem"]
    if problem == "identity":
        return (f"journal record {row['outcome']} for trigger {row['trigger']!r} carries "
                f"identity {row['identity']!r}, which is not the identity of the record it "
                f"names: {_file_of(archive, row['pos'])}: {row['topic']}/{row['partition']}"
                f"@{row['offset']} ts {row['ts']}")
    if problem == "unknown":
        return (f"journal record {row['outcome']} for trigger {row['trigger']!r}, identity "
                f"{row['identity']!r} names {row['topic']}/{row['partition']}"
                f"@{row['offset']} ts {row['ts']}, which is not in the archive")
    where = _describe(archive, row)
    if problem == "missing":
        late = (f" ({row['pend']} join-pending, but no open join holds it: its join "
                f"ended or its deadline passed)") if row["pend"] else ""
        return f"{where} has no terminal outcome for trigger {row['trigger']!r}{late}"
    if problem == "extra":
        return (f"{where} has {row['covered']} terminal outcomes for trigger "
                f"{row['trigger']!r} (expected {row['n']})")
    if problem == "missing-ingress":
        return f"{where} has no terminal outcome (no trigger takes it, so ingress must reject it)"
    return f"{where} has {row['covered']} terminal outcomes at ingress (expected {row['n']})"


def _open_joins(triggers: TriggerSet, expected: Any, final_now: float | None) -> Any:
    """(trigger, activation, open, last_end) of every join still open at the end.

    A join is open when its waiting members (join-pending, no terminal outcome) came after
    the activation's last member whose join ended (a run or an expiry ends it for every
    member at once), are of distinct types and fewer than the condition's, and the first
    of them + the time-out has not passed the last record's time (expiry needs deadline
    < time).  A member whose terminal record is gone while another member's remains
    therefore waits in no open join.
    """
    from pyspark.sql import functions as F

    spark = expected.sparkSession
    joins = {t.name: (t.join_timeout, t.join_arity) for t in triggers.triggers
             if t.needs_activation}
    rows = []
    if joins:
        members = expected.where(F.col("trigger").isin(*joins)
                                 & F.col("activation").isNotNull())
        ended = (members.where(F.col("ends") > 0).groupBy("trigger", "activation")
                 .agg(F.max("pos").alias("last_end")))
        waiting = (members.where((F.col("pend") > 0) & (F.col("terms") == 0))
                   .join(ended, ["trigger", "activation"], "left")
                   .where(F.col("pos") > F.coalesce("last_end", F.lit(-1)))
                   .groupBy("trigger", "activation")
                   .agg(F.min("ts").alias("first"), F.count("*").alias("members"),
                        F.countDistinct("doc_type").alias("types"),
                        F.first("last_end").alias("last_end")))
        for row in waiting.collect():
            timeout, arity = joins[row["trigger"]]
            if row["members"] != row["types"] or row["members"] >= arity:
                continue
            # In whole milliseconds, as the core decides (the columns hold seconds).
            if timeout is None or final_now is None or \
                    record_time(row["first"]) + timeout >= record_time(final_now):
                rows.append((row["trigger"], row["activation"], True, row["last_end"]))
    return spark.createDataFrame(
        rows or [("", "", True, None)],
        "trigger string, activation string, open boolean, last_end long")


def history_key_column(joins: list[str]) -> Any:
    """The history key of a journal row as a Spark column (`joins`: the join triggers).

    It mirrors onceflow.history.state_keys (its first item) for Spark columns: within one
    trigger, (activation, identity) for join triggers, (null, identity) for a join
    document without activation and for any other trigger, so two rows of a trigger share
    the struct exactly when they share that key (tests/spark/test_spark_audit_keys.py).
    """
    from pyspark.sql import functions as F

    joined = F.col("trigger").isin(*joins) if joins else F.lit(False)
    return F.struct(F.when(joined, F.col("activation")).alias("activation"),
                    F.col("identity"))


def check_runs(archive: Archive, triggers: TriggerSet, by_key: Any, journal: Any,
               result: AuditResult, limit: int) -> None:
    """Check 2: no service ran twice for one history key within the history TTL."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    promised = {t.name: t for t in triggers.triggers if t.detect_duplicates and t.use_history}
    if not promised:
        return
    joins = [name for name, t in promised.items() if t.routes_by_activation]
    positions = by_key.select(*KEY, "pos")
    runs = (journal.where(F.col("outcome").isin(*RAN) & F.col("trigger").isin(*promised)
                          & (F.length("identity") <= MAX_IDENTITY_LENGTH))
            .join(positions, list(KEY), "left")
            .withColumn("hkey", history_key_column(joins)))
    # Each run against the one before it of the same history key, in file order: one
    # shuffle, and only the violations (at most `limit * 4` of them) reach the driver.
    ttl = F.lit(None).cast("double")
    for name, trigger in promised.items():
        ttl = F.when(F.col("trigger") == name, F.lit(trigger.history_ttl / 1000)).otherwise(ttl)
    fields = ("pos", "ts", "topic", "partition", "offset", "identity", "activation", "outcome")
    order = Window.partitionBy("trigger", "hkey").orderBy(
        F.coalesce("pos", F.lit(-1)), "ts")
    pairs = (runs.select("trigger", "hkey", *fields,
                         F.lag(F.struct(*fields)).over(order).alias("earlier"))
             .where(F.col("earlier").isNotNull()
                    & (F.col("ts") - F.col("earlier.ts") <= ttl))
             .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        result.violation_count += pairs.count()
        shown = max(0, limit * 4 - len(result.violations))
        rows = (pairs.orderBy(F.coalesce("pos", F.lit(-1)), "ts").limit(shown).collect()
                if shown else [])
    finally:
        pairs.unpersist()
    for row in rows:
        earlier = row["earlier"]
        first = {**earlier.asDict(), "where": None}
        second = {**{name: row[name] for name in fields}, "where": None}
        name = row["trigger"]
        result.violations.append(Violation(
            "twice", name,
            f"trigger {name!r} ran its service twice for identity {row['identity']!r}"
            + (f" (activation {row['activation']!r})" if name in joins else "")
            + f" within its history TTL ({promised[name].history_ttl / 1000:g} s): "
            f"{_describe(archive, first)} ({earlier['outcome']}) and "
            f"{_describe(archive, second)} ({row['outcome']})",
            row["pos"]))
