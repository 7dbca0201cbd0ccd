"""What Dagster's instance learns of the stream (contract 1.4): its commits as runless
materializations of the partitions they wrote (raw/orders' ingest days, and the staging and
mart days a fold rebuilt, each mart day followed by its checks' evaluations), coalesced so
that a stream running for months writes a bounded number of events, and the days past the
last partition, held until they are partitions.

**Coalescing.** Dagster has no streaming runs, and a materialization per batch is up to
17,280 events a day per partition at a 5 s trigger. `StreamReporter` reports a partition
at most once per interval (`report_seconds`: a minute, or a quarter of the freshness
window when that is shorter): each report carries what the stream committed to that
partition since its last one (the rows, the batches' offsets per Kafka partition, the
first and last batch, the newest Delta version). A partition not reported within the
interval (a new day among them) is reported at its batch; one reported less than an
interval ago when the interval has passed (a timer, so the last batches before a quiet
spell are not left unreported); and whatever is pending when the stream stops or a
catch-up ends (`close`). So a partition-day gets at most 86,400 / interval + 1 reports
(1,441 at a minute) plus one per stop, and the freshness policy, which counts
materializations, sees one within an interval of every commit.

**The marts' checks** are evaluated at most once per interval too (`MartsFold.check_seconds`),
so a batch can carry the evaluations of days an earlier batch folded: they are reported as
evaluations alone, after the day's materialization, and a later commit of the day drops an
evaluation still pending before it (it verified the day as it was).

**Held days.** A materialization of a partition the code location does not define is never
written: the UI would list a partition that does not exist, and sensors could target it.
The stream's rows of such a day (a message stamped after BACKFILL_END_DATE, or today while
the partitions end yesterday) are real data and stay in raw/orders; the day is *held*. The
held days are named on raw/orders by a `stream_held` observation each time they change, so
the asset's page says why a day with stream rows has no materialization, and a restarted
stream knows them. A held day is reported once it is a partition: at the stream's first
batch after that (with BACKFILL_END_DATE unset the partitions gain a day at midnight UTC),
or at the stream's next start (a later BACKFILL_END_DATE takes effect when the process
starts). Its materialization carries the day's stream rows and offsets as raw holds them
then, since no single batch wrote them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from datetime import date

from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    MetadataValue,
)
from pyspark.sql import functions as F

from backfill_platform.assets.freshness import stream_freshness_policy
from backfill_platform.operations.stream import STREAM_WRITER, BatchReport
from backfill_platform.partitions import daily_partitions, in_partitions
from backfill_platform.resources.kafka import merge_span, offset_spans
from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.tables import RAW_ORDERS, RAW_ORDERS_STREAM_COLUMN

STREAM_HELD = "stream_held"  # the observation's `event` on raw/orders
OBSERVATIONS_PER_PAGE = 100
REPORT_SECONDS = 60.0  # a partition's reports are at least this far apart
RAW = RAW_ORDERS.to_user_string()


def report_seconds() -> float:
    """The least time between two reports of a partition: a minute, or a quarter of the
    freshness window (BACKFILL_STREAM_FRESHNESS_SECONDS) when shorter, so that a committing
    stream keeps its asset fresh with three intervals to spare (a 60 s window: 15 s)."""
    policy = stream_freshness_policy()
    if policy is None:
        return REPORT_SECONDS
    return min(REPORT_SECONDS, policy.fail_window.to_timedelta().total_seconds() / 4)


@dataclass(frozen=True)
class DayReport:
    """What the stream committed to one partition of one asset since its last report."""

    asset: str  # `raw/orders`, or a staging table a fold rebuilt
    day: str
    first_batch: int
    last_batch: int
    batches: int  # 0: no commit, the checks of a day an earlier batch folded
    delta_version: int  # the newest commit's
    rows: int = 0  # raw/orders: the rows the batches wrote to the day
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)  # raw: partition -> span
    # A mart the fold rebuilt: its checks' newest evaluations of the day, by check name.
    checks: dict[str, AssetCheckEvaluation] = field(default_factory=dict)

    def then(self, later: DayReport) -> DayReport:
        """This report and a later batch's, as one. A later commit of the day drops the
        checks pending here: they verified the day before it."""
        if not later.batches:
            return replace(self, checks={**self.checks, **later.checks})
        if not self.batches:
            return later
        spans = dict(self.offsets)
        for p, (first, after) in later.offsets.items():
            merge_span(spans, p, first, after)
        return replace(
            self,
            first_batch=min(self.first_batch, later.first_batch),
            last_batch=max(self.last_batch, later.last_batch),
            batches=self.batches + later.batches,
            delta_version=max(self.delta_version, later.delta_version),
            rows=self.rows + later.rows,
            offsets=spans,
            checks=later.checks,
        )


def day_reports(batch: BatchReport) -> list[DayReport]:
    """One report per partition `batch` committed (days past the partitions included); none
    for raw/orders when Delta skipped the batch as a replay (it wrote nothing there)."""
    one = {"first_batch": batch.batch_id, "last_batch": batch.batch_id, "batches": 1}
    checks: dict[tuple[str, str], dict[str, AssetCheckEvaluation]] = {}
    for outcome in batch.marts.outcomes if batch.marts else []:
        for evaluation in outcome.evaluations(blocking=True):
            where = (outcome.asset_key.to_user_string(), evaluation.partition)
            checks.setdefault(where, {})[outcome.check_name] = evaluation
    found = [
        DayReport(name, day, delta_version=version, checks=checks.pop((name, day), {}), **one)
        for name, versions in sorted(batch.staged.items())
        for day, version in sorted(versions.items())
    ]
    # Checks of days earlier batches folded (evaluated once per interval, or at the end).
    found += [
        DayReport(name, day, batch.batch_id, batch.batch_id, 0, -1, checks=evaluations)
        for (name, day), evaluations in sorted(checks.items())
    ]
    if batch.delta_version is not None:
        spans = dict(batch.offsets)
        found += [
            DayReport(RAW, day, delta_version=batch.delta_version, rows=n, offsets=spans, **one)
            for day, n in sorted(batch.rows_by_day.items())
        ]
    return found


def report_days(instance: DagsterInstance, topic: str, reports: list[DayReport]) -> None:
    """Each report as a runless materialization of its partition, so the asset's partitions
    show the stream's progress per day beside the backfills' runs and their downstream
    partitions turn stale as late messages land."""
    for r in reports:
        if not r.batches:  # checks of a day reported before: they verify its newest commit
            for evaluation in r.checks.values():
                instance.report_runless_asset_event(evaluation)
            continue
        batches = (
            f"batch {r.last_batch}"
            if r.batches == 1
            else f"batches {r.first_batch}..{r.last_batch} ({r.batches})"
        )
        metadata = {
            "writer": STREAM_WRITER,
            "batch_id": r.last_batch,
            "first_batch_id": r.first_batch,
            "batches": r.batches,
            "delta_version": r.delta_version,
        }
        if r.asset == RAW:
            description = f"stream {batches} from {topic}"
            metadata |= {
                "topic": topic,
                "rows": r.rows,
                "offsets": MetadataValue.json(offset_spans(r.offsets)),
            }
        else:
            description = f"stream {batches} folded into {r.asset}"
        instance.report_runless_asset_event(
            AssetMaterialization(
                asset_key=AssetKey.from_user_string(r.asset),
                partition=r.day,
                description=description,
                metadata=metadata,
            )
        )
        for evaluation in r.checks.values():  # after it: they verify this materialization
            instance.report_runless_asset_event(evaluation)


def report_batch(instance: DagsterInstance, topic: str, batch: BatchReport) -> list[str]:
    """`batch` reported at once, uncoalesced: a runless materialization of every partition
    it committed. Only partitions are reported; returns the raw/orders days it held back
    (past the last partition: their rows are in raw, `StreamReporter` reports them once
    they are partitions)."""
    defined, past = _by_partition(day_reports(batch))
    report_days(instance, topic, defined)
    return sorted(past)


def _by_partition(reports: list[DayReport]) -> tuple[list[DayReport], set[str]]:
    """The reports of partitions the code location defines, and the raw/orders days past
    the last partition (held: never reported as a materialization)."""
    defined = set(in_partitions(sorted({r.day for r in reports})))
    past = {r.day for r in reports if r.asset == RAW} - defined
    return [r for r in reports if r.day in defined], past


class StreamReporter:
    """Reports the stream's batches to `instance` (an `on_batch` callback), coalesced per
    partition (the module's rule), holds the days past the last partition and reports them
    once they are partitions. Created when the stream starts: it takes up the held days a
    previous process left. `close()` (or leaving its `with`) reports what is pending.

    Thread-safe: batches arrive on the query's thread, a due report fires on a timer."""

    def __init__(
        self,
        instance: DagsterInstance,
        lake: LakehouseResource,
        topic: str,
        interval_seconds: float | None = None,
    ):
        self.instance, self.lake, self.topic = instance, lake, topic
        self.interval = report_seconds() if interval_seconds is None else interval_seconds
        self.held: list[str] = held_days(instance, topic)
        self.notes: list[str] = []  # what it held and released, for the command's output
        self.reported = 0  # materializations written
        self._pending: dict[tuple[str, str], DayReport] = {}
        # (asset, day) -> when it was last reported, while its interval runs.
        self._last: dict[tuple[str, str], float] = {}
        self._timer: threading.Timer | None = None
        self._timer_at = 0.0
        self._guard = threading.RLock()

    def __call__(self, batch: BatchReport) -> None:
        with self._guard:
            # A held day that is a partition now is reported below with raw's rows of the
            # day, this batch's included.
            releasing = set(in_partitions(self.held))
            defined, past = _by_partition(day_reports(batch))
            for r in defined:
                if not (r.asset == RAW and r.day in releasing):
                    earlier = self._pending.get((r.asset, r.day))
                    self._pending[(r.asset, r.day)] = earlier.then(r) if earlier else r
            new = sorted(past - set(self.held))
            if new:
                self.held = sorted({*self.held, *new})
                self._note(
                    f"held {_days(new)}: after the last partition {_last_partition()}; their "
                    "rows are in raw/orders, reported once the partitions reach them"
                )
            self.release()
            self._report_due()

    def flush(self) -> int:
        """Report every pending partition now, due or not; how many."""
        with self._guard:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return self._report(list(self._pending))

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> StreamReporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def release(self) -> list[str]:
        """Report the held days that are partitions now (one Spark job over them)."""
        with self._guard:
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
                        description=f"stream rows from {self.topic}, held until {day} was a "
                        "partition",
                        metadata={
                            "writer": STREAM_WRITER,
                            "topic": self.topic,
                            "delta_version": version,
                            "rows": rows,
                            "day_offsets": MetadataValue.json(offset_spans(spans)),
                        },
                    )
                )
                self.reported += 1
            self.held = sorted(set(self.held) - set(ready))
            self._note(f"reported {_days(ready)}, held until now a partition")
            return ready

    def _report(self, keys: list[tuple[str, str]]) -> int:
        """Report the pending partitions `keys` now, and start their intervals."""
        reports = [self._pending.pop(k) for k in sorted(keys)]
        if reports:
            report_days(self.instance, self.topic, reports)
            self.reported += sum(1 for r in reports if r.batches)
            now = time.monotonic()
            self._last.update(dict.fromkeys(keys, now))
        return len(reports)

    def _report_due(self) -> None:
        """Report the pending partitions whose interval has passed (a partition not reported
        within the interval, a new day among them, at once); set a timer for the others."""
        now = time.monotonic()
        self._last = {k: t for k, t in self._last.items() if t + self.interval > now}
        self._report([k for k in self._pending if k not in self._last])
        if not self._pending:
            return
        at = min(self._last[k] for k in self._pending) + self.interval
        if self._timer is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        timer = threading.Timer(max(0.0, at - time.monotonic()), lambda: self._on_timer(timer))
        timer.daemon = True
        self._timer, self._timer_at = timer, at
        timer.start()

    def _on_timer(self, timer: threading.Timer) -> None:
        with self._guard:
            if self._timer is timer:  # else replaced or cancelled meanwhile
                self._timer = None
                self._report_due()

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
