"""The stream's side of the boundary (contract 1.4): every offset the broker holds is in
raw/orders exactly once, per ingest day.

The broker is asked directly (Spark's Kafka source in batch mode: partition, offset and
timestamp of every retained message from the range's first instant on), not the stream's
own commit metadata, so a batch that was lost, doubled or written under another query id
shows. A message the stream has not reached yet (at or past raw's newest offset of its
partition) is lag, reported and not failed: `stream status` and the freshness policy
watch lag; this check proves what was written. Only where BACKFILL_STREAM_CHECK is true
(definitions.py): it asks the broker in every raw/orders run.
"""

from datetime import UTC, datetime, time

from dagster import AssetCheckExecutionContext, AssetCheckSeverity, asset_check
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from backfill_platform.checks.results import (
    CheckEvents,
    CheckOutcome,
    PartitionResult,
    record,
    run_partitions,
)
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.kafka import OrdersTopicResource, TopicUnavailable
from backfill_platform.tables import RAW_ORDERS, RAW_ORDERS_STREAM_COLUMN

CHECK_NAME = "stream_offsets_once"


@asset_check(
    asset=RAW_ORDERS,
    name=CHECK_NAME,
    blocking=False,
    partitions_def=daily_partitions,
    description="Every broker offset of the order topic in raw/orders exactly once, per day.",
)
def raw_stream_offsets_once(
    context: AssetCheckExecutionContext,
    lakehouse: LakehouseResource,
    orders_topic: OrdersTopicResource,
) -> CheckEvents:
    """Non-blocking: the landing path's rows of the day are right whatever the stream did,
    so a stream gap must not hold the day's downstream; it is reported on the day."""
    yield from record(context, stream_vs_topic(lakehouse, orders_topic, run_partitions(context)))


def stream_vs_topic(
    lakehouse: LakehouseResource, orders: OrdersTopicResource, run: DayRange
) -> CheckOutcome:
    """Per ingest day of `run`: the broker's messages against raw's stream rows, offset by
    offset. A broker that does not answer fails every day with WARN severity, naming it."""
    what = f"{orders.topic} offsets vs raw/orders stream rows per ingest day"
    try:
        broker = orders.end_offsets()
        counts = _per_day(lakehouse, orders, broker, run)
    except TopicUnavailable as error:
        results = [
            PartitionResult(day, "the broker's offsets", "no answer", False, str(error))
            for day in run.day_keys()
        ]
        return CheckOutcome(CHECK_NAME, RAW_ORDERS, results, AssetCheckSeverity.WARN, what)
    results, metrics = [], {}
    for day in run.day_keys():
        c = counts.get(day) or dict.fromkeys(METRICS, 0)
        reached = c["messages"] - c["pending"]
        passed = c["missing"] == 0 and c["extra_copies"] == 0 and c["not_on_broker"] == 0
        detail = (
            f"{c['missing']} missing, {c['extra_copies']} extra copies, "
            f"{c['not_on_broker']} not on the broker, {c['pending']} not streamed yet"
        )
        results.append(
            PartitionResult(day, f"{reached} offsets once", f"{c['streamed']} rows", passed, detail)
        )
        metrics[day] = dict(c)
    return CheckOutcome(CHECK_NAME, RAW_ORDERS, results, what=what, metrics=metrics)


METRICS = ("messages", "streamed", "missing", "extra_copies", "pending", "not_on_broker")


