"""The live stream into raw/orders (contract 1.4): Spark Structured Streaming from the order
topic, every message in raw exactly once, however often the stream stops or replays.

Exactly once is two mechanisms, both Spark's and Delta's own: the query's checkpoint
(`<lakehouse>/_checkpoints/raw_orders_stream`) records which offsets each micro-batch
covers before it runs, so a restarted query re-runs an unfinished batch over the very same
offsets; and each batch is appended with Delta's idempotent-write options (`txnAppId` = the
query's id, `txnVersion` = the batch id), so a batch that committed to Delta before the
process died is skipped when it is re-run. The stream appends: it never replaces rows, and
the landing path's replace covers only landing rows (tables.py `owned_rows`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from backfill_platform.assets.staging import staging_frames, staging_reasons
from backfill_platform.operations.mart_fold import (
    FrozenDays,
    MartsFold,
    MartsFolded,
    check_folded_days,
    fold_into_marts,
)
from backfill_platform.ranges import ranges_of
from backfill_platform.resources.delta_io_manager import READ_VERSIONS
from backfill_platform.resources.kafka import (
    QUERY_NAME,
    OrdersTopicResource,
    merge_span,
    offset_spans,
)
from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.resources.maintenance import COMPACT_FILES, Compaction, DayCompactor
from backfill_platform.resources.storage import join, list_dir
from backfill_platform.tables import (
    RAW_ORDERS,
    RAW_ORDERS_STREAM_COLUMN,
    STAGING_ORDERS,
    STAGING_REJECTS,
    table,
)
from backfill_platform.transforms.fx import known_currencies
from backfill_platform.transforms.messages import parse_messages

STREAM_WRITER = "stream"  # commit metadata `writer` of the stream's commits
STOP_GRACE_SECONDS = 90  # how long a stopping stream waits for its batch in flight
# Compiled query classes the stream's JVM keeps: Spark's default, not the batch runs' 1,000.
# A kept class holds its source in the heap, and at 1,000 the stream's heap after a full GC
# grew from 121 to 147 MB, its metaspace by 14 MB, over six simulated days of
# `make soak-stream` as the cache filled (docs/live-stream.md).
STREAM_CODEGEN_CACHE_ENTRIES = 100


@dataclass(frozen=True)
class StagingFold:
    """Fold each committed batch into staging/orders and staging/orders_rejects
    (BACKFILL_STREAM_STAGING): the orders a batch touched are staged within the batch,
    not by the next rolling-window run. `frozen` names the days a freeze holds; `marts`
    folds the staged days on into the marts (BACKFILL_STREAM_MARTS, operations/mart_fold.py)."""

    frozen: FrozenDays | None = None
    marts: MartsFold | None = None


def checkpoint_location(lake: LakehouseResource) -> str:
    """One checkpoint per query, beside the tables under the lakehouse root."""
    return join(lake.root_dir, "_checkpoints", QUERY_NAME)


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    rows: int
    rejects: int
    offsets: dict[int, tuple[int, int]]  # partition -> (first offset, next offset) of the batch
    rows_by_day: dict[str, int]  # ingest day (raw/orders' partition) -> rows of the batch
    delta_version: int | None  # None: Delta already held this batch (a replay), skipped
    seconds: float
    # Folded into staging (StagingFold): table -> {partition key: Delta version}; the days
    # a freeze held; the fold's share of `seconds`.
    staged: dict[str, dict[str, int]] = field(default_factory=dict)
    held_by_freeze: list[str] = field(default_factory=list)
    staging_seconds: float = 0.0
    # Folded on into the marts (its tables and days are in `staged` too): None if not.
    marts: MartsFolded | None = None

    @property
    def ingest_dates(self) -> list[str]:
        return sorted(self.rows_by_day)

    @property
    def checks_only(self) -> bool:
        """The marts' checks evaluated when the query ended, no batch of its own."""
        return not self.offsets and self.marts is not None and not self.marts.written

    def describe(self) -> str:
        if self.checks_only:
            checked = sorted({r.partition for o in self.marts.outcomes for r in o.results})
            failed = [o.check_name for o in self.marts.outcomes if o.failed]
            verdict = f"FAIL: {', '.join(failed)}" if failed else "pass"
            return (
                f"the marts' checks of {len(checked)} folded day(s) not checked yet: "
                f"{verdict} ({self.seconds:.1f} s)"
            )
        spans = ", ".join(
            f"p{p} first {first} next {after}" for p, (first, after) in sorted(self.offsets.items())
        )
        done = (
            f"Delta v{self.delta_version}"
            if self.delta_version is not None
            else "already in raw (replay skipped)"
        )
        staged = ""
        if self.staged:
            days = sorted(self.staged.get(STAGING_ORDERS.to_user_string(), {}))
            staged = f"; staged event days {','.join(days) or '-'} ({self.staging_seconds:.1f} s)"
        if self.held_by_freeze:
            staged += f"; frozen, left to the window: {','.join(self.held_by_freeze)}"
        if self.marts is not None:
            staged += f"; {self.marts.describe()}"
        return (
            f"batch {self.batch_id}: {self.rows} rows, {self.rejects} rejects, "
            f"offsets {spans or '-'}, ingest days {','.join(self.ingest_dates) or '-'}: "
            f"{done} ({self.seconds:.1f} s){staged}"
        )


