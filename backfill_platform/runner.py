"""The one way ranged, chunked work runs: the demo, the CLI's playbook, the downstream rebuild
after a cutover, the stale-day repair, tests and benchmarks all go through `run_work`.

Work is "these partitions of these assets". `plan_work` turns it into ranged runs ordered by
the asset graph (`Lineage.stages`: a stage covers the whole range before the next starts,
because staging reads raw's later ingest days; inside a stage, chunks run oldest first, as
the self-dependent LTV requires). An `Executor` carries the runs out: `InProcessExecutor`
runs them in this process through `materialize()` (real Dagster runs, recorded in the
instance, one Spark session for all); `deployment.DeploymentExecutor` submits the same work
to a running deployment as one Dagster asset backfill (queue, pools, run retries, the
Backfills page) and follows it.

The failure rule in process: **stop at the first failed run** and report it; later runs
read what the failed one should have written, so running them would only spread the
failure. (On a deployment Dagster's backfill applies the same rule per partition: it does
not materialize what depends on a failed partition.) Nothing raises for a failed run;
callers turn `RunReport.success` into their exit status (or `raise_for_failure()`).

A command line shows progress without threading a callback through every operation:
`with observing(observer):` makes every `run_work` in the block tell the observer its plan,
each finished run and the report (the demo's and the CLI's progress bars).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from dagster import (
    AssetChecksDefinition,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    ExecuteInProcessResult,
    RunsFilter,
    materialize,
)
from dagster_postgres import PostgresEventLogStorage
from psycopg2 import Error as PostgresError
from psycopg2.extensions import connection as PostgresConnection
from sqlalchemy import event, exc
from sqlalchemy.pool import QueuePool

from backfill_platform.lineage import Lineage
from backfill_platform.ranges import DayRange, ranges_of
from backfill_platform.settings import PARTITIONS_PER_RUN, RUN_TARGET_MB, int_setting

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
# Dagster's tag on a single-partition run (ranged runs carry the two range tags).
PARTITION_TAG = "dagster/partition"
# Every run the platform launches says why (sensors tell live runs from backfills by it).
TRIGGER_TAG = "backfill_platform/trigger"
ACTIVE_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


@dataclass(frozen=True)
class RunSpec:
    """One ranged Dagster run: these assets over these days."""

    keys: tuple[AssetKey, ...]
    days: DayRange

    @property
    def assets(self) -> list[str]:
        return [k.to_user_string() for k in self.keys]


@dataclass(frozen=True)
class RangeRun:
    first_key: str
    last_key: str
    run_id: str
    success: bool
    assets: tuple[str, ...] = ()
    # A failed run's first failed step and its error's own words (`failure_reason`).
    reason: str | None = None


# A Dagster backfill's final status when all of it succeeded.
BACKFILL_SUCCEEDED = "COMPLETED_SUCCESS"


@dataclass
class RunReport:
    runs: list[RangeRun] = field(default_factory=list)
    not_run: list[RunSpec] = field(default_factory=list)
    # Set when the work ran as a Dagster asset backfill on a deployment.
    backfill_id: str | None = None
    backfill_url: str | None = None
    outcome: str | None = None  # the backfill's final status, e.g. COMPLETED_SUCCESS

    @property
    def success(self) -> bool:
        if self.outcome is not None:  # a deployment's backfill: a run retried into success
            return self.outcome == BACKFILL_SUCCEEDED  # leaves its failed attempt in `runs`
        return all(r.success for r in self.runs) and not self.not_run

    @property
    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.runs]

    def raise_for_failure(self) -> RunReport:
        if not self.success:
            failed = next((r for r in self.runs if not r.success), None)
            where = f"run {failed.run_id} ({failed.first_key}..{failed.last_key})" if failed else ""
            if self.backfill_id and not failed:
                where = f"backfill {self.backfill_id} ended {self.outcome}"
            raise BackfillFailed(
                f"{where} failed; {len(self.not_run)} later run(s) not started. "
                "Fix the cause and run the same range again: finished runs are idempotent."
            )
        return self


class BackfillFailed(Exception):
    """A run of the plan failed; runs after it were not started."""


class Executor(Protocol):
    """Carries out a plan of ranged runs, in order, stopping at the first failure."""

    def execute(
        self,
        plan: Sequence[RunSpec],
        tags: Mapping[str, str],
        on_run: Callable[[RangeRun], None] | None = None,
    ) -> RunReport: ...


@dataclass(frozen=True)
class BackfillProgress:
    """Where a deployment's asset backfill stands: partitions (asset by day) and runs."""

    partitions_done: int
    partitions_total: int
    partitions_failed: int
    runs_done: int
    runs_total: int


