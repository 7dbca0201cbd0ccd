"""The live path's sensors: landing deliveries, the rolling late-data window, stale partitions.

Intervals (see docs/live-path.md): landing and window every 30 s, staleness every 60 s with
an audit run at most every 30 min while nothing is stale. Sensors only read the landing
listing and Dagster's instance (no Spark in the code server); every Spark scan and every
write happens in a queued run under the instance's concurrency limits.
"""

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta

from dagster import (
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from backfill_platform.automation.live_jobs import (
    AUDIT_MARKER,
    DOWNSTREAM_KEYS,
    RAW_KEYS,
    REACTS_TO_TAG,
    raw_ingest_job,
    repair_ltv_job,
    repair_staging_job,
    rolling_window_job,
    staleness_audit_job,
)
from backfill_platform.automation.staleness import REPAIR_COMMAND, STAGING_STEP, StalenessReport
from backfill_platform.checks import blocking_check_keys
from backfill_platform.checks.results import failed_partitions_by_check
from backfill_platform.partitions import daily_partitions
from backfill_platform.resources import LandingZoneResource
from backfill_platform.resources.landing import FX_RATES, ORDERS
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG, TRIGGER_TAG
from backfill_platform.settings import PARTITIONS_PER_RUN, setting
from backfill_platform.tables import CUSTOMER_LTV, RAW_FX_RATES, RAW_ORDERS, STAGING_ORDERS

WINDOW_DAYS_ENV = "BACKFILL_LIVE_WINDOW_DAYS"
AUTO_REPAIR_ENV = "BACKFILL_AUTO_REPAIR_STALE"
AUDIT_INTERVAL_ENV = "BACKFILL_STALENESS_AUDIT_SECONDS"
PARTITION_TAG = "dagster/partition"
ACTIVE_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def window_days() -> int:
    """N of the rolling window (env BACKFILL_LIVE_WINDOW_DAYS, default 3), read per tick."""
    return max(1, int(os.environ.get(WINDOW_DAYS_ENV, "3")))


def auto_repair() -> bool:
    return os.environ.get(AUTO_REPAIR_ENV, "false").strip().lower() in {"1", "true", "yes"}


def day_range(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def range_tags(first: date, last: date) -> dict[str, str]:
    return {RANGE_START_TAG: first.isoformat(), RANGE_END_TAG: last.isoformat()}


# -- what other runs are writing ------------------------------------------------------------
@dataclass(frozen=True)
class ActiveWrite:
    run_id: str
    days: frozenset[date]


def active_downstream_writes(instance: DagsterInstance) -> list[ActiveWrite]:
    """Queued or running runs that write staging or marts, with the days they cover.

    Backfill runs (launched from the UI or by `runner.backfill`) carry the same range or
    partition tags as the live path's runs, so one query finds every writer.
    """
    writes = []
    for record in instance.get_run_records(RunsFilter(statuses=ACTIVE_STATUSES)):
        run = record.dagster_run
        selection = run.asset_selection
        if selection is not None and not set(selection) & set(DOWNSTREAM_KEYS):
            continue
        if selection is None and run.job_name == raw_ingest_job.name:
            continue
        tags = run.tags
        if RANGE_START_TAG in tags and RANGE_END_TAG in tags:
            first, last = tags[RANGE_START_TAG], tags[RANGE_END_TAG]
        elif PARTITION_TAG in tags:
            first = last = tags[PARTITION_TAG]
        else:
            continue
        days = day_range(date.fromisoformat(first), date.fromisoformat(last))
        writes.append(ActiveWrite(run.run_id, frozenset(days)))
    return writes


def blocked_days(instance: DagsterInstance) -> dict[date, str]:
    return {d: w.run_id for w in active_downstream_writes(instance) for d in w.days}


# -- landing -------------------------------------------------------------------------------
def delivery_fingerprints(landing: LandingZoneResource) -> dict[str, str]:
    """Ingest day -> hash of its files (kind, name, size, mtime) for both kinds of delivery."""
    first = daily_partitions.start.date().isoformat()
    last = daily_partitions.get_last_partition_key()
    days = sorted(set(landing.delivered_days(ORDERS)) | set(landing.delivered_days(FX_RATES)))
    fingerprints = {}
    for day in days:
        if not (first <= day <= (last or "")):
            continue  # not a partition yet (today) or before the start: picked up later
        entries = []
        for kind in (ORDERS, FX_RATES):
            for path in landing.files(kind, [day]):
                stat = path.stat()
                entries.append(f"{kind}/{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
        if entries:
            fingerprints[day] = hashlib.sha1("\n".join(entries).encode()).hexdigest()[:16]
    return fingerprints


def already_ingested(instance: DagsterInstance, landing: LandingZoneResource, day: str) -> bool:
    """Whether a raw run that started after the day's newest file materialized that day."""
    for key, kind in ((RAW_ORDERS, ORDERS), (RAW_FX_RATES, FX_RATES)):
        files = landing.files(kind, [day])
        if not files:
            continue
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=1
        ).records
        if not records:
            return False
        run = instance.get_run_record_by_id(records[0].run_id)
        newest = max(p.stat().st_mtime for p in files)
        if run is None or run.start_time is None or run.start_time <= newest:
            return False
    return True


def ranges_of(days: Sequence[str], per_run: int) -> list[tuple[str, str]]:
    """Consecutive days grouped into ranges of at most per_run days."""
    groups: list[list[str]] = []
    for day in sorted(days):
        previous = groups[-1][-1] if groups else None
        follows = previous and date.fromisoformat(day) - date.fromisoformat(previous) == timedelta(
            days=1
        )
        if follows and len(groups[-1]) < per_run:
            groups[-1].append(day)
        else:
            groups.append([day])
    return [(g[0], g[-1]) for g in groups]


@sensor(
    job=raw_ingest_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Requests raw ingestion of new or changed landing days (one run per delivery).",
)
def landing_sensor(context: SensorEvaluationContext, landing: LandingZoneResource):
    """The cursor holds each day's delivery fingerprint; the run key repeats it, so the same
    delivery is never requested twice even if the cursor were lost. On the first tick, days
    a raw run already ingested after their last file landed are taken as they are."""
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    current = delivery_fingerprints(landing)
    changed = [d for d, fp in current.items() if seen.get(d) != fp]
    if context.cursor is None:
        changed = [d for d in changed if not already_ingested(context.instance, landing, d)]
    requests = []
    for first, last in ranges_of(changed, int(setting(PARTITIONS_PER_RUN))):
        days = [
            d.isoformat() for d in day_range(date.fromisoformat(first), date.fromisoformat(last))
        ]
        delivery = hashlib.sha1("|".join(f"{d}={current[d]}" for d in days).encode()).hexdigest()
        requests.append(
            RunRequest(
                run_key=f"landing:{first}..{last}:{delivery[:16]}",
                tags={
                    **range_tags(date.fromisoformat(first), date.fromisoformat(last)),
                    TRIGGER_TAG: "landing",
                },
            )
        )
    if not requests:
        return SensorResult(
            skip_reason=SkipReason(f"no new or changed deliveries in {len(current)} days"),
            cursor=json.dumps(current, sort_keys=True),
        )
    context.log.info(f"requesting raw ingestion of {changed}")
    return SensorResult(run_requests=requests, cursor=json.dumps(current, sort_keys=True))


# -- rolling window ------------------------------------------------------------------------
def latest_partition(instance: DagsterInstance, key) -> date | None:
    keys = instance.get_materialized_partitions(key)
    return date.fromisoformat(max(keys)) if keys else None


def live_window(instance: DagsterInstance, n_days: int | None = None) -> tuple[date, date] | None:
    """The last N event days, ending at the newest ingested raw day."""
    anchor = latest_partition(instance, RAW_ORDERS)
    if anchor is None:
        return None
    first = max(
        anchor - timedelta(days=(n_days or window_days()) - 1), daily_partitions.start.date()
    )
    return first, anchor


def new_raw_materializations(instance: DagsterInstance, after: int | None):
    records = []
    for key in RAW_KEYS:
        cursor = None
        while True:
            result = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=key, after_storage_id=after),
                limit=1000,
                cursor=cursor,
                ascending=True,
            )
            records.extend(result.records)
            if not result.has_more:
                break
            cursor = result.cursor
    return records