@dataclass
class CatchUpReport:
    topic: str
    checkpoint: str
    batches: list[BatchReport] = field(default_factory=list)
    seconds: float = 0.0
    compactions: list[Compaction] = field(default_factory=list)  # raw/orders' days compacted
    final_checks: BatchReport | None = None  # the marts' checks left at the query's end

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches if b.delta_version is not None)

    @property
    def rejects(self) -> int:
        return sum(b.rejects for b in self.batches if b.delta_version is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "checkpoint": self.checkpoint,
            "batches": [asdict(b) | {"offsets": offset_spans(b.offsets)} for b in self.batches],
            "rows": self.rows,
            "rejects": self.rejects,
            "seconds": round(self.seconds, 3),
            "compactions": [asdict(c) for c in self.compactions],
            "final_checks": asdict(self.final_checks) if self.final_checks else None,
        }

    def describe(self) -> str:
        rate = self.rows / self.seconds if self.seconds else 0.0
        head = (
            f"caught up with {self.topic}: {len(self.batches)} batch(es), {self.rows} rows "
            f"({self.rejects} rejects) into raw/orders in {self.seconds:.1f} s "
            f"({rate:,.0f} rows/s); checkpoint {self.checkpoint}"
        )
        return "\n".join(
            [
                head,
                *(f"  {b.describe()}" for b in self.batches),
                *(f"  {c.describe()}" for c in self.compactions),
                *([f"  {self.final_checks.describe()}"] if self.final_checks else []),
            ]
        )


