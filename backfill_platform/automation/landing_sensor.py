"""The landing sensor: one raw ingestion run per new or changed delivery.

Spark-free: it lists the landing zone and reads the instance; raw ingestion itself runs in
the requested `raw_ingest_job` runs.
"""

import hashlib
import json

from dagster import (
    AssetRecordsFilter,
    DagsterInstance,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from backfill_platform.automation.freeze import frozen_days
from backfill_platform.automation.live_jobs import raw_ingest_job
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange, ranges_of
from backfill_platform.resources import LandingZoneResource
from backfill_platform.resources.landing import FX_RATES, ORDERS
from backfill_platform.runner import TRIGGER_TAG, range_tags
from backfill_platform.settings import PARTITIONS_PER_RUN, setting
from backfill_platform.tables import RAW_FX_RATES, RAW_ORDERS

# Each raw table and the kind of landing delivery it ingests.
DELIVERIES = ((RAW_ORDERS, ORDERS), (RAW_FX_RATES, FX_RATES))
RAW_TABLES = tuple(key for key, _ in DELIVERIES)


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
            for file in landing.files(kind, [day]):
                entries.append(f"{kind}/{file.name}:{file.size}:{file.modified_ns}")
        if entries:
            fingerprints[day] = hashlib.sha1("\n".join(entries).encode()).hexdigest()[:16]
    return fingerprints


def already_ingested(instance: DagsterInstance, landing: LandingZoneResource, day: str) -> bool:
    """Whether a raw run that started after the day's newest file materialized that day."""
    for key, kind in DELIVERIES:
        files = landing.files(kind, [day])
        if not files:
            continue
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=1
        ).records
        if not records:
            return False
        run = instance.get_run_record_by_id(records[0].run_id)
        newest = max(f.modified_ns for f in files) / 1e9
        if run is None or run.start_time is None or run.start_time <= newest:
            return False
    return True


def incomplete_days(landing: LandingZoneResource, days: list[str]) -> dict[str, str]:
    """Day -> the kind still missing, for days whose delivery may not be complete yet.

    The contract has no completion marker, FX has no file on weekends, and a day may have
    no orders at all. So the newest delivered day waits only while it has FX rates and no
    orders yet; any earlier day is complete (the sources have moved on; files arriving
    later are a changed delivery and are ingested again). This keeps a raw run, and the
    window run after it, from building a day whose FX landed before its orders.
    """
    orders, fx = set(landing.delivered_days(ORDERS)), set(landing.delivered_days(FX_RATES))
    newest = max(orders | fx, default="")
    return {day: ORDERS for day in days if day == newest and day in fx and day not in orders}


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
    # Day -> why it waits. A delivery into a day under correction waits for the correction,
    # like an incomplete one: it is ingested after cutover, rollback or unfreeze.
    waiting = {d: f"{kind} not landed yet" for d, kind in incomplete_days(landing, changed).items()}
    frozen = (
        frozen_days(context.instance, RAW_TABLES, DayRange(min(changed), max(changed)))
        if changed
        else {}
    )
    held = {day: f"frozen by {frozen[day].freeze_id}" for day in changed if day in frozen}
    waiting.update(held)
    changed = [d for d in changed if d not in waiting]
    # Waiting days keep their old fingerprint, so they are requested once complete.
    cursor = {**current, **{d: seen[d] for d in waiting if d in seen}}
    for day in waiting:
        if day not in seen:
            cursor.pop(day)
    waits = "; ".join(f"{d}: {why}" for d, why in sorted(waiting.items()))
    per_run = int(setting(PARTITIONS_PER_RUN))
    requests = []
    for days in (chunk for span in ranges_of(changed) for chunk in span.chunks(per_run)):
        keys = days.partition_keys()
        delivery = hashlib.sha1("|".join(f"{d}={current[d]}" for d in keys).encode()).hexdigest()
        requests.append(
            RunRequest(
                run_key=f"landing:{days}:{delivery[:16]}",
                tags={**range_tags(days), TRIGGER_TAG: "landing"},
            )
        )
    if not requests:
        if held:
            reason = f"waiting for deliveries to complete or freezes to lift: {waits}"
        elif waiting:
            reason = f"waiting for the day's delivery to complete: {waits}"
        else:
            reason = f"no new or changed deliveries in {len(current)} days"
        return SensorResult(
            skip_reason=SkipReason(reason),
            cursor=json.dumps(cursor, sort_keys=True),
        )
    context.log.info(f"requesting raw ingestion of {changed}" + (f"; {waits}" if waits else ""))
    return SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))