class RunObserver(Protocol):
    """Told about the work `run_work` does while it is installed with `observing`."""

    def planned(self, plan: Sequence[RunSpec], trigger: str) -> None: ...

    def ran(self, run: RangeRun) -> None: ...

    def finished(self, report: RunReport | None) -> None: ...

    # Only a deployment executor calls these: its runs are Dagster's, not the plan's.
    def launched(self, backfill_id: str, url: str) -> None: ...

    def progressed(self, progress: BackfillProgress) -> None: ...


_OBSERVER: ContextVar[RunObserver | None] = ContextVar("backfill_run_observer", default=None)


@contextmanager
def observing(observer: RunObserver) -> Iterator[RunObserver]:
    """Every `run_work` inside the block reports its plan, runs and report to `observer`."""
    token = _OBSERVER.set(observer)
    try:
        yield observer
    finally:
        _OBSERVER.reset(token)


def current_observer() -> RunObserver | None:
    """The observer installed by `observing`, for executors that report more than runs."""
    return _OBSERVER.get()


def range_tags(days: DayRange) -> dict[str, str]:
    return {RANGE_START_TAG: days.first, RANGE_END_TAG: days.last}


def active_runs(instance: DagsterInstance, **filters) -> list[DagsterRun]:
    """Queued or running runs matching `RunsFilter` fields (job_name, tags...)."""
    records = instance.get_run_records(RunsFilter(statuses=ACTIVE_STATUSES, **filters))
    return [record.dagster_run for record in records]


def run_days(run: DagsterRun) -> DayRange | None:
    """The days a run writes, from its range or partition tags; None for an unpartitioned run."""
    first = run.tags.get(RANGE_START_TAG) or run.tags.get(PARTITION_TAG)
    return DayRange(first, run.tags.get(RANGE_END_TAG) or first) if first else None


def materialize_range(
    assets: Sequence[AssetsDefinition],
    first_key: str,
    last_key: str,
    resources: Mapping[str, object],
    instance: DagsterInstance,
    selection: AssetSelection | Sequence[AssetKey] | None = None,
    raise_on_error: bool = True,
    tags: Mapping[str, str] | None = None,
    run_config: Mapping[str, object] | None = None,
) -> ExecuteInProcessResult:
    """One in-process Dagster run over the partition keys first_key..last_key (inclusive)."""
    return materialize(
        assets,
        selection=selection,
        resources=resources,
        instance=instance,
        run_config=run_config,
        tags={**(tags or {}), **range_tags(DayRange(first_key, last_key))},
        raise_on_error=raise_on_error,
    )


# Dagster's own switch for writing a step's events in one storage call (the batch Dagster
# groups them in: a ranged step's materializations, a run's planned events). PostgreSQL
# stores a batch of materializations in one INSERT; SQLite stores them one by one either way.
EVENT_BATCH_ENV = "DAGSTER_EVENT_BATCH_SIZE"
EVENT_BATCH_SIZE = 1000


def recording_instance(instance: DagsterInstance | None = None) -> DagsterInstance:
    """The instance (DAGSTER_HOME's unless given) set up for a process that records many runs:
    the demo, the CLI. A ranged run writes two Dagster events per asset and partition
    (9,864 partitions in the demo). Dagster's PostgreSQL storage opens a connection per
    statement unless told the process is long-lived, as it tells its webserver
    (`optimize_for_webserver`: one pooled connection, kept open); with that and event batches
    a 1,096-partition asset's events took 2.2 s against 39.8 s (SQLite: 14.5 s,
    docs/performance.md). A no-op for SQLite storage. The batch size is set only if unset."""
    os.environ.setdefault(EVENT_BATCH_ENV, str(EVENT_BATCH_SIZE))
    instance = instance or DagsterInstance.get()
    if not event.contains(QueuePool, "checkout", _ping):
        event.listen(QueuePool, "checkin", _checked_in)
        event.listen(QueuePool, "checkout", _ping)
    if instance not in _RECORDING:  # once: a second call would leave the first pool open
        # statement_timeout 0: no limit (a webserver's guard against slow reads, not for a
        # writer); overflow for the progress bar's polling thread beside the runs.
        instance.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=4)
        _RECORDING.add(instance)
    return instance


# Instances `recording_instance` has set up, so it sets each up once.
_RECORDING: weakref.WeakSet[DagsterInstance] = weakref.WeakSet()


# A pooled connection idle this long is pinged before it is used again: a restart of the
# demo's server takes 0.24 s, and within a burst of events (a step's, milliseconds apart) a
# ping before every statement cost a fifth of Dagster's event time (368 partitions and
# evaluations: 1.96-2.14 s against 1.59-1.69 s without).
PING_AFTER_IDLE_SECONDS = 0.1
_IDLE_SINCE = "backfill_platform_idle_since"