def write_batch(
    lake: LakehouseResource,
    messages: DataFrame,
    batch_id: int,
    app_id: str,
    topic: str,
    fold: StagingFold | None = None,
) -> BatchReport:
    """One micro-batch into raw/orders in one idempotent Delta append (skipped if Delta
    already holds `app_id`'s batch `batch_id`), then, with `fold`, into staging."""
    started = time.monotonic()
    # One file per ingest day per batch (the Kafka source reads one task per partition).
    rows = parse_messages(messages).repartition("ingest_date").persist()
    try:
        # A fold judges each row as staging does (the parser's reason, then staging's own
        # rules) to find, in the same job, the days the batch changes in either table.
        judged = rows.withColumn("parsed_reason", F.col("reject_reason"))
        known = None
        if fold is not None:
            known = known_currencies(lake)
            judged = staging_reasons(judged, known)
        stats = judged.groupBy("kafka_partition", "ingest_date").agg(
            F.min("kafka_offset").alias("first"),
            F.max("kafka_offset").alias("last"),
            F.count(F.lit(1)).alias("rows"),
            F.count("parsed_reason").alias("rejects"),  # raw's: the parser's
            F.count("reject_reason").alias("staging_rejects"),
            F.collect_set(F.when(F.col("reject_reason").isNull(), F.col("event_date"))).alias(
                "event_days"
            ),
        )
        groups = stats.collect()
        offsets: dict[int, tuple[int, int]] = {}
        rows_by_day: dict[str, int] = {}
        for r in groups:
            merge_span(offsets, r["kafka_partition"], r["first"], r["last"] + 1)
            day = r["ingest_date"].isoformat()
            rows_by_day[day] = rows_by_day.get(day, 0) + r["rows"]
        days = sorted(rows_by_day)
        count = sum(rows_by_day.values())
        rejects = sum(r["rejects"] for r in groups)
        version, folded, marts = None, None, None
        if count:
            commit = lake.append_once(
                RAW_ORDERS,
                rows,
                table(RAW_ORDERS).partition_column,
                app_id,
                batch_id,
                user_metadata={
                    "writer": STREAM_WRITER,
                    "asset_key": RAW_ORDERS.to_user_string(),
                    "code_version": table(RAW_ORDERS).code_version,
                    "stream_app_id": app_id,
                    "batch_id": batch_id,
                    "topic": topic,
                    "offsets": offset_spans(offsets),
                    "rows": count,
                    "rejects": rejects,
                    "ingest_dates": days,
                },
            )
            version = commit.version if commit else None
        if count and fold is not None:
            # A batch Delta skipped had committed raw before the process died, perhaps
            # before its fold: folding again from the current raw is idempotent.
            raw_version = version if version is not None else lake.current_version(RAW_ORDERS)
            # A row staging keeps can change which version of its order wins, on its event
            # day only (an order's event_time never changes); a row staging rejects adds a
            # reject to its ingest day. No other day of either table can change.
            event_days = sorted({d.isoformat() for r in groups for d in r["event_days"]})
            reject_days = sorted(
                {r["ingest_date"].isoformat() for r in groups if r["staging_rejects"]}
            )
            folded = fold_into_staging(
                lake, raw_version, event_days, reject_days, fold.frozen, known
            )
            staged_days = sorted(folded[0].get(STAGING_ORDERS.to_user_string(), {}))
            if fold.marts is not None and staged_days:
                marts = fold_into_marts(lake, staged_days, fold.marts, STREAM_WRITER)
    finally:
        rows.unpersist()
    report = BatchReport(
        batch_id, count, rejects, offsets, rows_by_day, version, time.monotonic() - started
    )
    if folded is not None:
        staged, held, seconds = folded
        if marts is not None:
            staged = {**staged, **marts.written}
        report = replace(
            report, staged=staged, held_by_freeze=held, staging_seconds=seconds, marts=marts
        )
    return report


def fold_into_staging(
    lake: LakehouseResource,
    raw_version: int,
    event_days: list[str],
    ingest_days: list[str],
    frozen: FrozenDays | None = None,
    known: list[str] | None = None,
) -> tuple[dict[str, dict[str, int]], list[str], float]:
    """Staging's orders of `event_days` and rejects of `ingest_days`, rebuilt from raw at
    `raw_version` with the staging asset's own frames (judged with `known`, the currencies
    the days were chosen with), one replace per run of consecutive days (the same atomic
    partition replace a Dagster run does). Days a freeze holds are skipped. Returns
    table -> {day: version}, the held days and the seconds it took.

    A run that read raw before this batch and commits staging after it would put back
    the days without the batch's rows; the rolling window (recent days) and the staleness
    sensor (older ones) see raw's rows uncounted and rebuild them (docs/live-stream.md).
    """
    started = time.monotonic()
    held = sorted(frozen(sorted({*event_days, *ingest_days}))) if frozen else []
    metadata = {
        "writer": STREAM_WRITER,
        READ_VERSIONS: json.dumps({RAW_ORDERS.to_user_string(): raw_version}),
    }
    staged: dict[str, dict[str, int]] = {}
    for key, days in ((STAGING_ORDERS, event_days), (STAGING_REJECTS, ingest_days)):
        for span in ranges_of(d for d in days if d not in held):
            orders, rejects = staging_frames(lake, raw_version, span.start, span.end, known)
            commit = lake.replace_range(
                key,
                orders if key == STAGING_ORDERS else rejects,
                table(key).partition_column,
                span.start,
                span.end,
                metadata
                | {"asset_key": key.to_user_string(), "code_version": table(key).code_version},
            )
            staged.setdefault(key.to_user_string(), {}).update(
                dict.fromkeys(span.partition_keys(), commit.version)
            )
    return staged, held, time.monotonic() - started


