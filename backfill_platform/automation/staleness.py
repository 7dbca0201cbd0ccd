"""Late rows beyond the rolling window: find every partition built before its data arrived.

A partition is stale when what it was built from has changed since:
- staging/orders of event day D is stale when raw holds valid rows of D that staging has not
  counted. Staging stores `raw_versions` (valid raw rows per order), so comparing per-day row
  counts compares content, not clocks: a backfill that re-ingests identical raw rows (new
  `_loaded_at`, same lines) does not make anything stale; one late line does.
- marts/fct_daily_revenue of D is stale when its last build is older than staging D's.
- marts/customer_ltv is cumulative: snapshot D is stale when it is older than staging D or
  than snapshot D-1, and everything after the first stale snapshot must be rebuilt too.

Build times come from the Delta log (every commit carries its partition range), not from
Dagster's event log, because the table is the truth about which commit wrote a partition.

This module finds and reports; `stale_repair` runs the repair in process, the staleness
sensor requests it from the daemon. `backfill-platform stale` prints the report, `--repair`
runs the targeted backfill in order (staging and daily revenue of the stale days, then LTV).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime

from pyspark.sql import functions as F

from backfill_platform.partitions import commit_partition_keys
from backfill_platform.ranges import DayRange, ranges_of
from backfill_platform.resources import LakehouseResource
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    RAW_ORDERS,
    STAGING_ORDERS,
    STAGING_REJECTS,
    table,
)
from backfill_platform.transforms.fx import known_currencies
from backfill_platform.transforms.orders import with_unknown_currency

# As a new shell runs it from the repository (README): `backfill-platform` is on the PATH only
# in an activated venv.
REPAIR_COMMAND = 'make cli ARGS="stale --repair"'
STAGING_STEP = "staging+fct"
LTV_STEP = "customer_ltv"


@dataclass(frozen=True)
class RepairStep:
    """One ranged run of the targeted backfill; steps run in list order."""

    kind: str  # STAGING_STEP or LTV_STEP
    first: date
    last: date

    @property
    def keys(self):
        if self.kind == STAGING_STEP:
            return (STAGING_ORDERS, STAGING_REJECTS, FCT_DAILY_REVENUE)
        return (CUSTOMER_LTV,)

    @property
    def days(self) -> DayRange:
        return DayRange.of_days(self.first, self.last)

    def describe(self) -> str:
        return f"{self.kind} {self.first}..{self.last}"


@dataclass
class StalenessReport:
    # event day -> valid raw rows not reflected in staging (negative: staging counts rows
    # raw no longer has, which also needs a rebuild)
    staging: dict[date, int] = field(default_factory=dict)
    fct: list[date] = field(default_factory=list)
    ltv_from: date | None = None
    ltv_through: date | None = None

    @property
    def stale(self) -> bool:
        return bool(self.staging or self.fct or self.ltv_from)

    def stale_days(self) -> list[date]:
        return sorted(set(self.staging) | set(self.fct))

    def plan(self, exclude: Iterable[date] = ()) -> list[RepairStep]:
        """The targeted backfill: contiguous runs of stale staging/fct days, then LTV.

        `exclude` (the live window) is left to the rolling window; LTV still restarts at the
        first stale day, because every later snapshot carries that day's orders.
        """
        excluded = set(exclude)
        days = [d for d in self.stale_days() if d not in excluded]
        steps = [RepairStep(STAGING_STEP, a, b) for a, b in consecutive_spans(days)]
        ltv_start = min([*days, *([self.ltv_from] if self.ltv_from else [])], default=None)
        if ltv_start and self.ltv_through and ltv_start <= self.ltv_through:
            steps.append(RepairStep(LTV_STEP, ltv_start, self.ltv_through))
        return steps

    def metadata(self) -> dict[str, object]:
        return {
            "stale_days": {d.isoformat(): n for d, n in sorted(self.staging.items())},
            "stale_rows": sum(abs(n) for n in self.staging.values()),
            "stale_fct_days": [d.isoformat() for d in self.fct],
            "customer_ltv_stale_from": _iso(self.ltv_from),
            "customer_ltv_through": _iso(self.ltv_through),
            "repair_plan": [s.describe() for s in self.plan()],
            "repair_command": REPAIR_COMMAND if self.stale else None,
        }

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, object]) -> StalenessReport:
        """The report back from an audit's observation metadata (raw values)."""

        def day(text):
            return date.fromisoformat(text) if text else None

        return cls(
            staging={date.fromisoformat(d): int(n) for d, n in metadata["stale_days"].items()},
            fct=[date.fromisoformat(d) for d in metadata["stale_fct_days"]],
            ltv_from=day(metadata.get("customer_ltv_stale_from")),
            ltv_through=day(metadata.get("customer_ltv_through")),
        )

    def summary(self) -> str:
        if not self.stale:
            return "no stale partitions"
        parts = []
        if self.staging:
            days = ", ".join(f"{d} ({n:+d} rows)" for d, n in sorted(self.staging.items()))
            parts.append(f"staging/orders stale on {days}")
        if self.fct:
            parts.append("fct_daily_revenue older than staging on " + ", ".join(map(str, self.fct)))
        if self.ltv_from:
            parts.append(f"customer_ltv stale from {self.ltv_from} to {self.ltv_through}")
        return "; ".join(parts)