@sensor(
    job=rolling_window_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="After raw ingests, rebuilds staging and marts over the last N event days.",
)
def rolling_window_sensor(context: SensorEvaluationContext):
    """One ranged run per tick over the last N days (env BACKFILL_LIVE_WINDOW_DAYS, default 3).

    Days a queued or running run is already writing downstream are never requested: the
    window shrinks to the days after them, or the tick waits (cursor kept) when none remain.
    """
    instance = context.instance
    after = int(context.cursor) if context.cursor else None
    records = new_raw_materializations(instance, after)
    if not records:
        return SkipReason("no raw materializations since the last tick")
    newest = max(r.storage_id for r in records)
    window = live_window(instance)
    if window is None:
        return SkipReason("raw/orders has never been materialized")
    first, last = window
    relevant = [r for r in records if r.partition_key and r.partition_key >= first.isoformat()]
    if not relevant:
        return SensorResult(
            skip_reason=SkipReason(f"new raw partitions are all before the window {first}..{last}"),
            cursor=str(newest),
        )

    # Raw days whose latest blocking check failed are not consumed: hold (cursor kept).
    held = {
        day: checks
        for day, checks in failed_partitions_by_check(
            instance, blocking_check_keys(RAW_ORDERS)
        ).items()
        if first.isoformat() <= day <= last.isoformat()
    }
    if held:
        return SkipReason(f"holding: raw/orders partitions failed blocking checks {held}")

    # customer_ltv of `first` needs the snapshot before it: reach back over any unbuilt days
    # and over snapshots whose blocking check failed (they are rebuilt, never built upon).
    built_ltv = set(instance.get_materialized_partitions(CUSTOMER_LTV)) - set(
        failed_partitions_by_check(instance, blocking_check_keys(CUSTOMER_LTV))
    )
    start = daily_partitions.start.date()
    while first > start and (first - timedelta(days=1)).isoformat() not in built_ltv:
        first -= timedelta(days=1)
        if (last - first).days >= int(setting(PARTITIONS_PER_RUN)):
            return SkipReason(
                f"customer_ltv has no snapshots before {last} within one run; backfill first"
            )

    blocked = {d: r for d, r in blocked_days(instance).items() if first <= d <= last}
    if blocked:
        first = max(blocked) + timedelta(days=1)
        if first > last:
            runs = sorted(set(blocked.values()))
            return SkipReason(f"window days are being written by run(s) {runs}; waiting")
    reacts_to = sorted({r.partition_key for r in relevant})
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"window:{first}..{last}:{newest}",
                tags={
                    **range_tags(first, last),
                    TRIGGER_TAG: "rolling-window",
                    REACTS_TO_TAG: f"raw up to storage id {newest}: {','.join(reacts_to)[:200]}",
                },
            )
        ],
        cursor=str(newest),
    )