def catch_up(
    lake: LakehouseResource,
    orders: OrdersTopicResource,
    on_batch: Callable[[BatchReport], None] | None = None,
    fold: StagingFold | None = None,
    compact_files: int | None = COMPACT_FILES,
    on_compaction: Callable[[Compaction], None] | None = None,
) -> CatchUpReport:
    """Every message the topic holds now and raw does not, then stop (Spark's AvailableNow
    trigger: the offsets available at the start, in batches of `max_offsets_per_batch`).
    Days that reach `compact_files` small files are compacted meanwhile (None: not)."""
    report = CatchUpReport(orders.topic, checkpoint_location(lake))
    clock = time.monotonic()
    with _compactor(lake, report, compact_files, on_compaction) as compactor:
        query = _start(lake, orders, report, {"availableNow": True}, on_batch, fold, compactor)
        query.awaitTermination()
        _check_the_rest(lake, fold, report, on_batch)
    report.seconds = time.monotonic() - clock
    return report


def run_stream(
    lake: LakehouseResource,
    orders: OrdersTopicResource,
    stop: threading.Event,
    trigger_seconds: float = 5.0,
    on_batch: Callable[[BatchReport], None] | None = None,
    fold: StagingFold | None = None,
    compact_files: int | None = COMPACT_FILES,
    on_compaction: Callable[[Compaction], None] | None = None,
) -> CatchUpReport:
    """The stream until `stop` is set: a micro-batch every `trigger_seconds` while messages
    arrive. Stopping between or inside a batch is safe: an unfinished batch is re-run over
    the same offsets on the next start (and skipped by Delta if it had committed). A failed
    query raises (its exception), so a supervisor sees it and starts it again. Days that
    reach `compact_files` small files are compacted beside it (None: not)."""
    report = CatchUpReport(orders.topic, checkpoint_location(lake))
    clock = time.monotonic()
    trigger = {"processingTime": f"{trigger_seconds} seconds"}
    with _compactor(lake, report, compact_files, on_compaction) as compactor:
        query = _start(lake, orders, report, trigger, on_batch, fold, compactor)
        try:
            while not stop.is_set() and query.isActive:
                query.awaitTermination(1)
            # Let a batch in flight commit rather than cancel it (cancelling is safe, the
            # next start re-runs it, but wastes its work).
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while (
                query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline
            ):
                query.awaitTermination(0.5)
        finally:
            if query.isActive:
                query.stop()
        _check_the_rest(lake, fold, report, on_batch)
    report.seconds = time.monotonic() - clock
    return report


def _check_the_rest(
    lake: LakehouseResource,
    fold: StagingFold | None,
    report: CatchUpReport,
    on_batch: Callable[[BatchReport], None] | None,
) -> None:
    """The marts' folded days whose checks waited for their interval (`MartsFold.
    check_seconds`), checked once the query has ended and handed on like a batch, so no
    folded day goes unchecked."""
    if fold is None or fold.marts is None or not fold.marts.unchecked.days:
        return
    started, done = time.monotonic(), MartsFolded()
    check_folded_days(lake, fold.marts, done)
    done.seconds = time.monotonic() - started
    last = report.batches[-1].batch_id if report.batches else 0
    report.final_checks = BatchReport(last, 0, 0, {}, {}, None, done.seconds, marts=done)
    if on_batch is not None:
        on_batch(report.final_checks)