def _checked_in(_dbapi_connection, record) -> None:
    record.info[_IDLE_SINCE] = time.monotonic()


def _ping(dbapi_connection, record, _proxy) -> None:
    """A pooled PostgreSQL connection idle for a while answers before it is handed out, or
    is replaced.

    A server restarted under a pooled connection (an upgrade, a failover) leaves it dead,
    and the next statement failed where Dagster's connection per statement would have
    reconnected, retrying (`test_postgres_instance.py`). SQLAlchemy's pessimistic disconnect
    handling: `DisconnectionError` on checkout makes the pool open a new connection, and a
    server still down fails that connect, which Dagster retries. Dagster's engine is not
    public, so the listener is on the pool class: it pings PostgreSQL connections only."""
    if not isinstance(dbapi_connection, PostgresConnection):
        return
    if time.monotonic() - record.info.get(_IDLE_SINCE, 0.0) < PING_AFTER_IDLE_SECONDS:
        return
    try:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except PostgresError as error:
        raise exc.DisconnectionError(f"pooled connection lost: {error}") from error


def record_run_events(instance: DagsterInstance | None) -> None:
    """`recording_instance` for the instance a run executes with, when its events go to
    PostgreSQL: a run the daemon launches (its own process, a run worker) otherwise writes
    every event on a new connection: a 92-day UI backfill's runs at the demo's size took
    135-159 s that way, 96-99 s pooled and batched (docs/performance.md). SQLite
    and in-memory instances are left as they are (nothing to pool; the environment of a
    test process untouched)."""
    if instance is not None and isinstance(instance.event_log_storage, PostgresEventLogStorage):
        recording_instance(instance)


@dataclass
class InProcessExecutor:
    """Real Dagster runs executed in this process (tests, the demo, scripted use)."""

    assets: Sequence[AssetsDefinition]
    resources: Mapping[str, object]
    instance: DagsterInstance
    run_config: Mapping[str, object] | None = None

    def landing_sizes(self, days: Sequence[str]) -> Mapping[str, int] | None:
        """Bytes delivered per day (both kinds of landing file): what sizes the runs."""
        landing = self.resources.get("landing")
        return landing.bytes_by_day(days) if landing is not None else None

    def execute(
        self,
        plan: Sequence[RunSpec],
        tags: Mapping[str, str],
        on_run: Callable[[RangeRun], None] | None = None,
    ) -> RunReport:
        report = RunReport()
        for index, spec in enumerate(plan):
            result = materialize_range(
                self.assets,
                spec.days.first,
                spec.days.last,
                self.resources,
                self.instance,
                selection=AssetSelection.assets(*spec.keys),
                raise_on_error=False,
                tags=tags,
                run_config=self.run_config,
            )
            run = RangeRun(
                spec.days.first,
                spec.days.last,
                result.run_id,
                result.success,
                tuple(spec.assets),
                None if result.success else failure_reason(self.instance, result.run_id),
            )
            report.runs.append(run)
            if on_run:
                on_run(run)
            if not run.success:
                report.not_run = list(plan[index + 1 :])
                break
        return report


def failure_reason(instance: DagsterInstance, run_id: str) -> str | None:
    """`<step>: <the error's first line>` of the run's first failed step, the innermost cause
    (the platform's own refusal, not Dagster's wrapper around it); None when no step failed
    (a run canceled or failed before its steps)."""
    for record in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        event = record.dagster_event
        error = event.step_failure_data.error if event and event.step_failure_data else None
        if error is None:
            continue
        while error.cause is not None:
            error = error.cause
        message = (error.message or "").strip().splitlines()
        return f"{event.step_key}: {message[0] if message else error.cls_name}"
    return None


def per_run_default() -> int:
    return int_setting(PARTITIONS_PER_RUN)


def fixed_per_run() -> int | None:
    """Days per run when the operator fixed them (`BACKFILL_PARTITIONS_PER_RUN` set);
    otherwise None: runs are sized by work where the landing sizes are known."""
    return per_run_default() if PARTITIONS_PER_RUN.get_value() else None


def run_target_bytes() -> int:
    return int_setting(RUN_TARGET_MB) * 1024 * 1024


