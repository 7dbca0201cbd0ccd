"""Decommission: drop a shadow and VACUUM the old files of the tables it was cut over into,
once the retention window after the cutover has passed, never earlier.

Until then the shadow and production's pre-cutover files are the way back (rollback); after
VACUUM the pre-cutover version is gone and rollback refuses, saying so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from backfill_platform.operations.arguments import check_retention_hours
from backfill_platform.operations.cutover import CUTOVER
from backfill_platform.resources import LakehouseResource
from backfill_platform.tables import TABLES, check_shadow_suffix


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


def decommission(
    lake: LakehouseResource,
    suffix: str,
    retention_hours: float,
    now: datetime | None = None,
) -> Decommission:
    suffix = check_shadow_suffix(suffix)
    check_retention_hours(retention_hours)
    now = now or datetime.now(UTC)
    shadows = lake.shadows(suffix)
    if not shadows:
        raise DecommissionRefused(f"no shadow tables with suffix {suffix!r}")
    cut = {
        t.name: c["timestamp"]
        for t in TABLES
        for c in lake.history(t.name)
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
    dropped = lake.drop_shadows(suffix)
    vacuumed = sorted(cut)
    # Our window (checked against the cutover time above) replaces Delta's 7-day check.
    for table in vacuumed:
        lake.vacuum(table, retention_hours)
    return Decommission(
        suffix, dropped, vacuumed, retention_hours, last.isoformat() if last else None
    )