@contextmanager
def _compactor(
    lake: LakehouseResource,
    report: CatchUpReport,
    compact_files: int | None,
    on_compaction: Callable[[Compaction], None] | None,
) -> Iterator[DayCompactor | None]:
    """raw/orders' compaction beside the query (resources/maintenance.py), its last round
    run when the query ends; the rounds that compacted are recorded in `report`."""
    if compact_files is None:
        yield None
        return

    def heard(done: Compaction) -> None:
        if done.gave_way is None:
            report.compactions.append(done)
        if on_compaction is not None:
            on_compaction(done)

    with DayCompactor(lake, RAW_ORDERS, compact_files, on_round=heard) as compactor:
        yield compactor


def _start(
    lake: LakehouseResource,
    orders: OrdersTopicResource,
    report: CatchUpReport,
    trigger: dict[str, Any],
    on_batch: Callable[[BatchReport], None] | None = None,
    fold: StagingFold | None = None,
    compactor: DayCompactor | None = None,
) -> StreamingQuery:
    """The query from the topic into raw/orders, batches recorded in `report`, the days
    each batch wrote handed to `compactor`."""
    # The batch function needs the query's id, known once start() returns; a batch that
    # starts before waits for it.
    started = threading.Event()
    query_id: dict[str, str] = {}

    def each_batch(messages: DataFrame, batch_id: int) -> None:
        started.wait()
        batch = write_batch(lake, messages, batch_id, query_id["app_id"], orders.topic, fold)
        report.batches.append(batch)
        if compactor is not None and batch.delta_version is not None:
            compactor.note(batch.rows_by_day, batch.delta_version)
        if on_batch is not None:
            on_batch(batch)

    query = (
        lake.session.readStream.format("kafka")
        .options(**orders.source_options())
        .load()
        .writeStream.queryName(QUERY_NAME)
        .option("checkpointLocation", report.checkpoint)
        .trigger(**trigger)
        .foreachBatch(each_batch)
        .start()
    )
    # Stable across restarts: the id is kept in the checkpoint.
    query_id["app_id"] = f"{QUERY_NAME}:{query.id}"
    started.set()
    return query


@dataclass(frozen=True)
class PartitionStatus:
    """One Kafka partition. Positions are next offsets (Kafka's convention): the offset
    after the last one written or held, so `broker_next - raw_next` is the lag."""

    partition: int
    broker_earliest: int  # the broker's earliest retained offset
    broker_next: int  # the broker's next offset to be written (its end offset)
    raw_next: int  # the offset after the greatest raw holds (0: none)
    rows_in_raw: int
    copies_in_raw: int  # rows beyond one per offset: 0 when exactly once holds
    missing_in_raw: int  # offsets from broker_earliest up to raw_next raw lacks: 0, no gap
    checkpoint_next: int | None  # the next offset of the checkpoint's newest committed batch

    @property
    def lag(self) -> int:
        return self.broker_next - self.raw_next