# -- staleness beyond the window -------------------------------------------------------------
def audit_interval_seconds() -> int:
    """How long a clean audit stands before changes trigger a new one (default 30 min)."""
    return int(os.environ.get(AUDIT_INTERVAL_ENV, "1800"))


def active_runs(instance: DagsterInstance, **filters) -> list[str]:
    records = instance.get_run_records(RunsFilter(statuses=ACTIVE_STATUSES, **filters))
    return [r.dagster_run.run_id for r in records]


def latest_write(instance: DagsterInstance) -> int:
    """Storage id of the newest materialization of any lakehouse table (0 if none)."""
    newest = 0
    for key in (*RAW_KEYS, *DOWNSTREAM_KEYS):
        records = instance.fetch_materializations(key, limit=1).records
        if records:
            newest = max(newest, records[0].storage_id)
    return newest


def latest_audit(instance: DagsterInstance):
    """The newest staleness audit observation on staging/orders, or None."""
    for record in instance.fetch_observations(STAGING_ORDERS, limit=20).records:
        observation = record.asset_observation
        if observation and AUDIT_MARKER in observation.metadata:
            return record
    return None


@sensor(
    jobs=[staleness_audit_job, repair_staging_job, repair_ltv_job],
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Audits built partitions for late rows beyond the window and offers repair.",
)
def stale_partitions_sensor(context: SensorEvaluationContext):
    """Spark-free: the scan happens in `staleness_audit_job` runs this sensor requests.

    When tables changed since the last audit it requests a new audit (at most every
    BACKFILL_STALENESS_AUDIT_SECONDS while nothing is stale). It acts only on an audit newer
    than every write: it reports the stale days with counts on every tick (the audit's
    observation on staging/orders holds them too), and with BACKFILL_AUTO_REPAIR_STALE=true
    requests the targeted backfill: first the stale staging/fct ranges, then, after the next
    audit sees them rebuilt, customer_ltv from the first stale snapshot on, so LTV never
    reads staging that is still being rewritten.
    """
    instance = context.instance
    changed = latest_write(instance)
    if not changed:
        return SkipReason("no lakehouse table has been written yet")
    audit = latest_audit(instance)
    report = (
        StalenessReport.from_metadata(
            {k: v.value for k, v in audit.asset_observation.metadata.items()}
        )
        if audit
        else None
    )
    if audit is None or audit.storage_id < changed:
        busy = active_runs(instance, job_name=staleness_audit_job.name) + active_runs(
            instance, tags={TRIGGER_TAG: "stale-repair"}
        )
        if busy:
            return SkipReason(f"waiting for run(s) {busy}")
        age = time.time() - audit.timestamp if audit else None
        if report is not None and not report.stale and age < audit_interval_seconds():
            return SkipReason(
                f"tables changed; next audit in {audit_interval_seconds() - age:.0f} s"
            )
        return RunRequest(
            run_key=f"audit:{changed}",
            job_name=staleness_audit_job.name,
            tags={TRIGGER_TAG: "staleness-audit"},
        )

    if not report.stale:
        return SkipReason("no stale partitions")
    window = live_window(instance)
    steps = report.plan(exclude=day_range(*window) if window else [])
    if not steps:
        return SkipReason(f"{report.summary()}: all inside the live window {window}")
    plan = "; ".join(s.describe() for s in steps)
    if not auto_repair():
        return SkipReason(
            f"STALE: {report.summary()}. Targeted backfill: {plan}. "
            f"Run `{REPAIR_COMMAND}` or set {AUTO_REPAIR_ENV}=true."
        )
    if context.cursor == str(audit.storage_id):
        return SkipReason(f"repair of audit {audit.storage_id} already requested: {plan}")
    phase = [s for s in steps if s.kind == STAGING_STEP] or steps[-1:]
    writing = blocked_days(instance)
    busy = sorted({writing[d] for s in phase for d in day_range(s.first, s.last) if d in writing})
    if busy:
        return SkipReason(f"stale days are being written by run(s) {busy}; waiting")
    context.log.info(f"{report.summary()}; requesting {[s.describe() for s in phase]}")
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"repair:{s.kind}:{s.first}..{s.last}:audit-{audit.storage_id}",
                job_name=(repair_staging_job if s.kind == STAGING_STEP else repair_ltv_job).name,
                tags={**range_tags(s.first, s.last), TRIGGER_TAG: "stale-repair"},
            )
            for s in phase
        ],
        cursor=str(audit.storage_id),
    )


all_sensors = [landing_sensor, rolling_window_sensor, stale_partitions_sensor]
