"""Whether anything *can* have gone stale since a point in the event log, from the instance.

The staleness audit scans raw and staging with Spark, in a run. Most writes cannot make a
built partition stale, and an audit run per write crowded the two run slots (a 3-day
backfill drew 10 audits of 55-125 s each). So the sensor first asks the instance, which is
cheap and Spark-free, and requests an audit only when one of these holds for a write after
the last clean look:

- a raw/orders ingest day with late rows (`late_rows` metadata > 0) reaches, through the
  late-arrival partition mapping, staging days that were built before it and not since
  (days inside the live window are the window run's);
- a staging day was rebuilt and its daily revenue or customer_ltv snapshot was not
  rebuilt after it, or a customer_ltv snapshot was rebuilt and the next one was not;
- the known currencies (`reference/fx_currencies`) changed.

A raw materialization without `late_rows` metadata (written by other code) counts as late.
"""

from __future__ import annotations

from collections.abc import Iterable

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from backfill_platform.assets import all_assets
from backfill_platform.assets.reference import FX_CURRENCIES
from backfill_platform.lineage import Lineage, downstream_keys
from backfill_platform.partitions import in_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.tables import CUSTOMER_LTV, FCT_DAILY_REVENUE, RAW_ORDERS, STAGING_ORDERS

_LINEAGE = Lineage(all_assets)
_LATE_ARRIVALS = next(e for e in _LINEAGE.children(RAW_ORDERS) if e.child == STAGING_ORDERS)


def _records(instance: DagsterInstance, key: AssetKey, after: int, partitions=None):
    """Every materialization of `key` after storage id `after`, oldest first."""
    cursor, records = None, []
    while True:
        result = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, after_storage_id=after, asset_partitions=partitions),
            limit=1000,
            cursor=cursor,
            ascending=True,
        )
        records.extend(result.records)
        if not result.has_more:
            return records
        cursor = result.cursor


def _latest(records: Iterable) -> dict[str, int]:
    latest: dict[str, int] = {}
    for record in records:
        if record.partition_key:
            latest[record.partition_key] = max(
                latest.get(record.partition_key, 0), record.storage_id
            )
    return latest


def _late_rows(record) -> int:
    materialization = record.asset_materialization
    value = materialization.metadata.get("late_rows") if materialization else None
    return 1 if value is None else int(value.value)


def stale_signals(instance: DagsterInstance, since: int, window: DayRange | None) -> list[str]:
    """Why an audit could find something stale in writes after storage id `since` (empty:
    nothing can be). Partitions inside `window` are left to the rolling window."""
    inside = set(window.partition_keys()) if window else set()
    reasons: list[str] = []

    staging_built = set(instance.get_materialized_partitions(STAGING_ORDERS))
    ingested = _records(instance, RAW_ORDERS, since)
    days = set(in_partitions(r.partition_key for r in ingested))
    late = [r for r in ingested if r.partition_key in days and _late_rows(r)]
    reaches = {
        r.storage_id: downstream_keys(_LATE_ARRIVALS, [r.partition_key]) & staging_built - inside
        for r in late
    }
    wanted = sorted(set().union(*reaches.values())) if reaches else []
    first = min(reaches, default=since)
    staging_latest = _latest(_records(instance, STAGING_ORDERS, first, wanted)) if wanted else {}
    for raw in late:
        behind = sorted(
            d for d in reaches[raw.storage_id] if staging_latest.get(d, 0) < raw.storage_id
        )
        if behind:
            reasons.append(
                f"raw/orders {raw.partition_key} has late rows for staging days built "
                f"before it: {behind[0]}..{behind[-1]}"
            )
            break  # one reason is enough to audit

    staged = _latest(_records(instance, STAGING_ORDERS, since))
    staged = {day: sid for day, sid in staged.items() if day not in inside}
    for key in (FCT_DAILY_REVENUE, CUSTOMER_LTV):
        built = set(instance.get_materialized_partitions(key))
        after = _latest(
            _records(instance, key, min(staged.values(), default=since), sorted(staged))
        )
        behind = sorted(d for d, sid in staged.items() if d in built and after.get(d, 0) < sid)
        if behind:
            reasons.append(
                f"{key.to_user_string()} older than staging on {len(behind)} day(s) "
                f"from {behind[0]}"
            )

    ltv_built = set(instance.get_materialized_partitions(CUSTOMER_LTV))
    rebuilt_ltv = _latest(_records(instance, CUSTOMER_LTV, since))
    nexts = {DayRange.parse(day).end.isoformat(): sid for day, sid in rebuilt_ltv.items()}
    nexts = {day: sid for day, sid in nexts.items() if day in ltv_built and day not in inside}
    later = _latest(
        _records(instance, CUSTOMER_LTV, min(nexts.values(), default=since), sorted(nexts))
    )
    behind = sorted(d for d, sid in nexts.items() if later.get(d, 0) < sid)
    if behind:
        reasons.append(f"customer_ltv snapshot {behind[0]} older than the snapshot before it")

    observed = instance.fetch_observations(FX_CURRENCIES, limit=2).records
    if observed and observed[0].storage_id > since:
        codes = [r.asset_observation.metadata.get("currencies") for r in observed]
        if len(codes) == 1 or codes[0] != codes[1]:
            reasons.append("the known currencies changed")
    return reasons
