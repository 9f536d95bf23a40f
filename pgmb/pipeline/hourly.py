"""The hourly figures of a set of attempts, as Spark aggregations (the ``stats`` job).

Each attempt counts three times: for its queue (with the queue's worker), for its
worker's total over its queues and for the hour's total over every queue, so that every
level's percentiles are computed from the attempts themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: ``queue_name`` and ``worker_name`` of the rows that sum up all queues (of a worker,
#: or of every worker). Never a valid name (pgmb.routing.validate_name).
ALL = ""
#: The worker of attempts whose queue neither the database nor the archive names.
UNKNOWN_WORKER = "(unknown)"
#: How many error statuses a row keeps.
TOP_ERRORS = 3
#: percentile_approx's accuracy (Spark's default): exact below about this many acks in a
#: row, else within 1/ACCURACY of the rank.
ACCURACY = 10_000


def attempt_rows(attempts: DataFrame, names: DataFrame) -> DataFrame:
    """The attempts (:data:`pgmb.pipeline.stats.ATTEMPTS_SCHEMA`) as :func:`figures` counts
    them: hour (seconds since the epoch), queue and worker names, outcome, attempt number,
    status and, for acks, the latency; ``names`` maps queue ids to queue and worker names."""
    from pyspark.sql import functions as F

    ack = F.col("outcome") == "ack"
    named = attempts.join(F.broadcast(names), "queue_id", "left")
    return named.select(
        # Epoch arithmetic: UTC hours whatever the session's or the machine's time zone.
        (F.floor(F.unix_seconds("created_at") / 3600) * 3600).alias("hour"),
        F.coalesce("queue_name", "queue_hint", "queue_id").alias("queue"),
        F.coalesce("worker_name", "worker_hint", F.lit(UNKNOWN_WORKER)).alias("worker"),
        "outcome",
        "attempt",
        "status_code",
        F.when(ack, (F.unix_micros("created_at") - F.unix_micros("published_at")) / 1000.0).alias(
            "latency_ms"
        ),
    )


def figures(base: DataFrame) -> DataFrame:
    """One row per hour and queue, hour and worker, and hour of :func:`attempt_rows`
    (:data:`pgmb.pipeline.stats.COLUMNS`; the hour in seconds since the epoch, top_errors
    as JSON text)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ack = F.col("outcome") == "ack"
    # An 'unsent' row is a lease that ran out before its request started: no worker was
    # asked anything, so it is not an attempt of the hour; an 'archived' one is a pull
    # queue's message settled without an ack, neither delivered nor failed; a 'ttl' one a
    # delivery whose time to live ran out before any request (not counted here, the live
    # dashboard counts them); a 'canceled' one an operator ended.
    base = base.where(~F.col("outcome").isin("unsent", "archived", "ttl", "canceled"))
    # Each attempt counts for its queue, for its worker's total and for the hour's total.
    level = F.explode(
        F.array(
            F.struct(F.col("queue").alias("q"), F.col("worker").alias("w")),
            F.struct(F.lit(ALL).alias("q"), F.col("worker").alias("w")),
            F.struct(F.lit(ALL).alias("q"), F.lit(ALL).alias("w")),
        )
    )
    levels = base.select(
        "hour",
        level.alias("level"),
        "outcome",
        "attempt",
        "status_code",
        "latency_ms",
    ).select(
        "hour",
        F.col("level.q").alias("queue_name"),
        F.col("level.w").alias("worker_name"),
        "outcome",
        "attempt",
        "status_code",
        "latency_ms",
    )
    keys = ["hour", "queue_name", "worker_name"]

    def count(outcome: str) -> Column:
        return F.count(F.when(F.col("outcome") == outcome, 1))

    counts = levels.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("attempts"),
        F.count(F.when(ack, 1)).alias("delivered"),
        count("retry").alias("retried"),
        count("dead").alias("dead_lettered"),
        count("expired").alias("expired"),
        F.avg(F.when(ack, F.col("attempt"))).alias("attempts_per_message"),
        F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], ACCURACY).alias("latency"),
    )
    errors = (
        levels.where(~ack | F.col("outcome").isNull())
        .groupBy(*keys, F.col("status_code").alias("status"))
        .agg(F.count(F.lit(1)).alias("count"))
    )
    # The most frequent first; ties by status, with "no answer" (null) last.
    rank = F.row_number().over(
        Window.partitionBy(*keys).orderBy(F.desc("count"), F.asc_nulls_last("status"))
    )
    top = (
        errors.withColumn("rank", rank)
        .where(F.col("rank") <= TOP_ERRORS)
        .groupBy(*keys)
        .agg(F.array_sort(F.collect_list(F.struct("rank", "status", "count"))).alias("top"))
        .select(
            *keys,
            F.to_json(
                F.transform(
                    "top",
                    lambda e: F.struct(e["status"].alias("status"), e["count"].alias("count")),
                ),
                {"ignoreNullFields": "false"},
            ).alias("top_errors"),
        )
    )
    return counts.join(top, keys, "left").select(
        *keys,
        "attempts",
        "delivered",
        (F.col("attempts") - F.col("delivered")).alias("failed"),
        "retried",
        "dead_lettered",
        "expired",
        "attempts_per_message",
        F.col("latency")[0].alias("latency_p50_ms"),
        F.col("latency")[1].alias("latency_p95_ms"),
        F.col("latency")[2].alias("latency_p99_ms"),
        F.coalesce("top_errors", F.lit("[]")).alias("top_errors"),
    )
