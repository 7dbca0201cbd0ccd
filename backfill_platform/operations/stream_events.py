"""What Dagster's instance learns of the stream (contract 1.4): each committed batch as
runless materializations of the raw/orders partitions it wrote (`stream.report_batch`),
and the days past the last partition, held until they are partitions.

A materialization of a partition the code location does not define is never written: the
UI would list a partition that does not exist, and sensors could target it. The stream's
rows of such a day (a message stamped after BACKFILL_END_DATE, or today while the
partitions end yesterday) are real data and stay in raw/orders; the day is *held*. The
held days are named on raw/orders by a `stream_held` observation each time they change, so
the asset's page says why a day with stream rows has no materialization, and a restarted
stream knows them. A held day is reported once it is a partition: at the stream's first
batch after that (with BACKFILL_END_DATE unset the partitions gain a day at midnight UTC),
or at the stream's next start (a later BACKFILL_END_DATE takes effect when the process
starts). Its materialization carries the day's stream rows and offsets as raw holds them
then, since no single batch wrote them.
"""

from __future__ import annotations

from datetime import date

from dagster import AssetMaterialization, AssetObservation, DagsterInstance, MetadataValue
from pyspark.sql import functions as F

from backfill_platform.operations.stream import STREAM_WRITER, BatchReport, report_batch
from backfill_platform.partitions import daily_partitions, in_partitions
from backfill_platform.resources.kafka import offset_spans
from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.tables import RAW_ORDERS, RAW_ORDERS_STREAM_COLUMN

STREAM_HELD = "stream_held"  # the observation's `event` on raw/orders
OBSERVATIONS_PER_PAGE = 100


class StreamReporter:
    """Reports each committed batch to `instance` (an `on_batch` callback), holds the days
    past the last partition and reports them once they are partitions. Created when the
    stream starts: it takes up the held days a previous process left."""

    def __init__(self, instance: DagsterInstance, lake: LakehouseResource, topic: str):
        self.instance, self.lake, self.topic = instance, lake, topic
        self.held: list[str] = held_days(instance, topic)
        self.notes: list[str] = []  # what it held and released, for the command's output

    def __call__(self, batch: BatchReport) -> None:
        past = report_batch(self.instance, self.topic, batch)
        new = sorted(set(past) - set(self.held))
        if new:
            self.held = sorted({*self.held, *new})
            self._note(
                f"held {_days(new)}: after the last partition {_last_partition()}; their "
                "rows are in raw/orders, reported once the partitions reach them"
            )
        self.release()

    def release(self) -> list[str]:
        """Report the held days that are partitions now (one Spark job over them)."""
        ready = in_partitions(self.held)
        if not ready:
            return []
        version = self.lake.current_version(RAW_ORDERS)
        held = _stream_rows_of(self.lake, self.topic, version, ready)
        for day in ready:
            rows, spans = held.get(day, (0, {}))
            self.instance.report_runless_asset_event(
                AssetMaterialization(
                    asset_key=RAW_ORDERS,
                    partition=day,
                    description=f"stream rows from {self.topic}, held until {day} was a partition",
                    metadata={
                        "writer": STREAM_WRITER,
                        "topic": self.topic,
                        "delta_version": version,
                        "rows": rows,
                        "day_offsets": MetadataValue.json(offset_spans(spans)),
                    },
                )
            )
        self.held = sorted(set(self.held) - set(ready))
        self._note(f"reported {_days(ready)}, held until now a partition")
        return ready

    def _note(self, text: str) -> None:
        """Say it, and record the held days on raw/orders (the UI's record, and where the
        next start takes them up)."""
        self.notes.append(text)
        self.instance.report_runless_asset_event(
            AssetObservation(
                asset_key=RAW_ORDERS,
                description=f"stream of {self.topic}: {text}",
                metadata={
                    "event": STREAM_HELD,
                    "topic": self.topic,
                    "held_days": MetadataValue.json(self.held),
                    "last_partition": _last_partition(),
                },
            )
        )


def held_days(instance: DagsterInstance, topic: str) -> list[str]:
    """The days the newest `stream_held` observation of `topic` names: held, not reported."""
    cursor = None
    while True:
        page = instance.fetch_observations(RAW_ORDERS, limit=OBSERVATIONS_PER_PAGE, cursor=cursor)
        for record in page.records:
            observed = record.asset_observation
            meta = observed.metadata if observed is not None else {}
            event, of = meta.get("event"), meta.get("topic")
            if event and event.value == STREAM_HELD and of and of.value == topic:
                return sorted(meta["held_days"].value)
        if not page.has_more:
            return []
        cursor = page.cursor


def _stream_rows_of(
    lake: LakehouseResource, topic: str, version: int | None, days: list[str]
) -> dict[str, tuple[int, dict[int, tuple[int, int]]]]:
    """Day -> (stream rows of `topic` raw holds, partition -> (first, next) offsets)."""
    if version is None:
        return {}
    raw = lake.read(RAW_ORDERS, version)
    if RAW_ORDERS_STREAM_COLUMN not in raw.columns:
        return {}
    found: dict[str, tuple[int, dict[int, tuple[int, int]]]] = {}
    for r in (
        raw.where(F.col(RAW_ORDERS_STREAM_COLUMN) == topic)
        .where(F.col("ingest_date").isin([date.fromisoformat(d) for d in days]))
        .groupBy("ingest_date", "kafka_partition")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.min("kafka_offset").alias("first"),
            (F.max("kafka_offset") + 1).alias("next"),
        )
        .collect()
    ):
        rows, spans = found.get(r["ingest_date"].isoformat(), (0, {}))
        spans[r["kafka_partition"]] = (r["first"], r["next"])
        found[r["ingest_date"].isoformat()] = (rows + r["rows"], spans)
    return found


def _last_partition() -> str:
    return daily_partitions.get_last_partition_key() or "(none)"


def _days(days: list[str]) -> str:
    return days[0] if len(days) == 1 else f"{len(days)} days {days[0]}..{days[-1]}"
