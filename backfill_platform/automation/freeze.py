"""Freeze: the partitions a correction will rewrite, marked as under correction until its
cutover, its rollback or an unfreeze.

A freeze is an asset observation per affected asset, in the Dagster instance rather than the
lakehouse: the live path's sensors that must leave frozen days alone are Spark-free and read
only the instance; the UI shows each observation on the asset's page with its reason and the
Delta version consumers should read meanwhile (`versionAsOf`, the version before the
correction); and lifting a freeze is a later observation of the same freeze id, so the
instance keeps the whole story and nothing is deleted.
"""

from __future__ import annotations

import getpass
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from dagster import AssetKey, AssetObservation, DagsterInstance, EventLogRecord, MetadataValue

from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource

FREEZE_ID = "freeze_id"
FROZEN = "frozen"
# Observations of an asset read per query while looking for its freezes.
OBSERVATIONS_PER_PAGE = 1000


class FreezeRefused(ValueError):
    """An unfreeze that names no active freeze: nothing is recorded."""


@dataclass(frozen=True)
class Freeze:
    freeze_id: str
    asset_key: AssetKey
    days: DayRange
    reason: str
    as_of_version: int | None
    by: str
    at: float

    def describe(self) -> str:
        read = (
            f"read versionAsOf {self.as_of_version} meanwhile"
            if self.as_of_version is not None
            else "no table yet"
        )
        return (
            f"{self.asset_key.to_user_string()} {self.days} frozen by {self.freeze_id} "
            f"({self.reason}; {self.by}): {read}"
        )

    def to_dict(self) -> dict:
        return {
            "freeze_id": self.freeze_id,
            "asset": self.asset_key.to_user_string(),
            "first": self.days.first,
            "last": self.days.last,
            "reason": self.reason,
            "as_of_version": self.as_of_version,
            "by": self.by,
            "at": self.at,
        }


def freeze(
    instance: DagsterInstance,
    lake: LakehouseResource,
    keys: Iterable[AssetKey],
    days: DayRange,
    reason: str,
    freeze_id: str | None = None,
) -> list[Freeze]:
    """Marks `days` of every asset in `keys` as under correction, pinning each table's
    current Delta version as the one consumers read until the freeze is lifted."""
    freeze_id = freeze_id or f"freeze-{uuid.uuid4().hex[:8]}"
    by, at = getpass.getuser(), time.time()
    made = [Freeze(freeze_id, key, days, reason, lake.current_version(key), by, at) for key in keys]
    for item in made:
        instance.report_runless_asset_event(
            AssetObservation(
                asset_key=item.asset_key,
                description=f"Under correction: {item.days} ({reason}). "
                + (
                    f"Until the correction is live, read versionAsOf {item.as_of_version}."
                    if item.as_of_version is not None
                    else "No table yet."
                ),
                metadata={
                    FREEZE_ID: freeze_id,
                    FROZEN: True,
                    "first_day": item.days.first,
                    "last_day": item.days.last,
                    "reason": reason,
                    "read_version_as_of": MetadataValue.int(item.as_of_version)
                    if item.as_of_version is not None
                    else MetadataValue.null(),
                    "by": by,
                },
            )
        )
    return made


def unfreeze(
    instance: DagsterInstance,
    keys: Iterable[AssetKey],
    why: str,
    freeze_id: str | None = None,
    days: DayRange | None = None,
) -> list[Freeze]:
    """Lifts the active freezes of `keys` with this id, or overlapping `days` (all of them
    when neither is given); refused, recording nothing, when none matches."""
    lifted = [
        item
        for item in active_freezes(instance, keys)
        if (freeze_id is None or item.freeze_id == freeze_id)
        and (days is None or item.days.overlaps(days))
    ]
    if not lifted:
        what = f"freeze {freeze_id}" if freeze_id else "freeze"
        where = f" overlapping {days}" if days else ""
        raise FreezeRefused(f"no active {what}{where} on the selected assets; nothing lifted")
    by = getpass.getuser()
    for item in lifted:
        instance.report_runless_asset_event(
            AssetObservation(
                asset_key=item.asset_key,
                description=f"Correction finished for {item.days}: {why}.",
                metadata={
                    FREEZE_ID: item.freeze_id,
                    FROZEN: False,
                    "first_day": item.days.first,
                    "last_day": item.days.last,
                    "reason": why,
                    "by": by,
                },
            )
        )
    return lifted


def lift_finished(
    instance: DagsterInstance, keys: Iterable[AssetKey], why: str, days: DayRange | None = None
) -> list[Freeze]:
    """What a cutover or rollback finished is no longer under correction; none is fine."""
    try:
        return unfreeze(instance, keys, why, days=days)
    except FreezeRefused:
        return []


def active_freezes(instance: DagsterInstance, keys: Iterable[AssetKey]) -> list[Freeze]:
    """Each asset's freezes whose newest observation still says frozen, oldest first."""
    found: list[Freeze] = []
    for key in keys:
        latest: dict[str, tuple[bool, Freeze | None]] = {}
        for record in _observations(instance, key):  # newest first: the first word wins
            meta = record.asset_observation.metadata
            if FREEZE_ID not in meta:
                continue
            freeze_id = meta[FREEZE_ID].value
            if freeze_id in latest:
                continue
            frozen = bool(meta[FROZEN].value)
            version = meta.get("read_version_as_of")
            latest[freeze_id] = (
                frozen,
                Freeze(
                    freeze_id,
                    key,
                    DayRange(meta["first_day"].value, meta["last_day"].value),
                    meta["reason"].value,
                    version.value if version is not None else None,
                    meta["by"].value,
                    record.timestamp,
                )
                if frozen
                else None,
            )
        found += [item for frozen, item in latest.values() if frozen and item is not None]
    return sorted(found, key=lambda item: item.at)


def _observations(instance: DagsterInstance, key: AssetKey) -> Iterator[EventLogRecord]:
    """Every observation of `key`, newest first: a freeze of six months ago still counts
    after thousands of staleness audits and plans observed on the same asset since."""
    cursor = None
    while True:
        page = instance.fetch_observations(key, limit=OBSERVATIONS_PER_PAGE, cursor=cursor)
        yield from page.records
        if not page.has_more:
            return
        cursor = page.cursor


def frozen_days(
    instance: DagsterInstance, keys: Iterable[AssetKey], days: DayRange | None = None
) -> dict[str, Freeze]:
    """The partition keys (of `days`, or all) that an active freeze of any of `keys` covers."""
    covered: dict[str, Freeze] = {}
    for item in active_freezes(instance, keys):
        for day in item.days.partition_keys():
            if days is None or day in days:
                covered.setdefault(day, item)
    return covered