def plan_work(
    lineage: Lineage,
    work: Mapping[AssetKey, Sequence[str] | set[str]],
    per_run: int | None = None,
    sizes: Mapping[str, int] | None = None,
) -> list[RunSpec]:
    """Ranged runs for `work` (asset -> partition keys), in the order the graph demands.

    Stage by stage (see `Lineage.stages`); inside a stage, assets that need the same days
    share runs, chunk by chunk oldest first; assets needing other days follow in graph order.
    A run never selects part of a multi-asset Dagster cannot subset (`Lineage.siblings`):
    its outputs run together over the union of their days, since Dagster refuses to build
    a job with one of them alone. The staging multi-asset subsets, so each of its outputs
    gets exactly its own days (orders by event day, rejects by ingest day: assets/staging.py).
    Chunks: `per_run` days each when given (or `BACKFILL_PARTITIONS_PER_RUN` when set);
    otherwise, with `sizes` (landing bytes by day), as few as keep each run's input near
    `BACKFILL_RUN_TARGET_MB`: a run costs seconds of fixed work whatever its data
    (docs/performance.md), so three years of small days are one run, not twelve; without
    sizes, `BACKFILL_PARTITIONS_PER_RUN`'s default.
    """
    per_run = per_run or fixed_per_run() or (None if sizes is not None else per_run_default())
    target = run_target_bytes()

    def chunks(span: DayRange) -> list[DayRange]:
        return span.chunks(per_run) if per_run else span.chunks_by_size(sizes or {}, target)

    plan: list[RunSpec] = []
    for stage in lineage.stages([k for k, days in work.items() if days]):
        by_days: dict[frozenset[str], list[AssetKey]] = {}
        for key in stage:
            days = frozenset().union(*(work.get(s) or () for s in lineage.siblings[key]))
            by_days.setdefault(days, []).append(key)
        for days, keys in by_days.items():
            for span in ranges_of(days):
                plan += [RunSpec(tuple(keys), chunk) for chunk in chunks(span)]
    return plan


def run_work(
    executor: Executor,
    lineage: Lineage,
    work: Mapping[AssetKey, Sequence[str] | set[str]],
    trigger: str,
    tags: Mapping[str, str] | None = None,
    per_run: int | None = None,
    on_run: Callable[[RangeRun], None] | None = None,
) -> RunReport:
    """Plan `work` and execute it; every run is tagged with why it ran. An executor that runs
    the plan's chunks itself tells their landing sizes (`landing_sizes`); a deployment's
    backfill is chunked by Dagster's `BackfillPolicy` instead."""
    per_run = per_run or fixed_per_run()  # read once: whether to measure, how to chunk
    sizes = None
    measure = getattr(executor, "landing_sizes", None)
    if measure is not None and not per_run:
        sizes = measure(sorted(set().union(*work.values())))
    return run_plan(executor, plan_work(lineage, work, per_run, sizes), trigger, tags, on_run)


def run_plan(
    executor: Executor,
    plan: Sequence[RunSpec],
    trigger: str,
    tags: Mapping[str, str] | None = None,
    on_run: Callable[[RangeRun], None] | None = None,
) -> RunReport:
    """Execute a plan made elsewhere, tagged and observed like `run_work`'s."""
    observer = _OBSERVER.get()
    if observer is None:
        return executor.execute(plan, {**(tags or {}), TRIGGER_TAG: trigger}, on_run)

    def report_run(run: RangeRun) -> None:
        observer.ran(run)
        if on_run:
            on_run(run)

    observer.planned(plan, trigger)
    report = None
    try:
        report = executor.execute(plan, {**(tags or {}), TRIGGER_TAG: trigger}, report_run)
        return report
    finally:
        observer.finished(report)  # None: the executor raised


def run_range(
    executor: Executor,
    lineage: Lineage,
    selection: Sequence[AssetKey],
    days: DayRange,
    trigger: str,
    tags: Mapping[str, str] | None = None,
    per_run: int | None = None,
    on_run: Callable[[RangeRun], None] | None = None,
) -> RunReport:
    """`selection` (plus what must run with it) over every day of `days`."""
    keys = days.partition_keys()
    work = {key: keys for key in lineage.expand(selection)}
    return run_work(executor, lineage, work, trigger, tags, per_run, on_run)


def backfill(
    assets: Sequence[AssetsDefinition],
    first_key: str,
    last_key: str,
    resources: Mapping[str, object],
    instance: DagsterInstance,
    per_run: int | None = None,
    on_run: Callable[[RangeRun], None] | None = None,
    checks: Sequence[AssetChecksDefinition] = (),
) -> list[RangeRun]:
    """Every asset over first..last in process; raises `BackfillFailed` if a run fails.

    With `checks` (e.g. `checks.all_checks`) each run also evaluates the checks of the
    assets it materializes, as a run of the code location does; the plan is the same."""
    lineage = Lineage(assets)
    report = run_range(
        InProcessExecutor([*assets, *checks], resources, instance),
        lineage,
        lineage.toposorted(),
        DayRange(first_key, last_key),
        trigger="backfill",
        per_run=per_run,
        on_run=on_run,
    )
    return report.raise_for_failure().runs
