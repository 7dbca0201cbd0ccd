"""Decommission: drop a shadow and VACUUM the old files of the tables it was cut over into,
once the retention window after the cutover has passed, never earlier.

Until then the shadow and production's pre-cutover files are the way back (rollback). The
VACUUM keeps production's configured history (BACKFILL_VACUUM_RETENTION_HOURS): dropping a
shadow never shortens what every rollback and "as of" read of production depends on, unless
the operator asks for a shorter window and says `shorten_history`; without it such a request
is refused, naming the versions it would make unreadable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from backfill_platform.operations.arguments import check_retention_hours
from backfill_platform.operations.cutover import CUTOVER
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.maintenance import drop_shadows, vacuum
from backfill_platform.settings import VACUUM_RETENTION_HOURS, setting
from backfill_platform.tables import TABLES, check_shadow_suffix


class DecommissionRefused(Exception):
    """Nothing was dropped or vacuumed."""


@dataclass
class Decommission:
    suffix: str
    dropped: list[str]
    vacuumed: list[str]
    retention_hours: float
    vacuum_retention_hours: float
    last_cutover_at: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def decommission(
    lake: LakehouseResource,
    suffix: str,
    retention_hours: float,
    now: datetime | None = None,
    vacuum_retention_hours: float | None = None,
    shorten_history: bool = False,
) -> Decommission:
    """Drop shadow `suffix` once `retention_hours` have passed since its last cutover, then
    VACUUM the tables it was cut over into, keeping `vacuum_retention_hours` of their
    history (default and floor: BACKFILL_VACUUM_RETENTION_HOURS; below it only with
    `shorten_history`)."""
    suffix = check_shadow_suffix(suffix)
    check_retention_hours(retention_hours)
    configured = float(setting(VACUUM_RETENTION_HOURS))
    keep = (
        configured
        if vacuum_retention_hours is None
        else check_retention_hours(vacuum_retention_hours, "--vacuum-retention-hours")
    )
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
        last = _utc(last)
        ends = last + timedelta(hours=retention_hours)
        if now < ends:
            raise DecommissionRefused(
                f"shadow {suffix!r} was cut over at {last.isoformat()}; its retention window "
                f"of {retention_hours:g} h ends at {ends.isoformat()}. Nothing dropped."
            )
    vacuumed = sorted(cut)
    if keep < configured and not shorten_history:
        lost = _versions_lost(lake, vacuumed, now - timedelta(hours=keep))
        raise DecommissionRefused(
            f"VACUUM keeping {keep:g} h is below production's retention of {configured:g} h "
            f"(BACKFILL_VACUUM_RETENTION_HOURS): {lost or 'no version yet, but later ones'} "
            "would no longer be restorable or readable as of their version. Pass "
            "--shorten-history to do it anyway. Nothing dropped or vacuumed."
        )
    dropped = drop_shadows(lake, suffix)
    # Our window replaces Delta's 7-day check; never below the configured one unless asked.
    for table in vacuumed:
        vacuum(lake, table, keep)
    return Decommission(
        suffix, dropped, vacuumed, retention_hours, keep, last.isoformat() if last else None
    )


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _versions_lost(lake: LakehouseResource, tables: list[str], before: datetime) -> str:
    """`marts/x versions 3..7 (2026-11-20..2026-11-24)` for the versions a VACUUM keeping
    only what is newer than `before` would leave without their files."""
    parts = []
    for name in tables:
        old = [c for c in lake.history(name) if _utc(c["timestamp"]) < before]
        if old:
            versions = sorted(c["version"] for c in old)
            days = sorted(_utc(c["timestamp"]).date().isoformat() for c in old)
            parts.append(f"{name} versions {versions[0]}..{versions[-1]} ({days[0]}..{days[-1]})")
    return "; ".join(parts)
