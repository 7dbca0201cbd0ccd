"""Decommission: drop a shadow and VACUUM the old files of the tables it was cut over into,
once the retention window after the cutover has passed, never earlier.

Until then the shadow and production's pre-cutover files are the way back (rollback); after
VACUUM the pre-cutover version is gone and rollback refuses, saying so.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from backfill_platform.operations.cutover import CUTOVER
from backfill_platform.reconcile import TABLES
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.lakehouse import shadow_name


class DecommissionRefused(Exception):
    """Nothing was dropped or vacuumed."""


@dataclass
class Decommission:
    suffix: str
    dropped: list[str]
    vacuumed: list[str]
    retention_hours: float
    last_cutover_at: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def shadow_tables(lake: LakehouseResource, suffix: str) -> list[str]:
    root = Path(lake.root_dir).resolve()
    return [shadow_name(t, suffix) for t in TABLES if (root / shadow_name(t, suffix)).is_dir()]


def decommission(
    lake: LakehouseResource,
    suffix: str,
    retention_hours: float,
    now: datetime | None = None,
) -> Decommission:
    now = now or datetime.now(UTC)
    shadows = shadow_tables(lake, suffix)
    if not shadows:
        raise DecommissionRefused(f"no shadow tables with suffix {suffix!r}")
    cut = {
        t: c["timestamp"]
        for t in TABLES
        for c in lake.history(t)
        if c["metadata"].get("operation") == CUTOVER
        and c["metadata"].get("shadow_suffix") == suffix
    }
    last = max(cut.values(), default=None)
    if last is not None:
        last = last if last.tzinfo else last.replace(tzinfo=UTC)
        ends = last + timedelta(hours=retention_hours)
        if now < ends:
            raise DecommissionRefused(
                f"shadow {suffix!r} was cut over at {last.isoformat()}; its retention window "
                f"of {retention_hours:g} h ends at {ends.isoformat()}. Nothing dropped."
            )
    root = Path(lake.root_dir).resolve()
    for name in shadows:
        with lake.table_lock(name):
            shutil.rmtree(root / name)
    vacuumed = sorted(cut)
    # Our window (checked against the cutover time above) replaces Delta's 7-day check.
    for table in vacuumed:
        lake.vacuum(table, retention_hours)
    return Decommission(
        suffix, shadows, vacuumed, retention_hours, last.isoformat() if last else None
    )
