"""Replay: the streaming cousin of a backfill. A window of the retained log is read again
(after a parse fix, say) and replaces exactly its messages' rows in raw/orders, then the
partitions downstream of what changed are rebuilt through the normal path and the window
is reconciled like a backfill.

- **Bounded and idempotent.** Work is cut into chunks of at most `max_offsets_per_batch`
  offsets of one Kafka partition; each chunk is one Delta commit that replaces the rows of
  exactly those offsets (`LakehouseResource.replace_messages`), so a chunk run twice, or a
  replay killed and run again, leaves the state of one run.
- **Beside the live stream.** A replay rewrites only offsets the stream has already
  written (below raw's newest offset of each partition, read when the replay is planned);
  the rest of the window is the stream's, which appends each offset once. The two never
  write the same offset, and on a shared table their commits are ordered by the table
  lock (local root) or retried on conflict (object store).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from dagster import AssetKey, AssetMaterialization, DagsterInstance, MetadataValue
from pyspark.sql import functions as F

from backfill_platform.checks.stream import stream_position, stream_rows
from backfill_platform.lineage import Lineage, blast_radius
from backfill_platform.operations.arguments import InvalidArgument
from backfill_platform.partitions import in_partitions
from backfill_platform.ranges import ranges_of
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.kafka import OrdersTopicResource, offset_spans
from backfill_platform.tables import (
    RAW_ORDERS,
    STAGING_ORDERS,
    STAGING_REJECTS,
)
from backfill_platform.transforms.messages import parse_messages

REPLAY_WRITER = "replay"
REPLAY_TAG = "backfill_platform/replay_id"


@dataclass(frozen=True)
class ReplayPlan:
    topic: str
    spans: dict[int, tuple[int, int]]  # partition -> [first, end) offsets to replay
    left_to_stream: dict[int, tuple[int, int]]  # in the window, not streamed yet

    @property
    def messages(self) -> int:
        return sum(end - first for first, end in self.spans.values())


@dataclass(frozen=True)
class ReplayChunk:
    partition: int
    first: int
    end: int  # the next offset after the chunk's last (Kafka's end offset)
    rows: int
    rejects: int
    delta_version: int
    ingest_days: list[str]
    seconds: float

    def describe(self) -> str:
        return (
            f"p{self.partition} first {self.first} next {self.end}: {self.rows} rows, "
            f"{self.rejects} rejects, Delta v{self.delta_version} ({self.seconds:.1f} s)"
        )


@dataclass
class ReplayReport:
    replay_id: str
    plan: ReplayPlan
    chunks: list[ReplayChunk] = field(default_factory=list)
    event_days: list[str] = field(default_factory=list)  # before or after: both rebuilt
    seconds: float = 0.0

    @property
    def ingest_days(self) -> list[str]:
        return sorted({d for c in self.chunks for d in c.ingest_days})

    def to_dict(self) -> dict[str, Any]:
        return {
            "replay_id": self.replay_id,
            "topic": self.plan.topic,
            "spans": offset_spans(self.plan.spans),
            "left_to_stream": offset_spans(self.plan.left_to_stream),
            "chunks": [asdict(c) for c in self.chunks],
            "rows": sum(c.rows for c in self.chunks),
            "rejects": sum(c.rejects for c in self.chunks),
            "ingest_days": self.ingest_days,
            "event_days": self.event_days,
            "seconds": round(self.seconds, 3),
        }

    def describe(self) -> str:
        spans = ", ".join(
            f"p{p} first {a} next {b}" for p, (a, b) in sorted(self.plan.spans.items())
        )
        rest = ", ".join(
            f"p{p} first {a} next {b}" for p, (a, b) in sorted(self.plan.left_to_stream.items())
        )
        rows = sum(c.rows for c in self.chunks)
        lines = [
            f"replay {self.replay_id} of {self.plan.topic}: {self.plan.messages} message(s) "
            f"({spans or 'none'}) -> {rows} raw rows in {len(self.chunks)} commit(s), "
            f"{self.seconds:.1f} s",
            *(f"  {c.describe()}" for c in self.chunks),
        ]
        if rest:
            lines.append(f"  not streamed yet, left to the stream: {rest}")
        if self.event_days:
            lines.append(
                f"  event days touched: {len(self.event_days)} "
                f"({self.event_days[0]}..{self.event_days[-1]})"
            )
        return "\n".join(lines)


def plan_replay(
    lakehouse: LakehouseResource,
    orders: OrdersTopicResource,
    to: datetime,
    since: datetime | None = None,
    from_offsets: Mapping[int, int] | None = None,
) -> ReplayPlan:
    """The offsets to replay: from `since` (the broker's time index) or `from_offsets`, to
    `to`, cut at what the stream has written. Refused, nothing read, when the window starts
    before the broker's retention or names a partition the topic does not have."""
    broker = orders.end_offsets()
    if from_offsets is not None:
        unknown = sorted(set(from_offsets) - set(broker))
        if unknown:
            raise InvalidArgument(
                f"--from-offsets: {orders.topic} has no partition {unknown[0]} "
                f"(partitions {sorted(broker)}); nothing was replayed."
            )
        begin = dict(from_offsets)
    elif since is not None:
        begin = orders.offsets_at(since)
    else:
        raise InvalidArgument("replay needs where to start: --from (an instant) or --from-offsets")
    stop = orders.offsets_at(to)
    position = stream_position(lakehouse, orders.topic)
    spans, rest = {}, {}
    for p, first in sorted(begin.items()):
        earliest, _ = broker[p]
        if first < earliest:
            raise InvalidArgument(
                f"--from-offsets: partition {p} offset {first} is no longer retained (the "
                f"broker keeps {earliest} onwards); nothing was replayed."
            )
        end = stop[p]
        streamed_end = min(end, position.get(p, earliest))
        if streamed_end > first:
            spans[p] = (first, streamed_end)
        if end > max(first, streamed_end):
            rest[p] = (max(first, streamed_end), end)
    return ReplayPlan(orders.topic, spans, rest)


def replay(
    lakehouse: LakehouseResource,
    orders: OrdersTopicResource,
    plan: ReplayPlan,
    instance: DagsterInstance | None = None,
    on_chunk: Callable[[ReplayChunk], None] | None = None,
) -> ReplayReport:
    """Each chunk of `plan` read from the broker and put in place of its rows in raw; each
    committed chunk reported to `instance` as runless materializations of its days."""
    report = ReplayReport(uuid.uuid4().hex[:12], plan)
    clock = time.monotonic()
    size = orders.max_offsets_per_batch
    touched: set[str] = set()
    raw = stream_rows(lakehouse, plan.topic)
    for p, (first, end) in sorted(plan.spans.items()):
        for lo in range(first, end, size):
            hi = min(end, lo + size)
            if raw is not None:  # the event days the old rows held, rebuilt too
                touched |= _event_days(_span(raw, p, lo, hi))
            chunk = _replay_chunk(lakehouse, orders, report.replay_id, p, lo, hi, touched)
            report.chunks.append(chunk)
            if instance is not None:
                _report(instance, plan.topic, report.replay_id, chunk)
            if on_chunk is not None:
                on_chunk(chunk)
    report.event_days = sorted(touched)
    report.seconds = time.monotonic() - clock
    return report


def downstream_of_replay(lineage: Lineage, lakehouse: LakehouseResource, report: ReplayReport):
    """What to rebuild: staging/orders of every event day the replayed rows held before or
    hold now, the rejects of their ingest days, and every built partition downstream."""
    built = {key: set(lakehouse.built_partitions(key)) for key in lineage.toposorted()}
    work: dict[AssetKey, set[str]] = {}
    for key, days in ((STAGING_ORDERS, report.event_days), (STAGING_REJECTS, report.ingest_days)):
        for days_range in ranges_of(days):
            radius = blast_radius(
                lineage, [key], days_range.first, days_range.last, lambda k: built[k]
            )
            for asset, keys in radius.items():
                work.setdefault(asset, set()).update(keys)
    return work


def _replay_chunk(lakehouse, orders, replay_id, p, lo, hi, touched: set[str]) -> ReplayChunk:
    started = time.monotonic()
    rows = parse_messages(orders.read(lakehouse.session, {p: (lo, hi)})).persist()
    try:
        stats = (
            rows.groupBy("ingest_date", "event_date")
            .agg(F.count(F.lit(1)).alias("rows"), F.count("reject_reason").alias("rejects"))
            .collect()
        )
        ingest_days = sorted({r["ingest_date"].isoformat() for r in stats})
        touched |= {r["event_date"].isoformat() for r in stats if r["event_date"] is not None}
        count, rejects = sum(r["rows"] for r in stats), sum(r["rejects"] for r in stats)
        if count != hi - lo:
            raise InvalidArgument(
                f"replay p{p} [{lo}, {hi}): the broker returned {count} messages, not "
                f"{hi - lo}; nothing of this chunk was written."
            )
        commit = lakehouse.replace_messages(
            RAW_ORDERS,
            rows,
            orders.topic,
            p,
            lo,
            hi,
            user_metadata={
                "writer": REPLAY_WRITER,
                "replay_id": replay_id,
                "topic": orders.topic,
                "offsets": offset_spans({p: (lo, hi)}),
                "rows": count,
                "rejects": rejects,
                "ingest_dates": ingest_days,
            },
        )
    finally:
        rows.unpersist()
    return ReplayChunk(
        p, lo, hi, count, rejects, commit.version, ingest_days, time.monotonic() - started
    )


def _report(instance: DagsterInstance, topic: str, replay_id: str, chunk: ReplayChunk) -> None:
    """A runless materialization of each partition the chunk rewrote. A day past the last
    partition is not one: the stream holds it and reports it once it is."""
    for day in in_partitions(chunk.ingest_days):
        instance.report_runless_asset_event(
            AssetMaterialization(
                asset_key=RAW_ORDERS,
                partition=day,
                description=f"replay {replay_id} of {topic} p{chunk.partition}",
                metadata={
                    "writer": REPLAY_WRITER,
                    "topic": topic,
                    "replay_id": replay_id,
                    "delta_version": chunk.delta_version,
                    "replayed_offsets": MetadataValue.json(
                        offset_spans({chunk.partition: (chunk.first, chunk.end)})
                    ),
                },
            )
        )


def _span(rows, p: int, lo: int, hi: int):
    return rows.where(
        (F.col("kafka_partition") == p)
        & (F.col("kafka_offset") >= lo)
        & (F.col("kafka_offset") < hi)
    )


def _event_days(rows) -> set[str]:
    return {
        r["event_date"].isoformat()
        for r in rows.where(F.col("event_date").isNotNull())
        .select("event_date")
        .distinct()
        .collect()
    }
