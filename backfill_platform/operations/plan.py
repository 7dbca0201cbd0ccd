"""Preflight plan: what a range will rewrite, whether its inputs exist, and who else is writing.

A plan is computed before anything runs: the blast radius from the asset graph, missing
inputs (`inputs.py`), sizes from the Delta snapshot, the code versions that wrote the
partitions and the one that will rewrite them, and in-progress runs over the same
partitions (`conflicts.py`). Missing inputs and conflicting runs block the plan unless
explicitly overridden.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from dagster import AssetKey, DagsterInstance
from pyspark.sql import functions as F

from backfill_platform.lineage import Lineage, blast_radius
from backfill_platform.operations.conflicts import conflicting_runs
from backfill_platform.operations.inputs import missing_inputs
from backfill_platform.ranges import DayRange, ranges_of
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.resources.crm import backfill_share
from backfill_platform.settings import (
    CRM_LIVE_RESERVE,
    CRM_RATE_LIMIT,
    fraction_setting,
    int_setting,
)
from backfill_platform.tables import RAW_CRM_HISTORY, RAW_ORDERS, STAGING_ORDERS, table
from backfill_platform.transforms.customers import customers_to_fetch


@dataclass
class AssetPlan:
    asset: str
    role: str  # "selected" (rewritten by the range) or "downstream" (rebuilt after it)
    partitions: list[str]
    ranges: list[tuple[str, str]]
    rows: int
    files: int
    bytes: int
    code_version_now: dict[str, int]  # code version -> partitions it wrote
    code_version_next: str | None
    mixed_code_versions: bool
    missing_inputs: list[str] = field(default_factory=list)
    # partitions outside the range that read rewritten ones: rebuilt after the cutover
    downstream_partitions: list[str] = field(default_factory=list)


@dataclass
class Plan:
    selection: list[str]
    start: str
    end: str
    assets: list[AssetPlan]
    conflicting_runs: list[dict]
    created_at: str
    # CRM calls the range will make (None: the CRM is not in the plan, or no orders are
    # built to count customers from) and the least time they take at the backfill share.
    crm_calls: int | None = None
    crm_backfill_rate: int | None = None
    crm_min_seconds: float | None = None

    @property
    def missing_inputs(self) -> list[str]:
        return [f"{a.asset}: {m}" for a in self.assets for m in a.missing_inputs]

    @property
    def ok(self) -> bool:
        return not self.missing_inputs and not self.conflicting_runs

    def blockers(self) -> list[str]:
        runs = [
            f"run {r['run_id'][:8]} is writing {', '.join(r['assets'])} {r['first']}..{r['last']}"
            for r in self.conflicting_runs
        ]
        return [f"missing input: {m}" for m in self.missing_inputs] + runs

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "blockers": self.blockers()}

    def markdown(self) -> str:
        lines = [
            f"### Backfill plan: {', '.join(self.selection)} {self.start}..{self.end}",
            "",
            f"**{'OK to run' if self.ok else 'BLOCKED'}** (planned {self.created_at})",
            "",
            "| asset | role | partitions | ranges | rows now | files | MB | written by | "
            "will write | mixed code |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for a in self.assets:
            ranges = ", ".join(f"{x}..{y}" for x, y in a.ranges[:4])
            if len(a.ranges) > 4:
                ranges += f" (+{len(a.ranges) - 4})"
            now = ", ".join(f"{v} ({n})" for v, n in sorted(a.code_version_now.items()))
            lines.append(
                f"| {a.asset} | {a.role} | {len(a.partitions)} | {ranges} | {a.rows:,} | "
                f"{a.files} | {a.bytes / 1e6:.2f} | {now or '-'} | {a.code_version_next} | "
                f"{'YES' if a.mixed_code_versions else 'no'} |"
            )
        if self.crm_calls is not None:
            lines += [
                "",
                f"CRM: {self.crm_calls:,} calls (customers without a kept answer covering "
                f"their orders), at least {self.crm_min_seconds:,.1f} s at the backfill share "
                f"of {self.crm_backfill_rate}/s",
            ]
        if self.blockers():
            lines += ["", "Blockers:", *(f"- {b}" for b in self.blockers()[:50])]
        return "\n".join(lines)


def build_plan(
    lake: LakehouseResource,
    landing: LandingZoneResource,
    instance: DagsterInstance | None,
    selection: list[AssetKey],
    first: str,
    last: str,
    *,
    lineage: Lineage,
    exclude_run_id: str | None = None,
) -> Plan:
    days = DayRange(first, last)
    in_range = days.partition_keys()
    selection = lineage.expand(selection)
    written = {key: lake.built_partitions(key) for key in lineage.toposorted()}
    radius = blast_radius(lineage, selection, first, last, lambda k: set(written[k]))
    assets = []
    for key in lineage.toposorted():
        if key not in radius:
            continue
        keys = sorted(radius[key])
        rows, files, size = _size(lake, key, keys)
        now = Counter(
            written[key][k].get("code_version") or "unknown" for k in keys if k in written[key]
        )
        range_versions = {
            written[key][k].get("code_version") or "unknown" for k in in_range if k in written[key]
        }
        selected = key in selection
        assets.append(
            AssetPlan(
                asset=key.to_user_string(),
                role="selected" if selected else "downstream",
                partitions=keys,
                ranges=[(r.first, r.last) for r in ranges_of(keys)],
                rows=rows,
                files=files,
                bytes=size,
                code_version_now=dict(now),
                code_version_next=table(key).code_version,
                mixed_code_versions=len(range_versions) > 1,
                missing_inputs=missing_inputs(
                    lake, landing, lineage, key, keys, selection, days, written
                )
                if selected
                else [],
                downstream_partitions=sorted(set(keys) - set(in_range)) if selected else keys,
            )
        )
    conflicts = conflicting_runs(instance, radius, exclude_run_id) if instance else []
    plan = Plan(
        selection=[k.to_user_string() for k in selection],
        start=first,
        end=last,
        assets=assets,
        conflicting_runs=conflicts,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    if RAW_CRM_HISTORY in radius:
        crm_days = sorted(radius[RAW_CRM_HISTORY])
        plan.crm_calls = crm_calls(lake, DayRange(crm_days[0], crm_days[-1]))
        plan.crm_backfill_rate = backfill_share(
            int_setting(CRM_RATE_LIMIT), fraction_setting(CRM_LIVE_RESERVE)
        )
        if plan.crm_calls is not None:
            plan.crm_min_seconds = plan.crm_calls / plan.crm_backfill_rate
    return plan


def crm_calls(lake: LakehouseResource, days: DayRange) -> int | None:
    """Customers of the days' orders whose kept CRM answer does not cover them: staging's
    orders when built, else raw's valid lines (the same customers); None if neither is."""
    if lake.exists(STAGING_ORDERS) and lake.covers(STAGING_ORDERS, days.start):
        orders = lake.read_range(STAGING_ORDERS, "event_date", days.start, days.end)
    elif lake.exists(RAW_ORDERS):
        orders = lake.read(RAW_ORDERS).where(
            (F.col("event_date") >= F.lit(days.start))
            & (F.col("event_date") < F.lit(days.end))
            & F.col("reject_reason").isNull()
        )
    else:
        return None
    kept = lake.read(RAW_CRM_HISTORY) if lake.exists(RAW_CRM_HISTORY) else None
    return customers_to_fetch(orders, kept).count()


def _size(lake: LakehouseResource, key: AssetKey, keys: list[str]) -> tuple[int, int, int]:
    """Rows, files and bytes the partitions hold now, in one pass over Delta's file list."""
    if not keys or not table(key).day_partitioned:
        return 0, 0, 0
    files = lake.partition_files(key, keys).values()
    return sum(f.rows for f in files), sum(f.files for f in files), sum(f.bytes for f in files)
