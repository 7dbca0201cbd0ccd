"""The rolling-window sensor: after raw ingests, one ranged rebuild of the last N event days.

Spark-free: it reads raw and LTV materializations, blocking check results and the runs in
progress from the instance; the rebuild runs in the requested `rolling_window_job` run.
"""

from collections.abc import Iterable
from datetime import date, timedelta

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

from backfill_platform.automation.active_runs import active_raw_writes, blocked_days
from backfill_platform.automation.freeze import frozen_days
from backfill_platform.automation.live_jobs import (
    DOWNSTREAM_KEYS,
    RAW_KEYS,
    REACTS_TO_TAG,
    rolling_window_job,
)
from backfill_platform.checks import blocking_check_keys
from backfill_platform.checks.results import failed_partitions_by_check
from backfill_platform.partitions import daily_partitions, in_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.runner import TRIGGER_TAG, range_tags
from backfill_platform.settings import LIVE_WINDOW_DAYS, PARTITIONS_PER_RUN, setting
from backfill_platform.tables import CUSTOMER_LTV, RAW_ORDERS, STAGING_ORDERS


def window_days() -> int:
    """N of the rolling window (BACKFILL_LIVE_WINDOW_DAYS), read per tick."""
    return max(1, int(setting(LIVE_WINDOW_DAYS)))


def latest_partition(instance: DagsterInstance, key) -> date | None:
    """The newest materialized day that is a partition (a stream batch may have reported a
    later one: today's messages)."""
    keys = in_partitions(instance.get_materialized_partitions(key))
    return date.fromisoformat(max(keys)) if keys else None


def live_window(instance: DagsterInstance, n_days: int | None = None) -> DayRange | None:
    """The last N event days, ending at the newest ingested raw day."""
    anchor = latest_partition(instance, RAW_ORDERS)
    if anchor is None:
        return None
    first = max(
        anchor - timedelta(days=(n_days or window_days()) - 1), daily_partitions.start.date()
    )
    return DayRange.of_days(first, anchor)


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


def rebuilt_since(instance: DagsterInstance, key, days: DayRange, after: int) -> set[str]:
    """Partitions of `days` materialized after storage id `after`."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(
            asset_key=key, asset_partitions=days.partition_keys(), after_storage_id=after
        ),
        limit=10 * len(days),
    ).records
    return {r.partition_key for r in records}


def reach_back_for_ltv(instance: DagsterInstance, first: str) -> str:
    """The day after the newest good customer_ltv snapshot before `first`, or the first
    partition: snapshot D is built on D-1's, so unbuilt days and snapshots whose blocking
    check failed (rebuilt, never built upon) are taken into the window."""
    built = set(instance.get_materialized_partitions(CUSTOMER_LTV)) - set(
        failed_partitions_by_check(instance, blocking_check_keys(CUSTOMER_LTV))
    )
    start = daily_partitions.start.date().isoformat()
    good = [key for key in built if start <= key < first]
    return DayRange.parse(max(good)).end.isoformat() if good else start


def days_after(window: DayRange, taken: Iterable[str]) -> DayRange | None:
    """The window's days after the last of `taken` (partition keys), None if none are."""
    rest = [day for day in window.partition_keys() if day > max(taken)]
    return DayRange(rest[0], window.last) if rest else None


@sensor(
    job=rolling_window_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="After raw ingests, rebuilds staging and marts over the last N event days.",
)
def rolling_window_sensor(context: SensorEvaluationContext):
    """One ranged run per tick over the last N days (BACKFILL_LIVE_WINDOW_DAYS, default 3).

    Days a queued or running run is already writing downstream are never requested: the
    window shrinks to the days after them, or the tick waits (cursor kept) when none remain.
    While a raw run over window days is queued or running the tick waits too (cursor kept):
    its FX may be recorded before its orders, and the window must see both.
    """
    instance = context.instance
    after = int(context.cursor) if context.cursor else None
    records = new_raw_materializations(instance, after)
    if not records:
        return SkipReason("no raw materializations since the last tick")
    newest = max(r.storage_id for r in records)
    live = live_window(instance)
    if live is None:
        return SkipReason(f"{RAW_ORDERS.to_user_string()} has never been materialized")
    relevant = [r for r in records if r.partition_key and r.partition_key >= live.first]
    if not relevant:
        return SensorResult(
            skip_reason=SkipReason(f"new raw partitions are all before the window {live}"),
            cursor=str(newest),
        )

    # Already built after the raw it reacts to (a UI backfill of every layer, or `make ui`
    # starting over a built demo): a window run would only repeat it.
    newest_relevant = max(r.storage_id for r in relevant)
    if all(
        set(live.partition_keys()) <= rebuilt_since(instance, key, live, newest_relevant)
        for key in (STAGING_ORDERS, CUSTOMER_LTV)
    ):
        return SensorResult(
            skip_reason=SkipReason(f"window {live} already built after its raw"),
            cursor=str(newest),
        )

    # Raw days whose latest blocking check failed are not consumed: hold (cursor kept).
    held = {
        day: checks
        for day, checks in failed_partitions_by_check(
            instance, blocking_check_keys(RAW_ORDERS)
        ).items()
        if day in live
    }
    if held:
        return SkipReason(
            f"holding: {RAW_ORDERS.to_user_string()} partitions failed blocking checks {held}"
        )

    # A raw run still going may have recorded FX of a day but not its orders yet.
    ingesting = sorted({w.run_id for w in active_raw_writes(instance) if w.days.last >= live.first})
    if ingesting:
        return SkipReason(f"waiting for raw ingestion run(s) {ingesting} of window days")

    first = reach_back_for_ltv(instance, live.first)
    window = DayRange(first, live.last)
    if first < live.first and len(window) > int(setting(PARTITIONS_PER_RUN)):
        return SkipReason(
            f"customer_ltv has no snapshots before {live.last} within one run; backfill first"
        )

    blocked = {day: run for day, run in blocked_days(instance).items() if day in window}
    if blocked:
        rest = days_after(window, blocked)
        if rest is None:
            runs = sorted(set(blocked.values()))
            return SkipReason(f"window days are being written by run(s) {runs}; waiting")
        window = rest

    # Days under correction are left to the correction: the window shrinks to the days
    # after them, or the tick waits (cursor kept) until cutover, rollback or unfreeze.
    frozen = frozen_days(instance, DOWNSTREAM_KEYS, window)
    if frozen:
        named = "; ".join(sorted({f"{f.freeze_id} ({f.reason})" for f in frozen.values()}))
        rest = days_after(window, frozen)
        if rest is None:
            return SkipReason(f"window {window} is frozen by {named}; leaving it alone")
        context.log.info(f"leaving frozen days {min(frozen)}..{max(frozen)} alone: {named}")
        window = rest
    reacts_to = sorted({r.partition_key for r in relevant})
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"window:{window}:{newest}",
                tags={
                    **range_tags(window),
                    TRIGGER_TAG: "rolling-window",
                    REACTS_TO_TAG: f"raw up to storage id {newest}: {','.join(reacts_to)[:200]}",
                },
            )
        ],
        cursor=str(newest),
    )