def _per_day(
    lakehouse: LakehouseResource,
    orders: OrdersTopicResource,
    broker: dict[int, tuple[int, int]],
    run: DayRange,
) -> dict[str, dict[str, int]]:
    """One Spark job: the topic's offsets of the range, full-outer-joined with raw's."""

    def in_run(day: Column) -> Column:
        return (day >= F.lit(run.start)) & (day < F.lit(run.end))

    # A message of the range has a timestamp at or after its start, so an offset at or after
    # the broker's first offset for that instant (its time index): the read starts there, not
    # at the topic's beginning. The producer's timestamps (CreateTime) need not rise with
    # offsets, so the end stays the partition's latest.
    first = orders.offsets_at(datetime.combine(run.start, time.min, tzinfo=UTC))
    topic = (
        orders.read(lakehouse.session, {p: (first.get(p, 0), None) for p in broker})
        .select(
            F.col("partition").cast("int").alias("p"),
            F.col("offset").alias("o"),
            F.to_date("timestamp").alias("topic_day"),  # the session's time zone is UTC
        )
        .where(in_run(F.col("topic_day")))
    )
    held = _held(lakehouse, orders.topic)
    if held is None:
        held = topic.sparkSession.createDataFrame([], "p int, o long, copies long, raw_day date")
    # The stream's position per partition: one past raw's newest offset, over every day.
    position = {
        r["p"]: r["next"] for r in held.groupBy("p").agg((F.max("o") + 1).alias("next")).collect()
    }
    next_of = _lookup(position, default=0)
    earliest_of = _lookup({p: first for p, (first, _) in broker.items()}, default=0)
    joined = topic.join(held.where(in_run(F.col("raw_day"))), ["p", "o"], "full_outer")
    on_broker = F.col("topic_day").isNotNull()
    in_raw = F.col("copies").isNotNull()
    rows = (
        joined.groupBy(F.coalesce("topic_day", "raw_day").alias("day"))
        .agg(
            F.count(F.when(on_broker, True)).alias("messages"),
            F.coalesce(F.sum("copies"), F.lit(0)).alias("streamed"),
            F.count(F.when(on_broker & ~in_raw & (F.col("o") < next_of), True)).alias("missing"),
            F.count(F.when(on_broker & ~in_raw & (F.col("o") >= next_of), True)).alias("pending"),
            F.coalesce(F.sum(F.when(in_raw, F.col("copies") - 1)), F.lit(0)).alias("extra_copies"),
            # Below the broker's earliest offset retention removed it: not a fault.
            F.count(F.when(~on_broker & (F.col("o") >= earliest_of), True)).alias("not_on_broker"),
        )
        .collect()
    )
    return {r["day"].isoformat(): {m: int(r[m]) for m in METRICS} for r in rows}


def stream_rows(lakehouse: LakehouseResource, topic: str) -> DataFrame | None:
    """raw/orders' rows of `topic`'s messages; None while raw has none of any topic."""
    if not lakehouse.exists(RAW_ORDERS):
        return None
    raw = lakehouse.read(RAW_ORDERS)
    if RAW_ORDERS_STREAM_COLUMN not in raw.columns:
        return None
    return raw.where(F.col(RAW_ORDERS_STREAM_COLUMN) == topic)


def stream_position(lakehouse: LakehouseResource, topic: str) -> dict[int, int]:
    """Partition -> one past the newest offset raw holds: what the stream has written."""
    rows = stream_rows(lakehouse, topic)
    if rows is None:
        return {}
    return {
        r["p"]: r["next"]
        for r in rows.groupBy(F.col("kafka_partition").alias("p"))
        .agg((F.max("kafka_offset") + 1).alias("next"))
        .collect()
    }


def _held(lakehouse: LakehouseResource, topic: str) -> DataFrame | None:
    """raw/orders' stream rows of `topic`: copies per (partition, offset), and their day."""
    rows = stream_rows(lakehouse, topic)
    if rows is None:
        return None
    return rows.groupBy(F.col("kafka_partition").alias("p"), F.col("kafka_offset").alias("o")).agg(
        F.count(F.lit(1)).alias("copies"), F.min("ingest_date").alias("raw_day")
    )


def _lookup(values: dict[int, int], default: int) -> Column:
    """partition -> value as a Spark map lookup on column `p`."""
    if not values:
        return F.lit(default)
    mapping = F.create_map(*[F.lit(v) for p, n in sorted(values.items()) for v in (p, n)])
    return F.coalesce(mapping[F.col("p")], F.lit(default))


stream_checks = [raw_stream_offsets_once]
