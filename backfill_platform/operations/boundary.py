"""Proof at the boundary between history and the live stream (contract 1.4), per day:

- every broker offset of the topic in raw/orders exactly once (`checks.stream`);
- every landing line in raw/orders (the landing path's own reconciliation);
- staging/orders accounting for every valid raw row of both sources (latest wins);
- an order that came both ways (the export and the stream overlap around the launch)
  staged once.

Plus the handoff: the landing zone's last delivered day and the stream's first message,
read from the data (raw's rows and the landing folders are the record; nothing else is
kept that could disagree with them). `backfill-platform stream reconcile` prints it.

The proof reads data, not Dagster's partitions: the stream holds days past the last
partition (today's messages while the partitions end yesterday, or a shop whose clock ran
past BACKFILL_END_DATE), and they are proved like any other day and named as such.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import functions as F

from backfill_platform.checks.reconciliation import raw_vs_landing, staging_vs_raw
from backfill_platform.checks.stream import stream_rows, stream_vs_topic
from backfill_platform.operations.arguments import InvalidArgument
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.resources.kafka import OrdersTopicResource, TopicUnavailable
from backfill_platform.resources.landing import ORDERS
from backfill_platform.tables import RAW_ORDERS, RAW_ORDERS_STREAM_COLUMN, STAGING_ORDERS


@dataclass(frozen=True)
class BoundaryDay:
    day: str
    messages: int  # the broker's messages of the day (by timestamp)
    streamed: int  # raw's stream rows of the day
    missing: int  # offsets the stream passed that raw lacks (a gap)
    extra_copies: int  # stream rows beyond one per offset (an overlap)
    pending: int  # messages the stream has not reached yet (lag, not a fault)
    landing_lines: int  # non-blank lines of the day's landing files
    landing_rows: int  # raw's landing rows of the day
    staging_expected: int  # valid raw rows of event day `day`, both sources
    staging_accounted: int  # staged orders + superseded versions + currency rejects
    both_sources: int  # staged orders of the day that came by file and by message
    both_staged_once: int  # of those, staged exactly once

    @property
    def ok(self) -> bool:
        return (
            self.missing == 0
            and self.extra_copies == 0
            and self.landing_rows == self.landing_lines
            and self.staging_accounted == self.staging_expected
            and self.both_staged_once == self.both_sources
        )

    def describe(self) -> str:
        return (
            f"  {self.day} {'ok  ' if self.ok else 'FAIL'}  messages {self.messages} -> "
            f"raw {self.streamed} ({self.missing} missing, {self.extra_copies} extra, "
            f"{self.pending} pending) | landing {self.landing_lines} -> raw "
            f"{self.landing_rows} | staging {self.staging_accounted}/{self.staging_expected}"
            f" | both sources {self.both_sources}, staged once {self.both_staged_once}"
        )


@dataclass
class BoundaryReport:
    topic: str
    days: DayRange
    landing_last_day: str | None  # the export's last delivered day
    first_message: str | None  # the stream's first message in raw (its broker timestamp)
    results: list[BoundaryDay] = field(default_factory=list)
    last_partition: str | None = None  # Dagster's last daily partition when proved

    @property
    def past_partitions(self) -> list[str]:
        """Days of the proof after the last partition: data no run or check covers yet."""
        last = self.last_partition
        return [d.day for d in self.results if last is None or d.day > last]

    @property
    def failed(self) -> list[BoundaryDay]:
        return [d for d in self.results if not d.ok]

    @property
    def overlap_days(self) -> list[str]:
        """Days both writers put rows into: the handoff's overlap."""
        return [d.day for d in self.results if d.streamed and d.landing_rows]

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "first_day": self.days.first,
            "last_day": self.days.last,
            "landing_last_day": self.landing_last_day,
            "first_message": self.first_message,
            "overlap_days": self.overlap_days,
            "last_partition": self.last_partition,
            "past_partitions": self.past_partitions,
            "failed_days": [d.day for d in self.failed],
            "days": [asdict(d) | {"ok": d.ok} for d in self.results],
        }

    def describe(self) -> str:
        totals = {
            k: sum(getattr(d, k) for d in self.results)
            for k in ("messages", "streamed", "missing", "extra_copies", "pending", "both_sources")
        }
        overlap = self.overlap_days
        lines = [
            f"boundary of {self.topic} and the landing zone, {self.days}: "
            + (
                "every day reconciles"
                if not self.failed
                else f"{len(self.failed)} of {len(self.results)} day(s) FAIL"
            ),
            f"  handoff: landing zone up to {self.landing_last_day or '-'}, stream from "
            f"{self.first_message or '-'}; both wrote {len(overlap)} day(s)"
            + (f" ({overlap[0]}..{overlap[-1]})" if overlap else ""),
            f"  {totals['messages']} messages -> {totals['streamed']} stream rows "
            f"({totals['missing']} missing, {totals['extra_copies']} extra copies, "
            f"{totals['pending']} not streamed yet); {totals['both_sources']} order(s) came "
            "both ways",
        ]
        past = self.past_partitions  # the range's last days, if any
        if past:
            lines.append(
                f"  {DayRange(past[0], past[-1])}: after the last partition "
                f"({self.last_partition or 'none'}), proved from the data; Dagster's runs, "
                "checks and the UI take them up once the partitions reach them "
                "(BACKFILL_END_DATE; unset, the partitions end yesterday)"
            )
        quiet = [d for d in self.results if d.ok and not (d.messages or d.landing_lines)]
        shown = [d for d in self.results if d not in quiet]
        lines += [d.describe() for d in shown]
        if quiet:
            lines.append(f"  {len(quiet)} day(s) with neither messages nor landing lines: ok")
        return "\n".join(lines)