@dataclass
class StreamStatus:
    topic: str
    partitions: list[PartitionStatus]
    checkpoint_batch: int | None
    last_batch: dict[str, Any] | None

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "lag": self.lag,
            "partitions": [asdict(p) | {"lag": p.lag} for p in self.partitions],
            "checkpoint_batch": self.checkpoint_batch,
            "last_batch": self.last_batch,
        }

    def describe(self) -> str:
        lines = [
            f"{self.topic}: lag {self.lag} message(s) behind the broker (offsets: next = the "
            "one after the last written or held)"
        ]
        lines += [
            f"  p{p.partition}: broker earliest {p.broker_earliest} next {p.broker_next}, "
            f"raw next {p.raw_next} ({p.rows_in_raw} rows, {p.copies_in_raw} extra copies, "
            f"{p.missing_in_raw} missing), checkpoint next "
            f"{'-' if p.checkpoint_next is None else p.checkpoint_next}, lag {p.lag}"
            for p in self.partitions
        ]
        last = self.last_batch
        lines.append(
            "  last batch: "
            + (
                f"{last['batch_id']} at {last['timestamp']} (Delta v{last['version']}, "
                f"{last['rows']} rows, {last['rejects']} rejects)"
                if last
                else "none yet"
            )
        )
        return "\n".join(lines)


def stream_status(lake: LakehouseResource, orders: OrdersTopicResource) -> StreamStatus:
    """Per partition: the broker's offsets, what raw/orders holds (rows, extra copies, and
    offsets missing below its newest: no overlap and no gap), the checkpoint's position,
    and the lag (broker's next - raw's next); the stream's last committed batch."""
    broker = orders.end_offsets()
    held: dict[int, Any] = {}
    last = None
    if lake.exists(RAW_ORDERS):
        raw = lake.read(RAW_ORDERS)
        if RAW_ORDERS_STREAM_COLUMN in raw.columns and broker:
            earliest_of = F.create_map(
                *[F.lit(v) for p, (first, _) in sorted(broker.items()) for v in (p, first)]
            )[F.col("kafka_partition")]
            retained = F.when(F.col("kafka_offset") >= earliest_of, F.col("kafka_offset"))
            held = {
                r["kafka_partition"]: r
                for r in raw.where(F.col(RAW_ORDERS_STREAM_COLUMN) == orders.topic)
                .groupBy("kafka_partition")
                .agg(
                    F.max("kafka_offset").alias("last"),
                    F.count(F.lit(1)).alias("rows"),
                    F.count_distinct("kafka_offset").alias("offsets"),
                    F.count_distinct(retained).alias("retained"),
                )
                .collect()
            }
        for entry in lake.history(RAW_ORDERS):
            meta = entry["metadata"]
            if meta.get("writer") == STREAM_WRITER and meta.get("topic") == orders.topic:
                last = {
                    "batch_id": meta["batch_id"],
                    "version": entry["version"],
                    "timestamp": str(entry["timestamp"]),
                    "rows": meta["rows"],
                    "rejects": meta["rejects"],
                    "offsets": meta["offsets"],
                }
                break
    batch, committed = checkpoint_position(lake, orders.topic)
    partitions = [
        PartitionStatus(
            partition=p,
            broker_earliest=earliest,
            broker_next=end,
            raw_next=(held[p]["last"] + 1) if p in held else 0,
            rows_in_raw=held[p]["rows"] if p in held else 0,
            copies_in_raw=(held[p]["rows"] - held[p]["offsets"]) if p in held else 0,
            missing_in_raw=max(0, held[p]["last"] + 1 - earliest - held[p]["retained"])
            if p in held
            else 0,
            checkpoint_next=committed.get(p),
        )
        for p, (earliest, end) in broker.items()
    ]
    return StreamStatus(orders.topic, partitions, batch, last)


def checkpoint_position(lake: LakehouseResource, topic: str) -> tuple[int | None, dict[int, int]]:
    """The newest batch the checkpoint marks committed, and the offsets that batch ends at
    (partition -> next offset): the third line of Spark's offset log entry for it."""
    location = checkpoint_location(lake)
    commits = [
        int(e.name) for e in list_dir(lake.session, join(location, "commits")) if e.name.isdigit()
    ]
    if not commits:
        return None, {}
    batch = max(commits)
    lines = lake.session.read.text(join(location, "offsets", str(batch))).collect()
    if len(lines) < 3:
        return batch, {}
    offsets = json.loads(lines[2]["value"]).get(topic, {})
    return batch, {int(p): int(o) for p, o in offsets.items()}