def _iso(day: date | None) -> str | None:
    return day.isoformat() if day else None


def consecutive_spans(days: Iterable[date]) -> list[tuple[date, date]]:
    """Days grouped into inclusive (first, last) runs of consecutive days, oldest first."""
    return [(span.first_day, span.last_day) for span in ranges_of(days)]


def last_built(lakehouse: LakehouseResource, key) -> dict[date, datetime]:
    """Event day -> time of the newest Delta commit that wrote its partition."""
    built: dict[date, datetime] = {}
    for commit in lakehouse.history(key):  # newest first
        for day in commit_partition_keys(commit["metadata"]):
            built.setdefault(date.fromisoformat(day), commit["timestamp"])
    return built


def detect(lakehouse: LakehouseResource) -> StalenessReport:
    """Compare raw with staging per event day, and each layer's build times with its inputs."""
    report = StalenessReport()
    if not lakehouse.exists(STAGING_ORDERS) or not lakehouse.exists(RAW_ORDERS):
        return report
    staging_built = last_built(lakehouse, STAGING_ORDERS)
    # Staging partitions on the event day raw rows carry, under the same column name.
    event_day = table(STAGING_ORDERS).partition_column
    raw = lakehouse.read(RAW_ORDERS).where(F.col("reject_reason").isNull())
    valid = with_unknown_currency(raw, known_currencies(lakehouse)).where(
        F.col("reject_reason").isNull()
    )
    raw_rows = {r[0]: r[1] for r in valid.groupBy(event_day).count().collect()}
    staged_rows = {
        r[0]: int(r[1])
        for r in lakehouse.read(STAGING_ORDERS)
        .groupBy(event_day)
        .agg(F.sum("raw_versions"))
        .collect()
    }
    for day in staging_built:
        diff = raw_rows.get(day, 0) - staged_rows.get(day, 0)
        if diff:
            report.staging[day] = diff

    fct_built = last_built(lakehouse, FCT_DAILY_REVENUE)
    report.fct = sorted(
        d for d, t in fct_built.items() if d in staging_built and t < staging_built[d]
    )

    ltv_built = last_built(lakehouse, CUSTOMER_LTV)
    if ltv_built:
        report.ltv_through = max(ltv_built)
        report.ltv_from = _first_stale_snapshot(ltv_built, staging_built)
    return report


def _first_stale_snapshot(
    ltv_built: Mapping[date, datetime], staging_built: Mapping[date, datetime]
) -> date | None:
    """The oldest snapshot built before its staging day or before the day before's snapshot.

    Only a built previous day counts: a run of consecutive snapshots starts fresh after a gap.
    """
    for span in ranges_of(ltv_built):
        previous = None
        for day in span.days():
            built = ltv_built[day]
            if (day in staging_built and built < staging_built[day]) or (
                previous and built < previous
            ):
                return day
            previous = built
    return None