def reconcile_boundary(
    lakehouse: LakehouseResource,
    landing: LandingZoneResource,
    orders: OrdersTopicResource,
    days: DayRange | None = None,
) -> BoundaryReport:
    """The boundary's proof over `days` (default: the days holding stream rows, and the
    landing zone's last day, so the handoff is inside)."""
    delivered = landing.delivered_days(ORDERS)
    streamed_days, first_message = _stream_extent(lakehouse, orders.topic)
    if days is None:
        ends = [*streamed_days, *delivered[-1:]]
        if not ends:
            raise InvalidArgument(
                f"Nothing to reconcile: raw/orders holds no rows of {orders.topic} and the "
                "landing zone no delivery; give the days (--start, --end)."
            )
        days = DayRange(min(ends), max(ends))
    stream = stream_vs_topic(lakehouse, orders, days)
    if not stream.metrics:  # the broker did not answer: the check's WARN, here an error
        raise TopicUnavailable(stream.results[0].detail)
    landing_outcome = raw_vs_landing(lakehouse, landing, days)
    staging = staging_vs_raw(lakehouse, days) if lakehouse.exists(STAGING_ORDERS) else None
    both = _orders_from_both(lakehouse, days)
    landing_by_day = {r.partition: r for r in landing_outcome.results}
    staging_by_day = {r.partition: r for r in staging.results} if staging else {}
    report = BoundaryReport(
        orders.topic,
        days,
        delivered[-1] if delivered else None,
        first_message,
        last_partition=daily_partitions.get_last_partition_key(),
    )
    for day in days.day_keys():
        s = stream.metrics[day]
        land, stage = landing_by_day[day], staging_by_day.get(day)
        report.results.append(
            BoundaryDay(
                day=day,
                messages=s["messages"],
                streamed=s["streamed"],
                missing=s["missing"],
                extra_copies=s["extra_copies"] + s["not_on_broker"],
                pending=s["pending"],
                landing_lines=land.expected,
                landing_rows=land.actual,
                staging_expected=stage.expected if stage else 0,
                staging_accounted=stage.actual if stage else 0,
                both_sources=both.get(day, (0, 0))[0],
                both_staged_once=both.get(day, (0, 0))[1],
            )
        )
    return report


def _stream_extent(lakehouse: LakehouseResource, topic: str) -> tuple[list[str], str | None]:
    """First and last ingest day of raw's stream rows, and the first message's timestamp."""
    rows = stream_rows(lakehouse, topic)
    if rows is None:
        return [], None
    row = rows.agg(
        F.min("ingest_date").alias("first"),
        F.max("ingest_date").alias("last"),
        F.min("kafka_timestamp").alias("at"),
    ).first()
    if row is None or row["first"] is None:
        return [], None
    return [row["first"].isoformat(), row["last"].isoformat()], row["at"].isoformat() + "Z"


def _orders_from_both(lakehouse: LakehouseResource, days: DayRange) -> dict[str, tuple[int, int]]:
    """Event day -> (staged orders whose valid versions came by file and by message, those
    staged exactly once)."""
    if not (lakehouse.exists(RAW_ORDERS) and lakehouse.exists(STAGING_ORDERS)):
        return {}
    raw = lakehouse.read(RAW_ORDERS)
    if RAW_ORDERS_STREAM_COLUMN not in raw.columns:
        return {}
    message = F.col(RAW_ORDERS_STREAM_COLUMN).isNotNull()
    both = (
        raw.where(F.col("reject_reason").isNull())
        .groupBy("order_id")
        .agg(F.max(message.cast("int")).alias("m"), F.min(message.cast("int")).alias("l"))
        .where((F.col("m") == 1) & (F.col("l") == 0))
        .select("order_id")
    )
    staged = lakehouse.read(STAGING_ORDERS).join(both, "order_id")
    copies = staged.groupBy("order_id").agg(
        F.count(F.lit(1)).alias("copies"), F.max("event_date").alias("event_date")
    )
    rows = (
        copies.where((F.col("event_date") >= F.lit(days.start)) & (F.col("event_date") < days.end))
        .groupBy("event_date")
        .agg(
            F.count(F.lit(1)).alias("orders"),
            F.count(F.when(F.col("copies") == 1, True)).alias("once"),
        )
        .collect()
    )
    return {r["event_date"].isoformat(): (r["orders"], r["once"]) for r in rows}
