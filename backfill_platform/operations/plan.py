"""Preflight plan: what a range will rewrite, whether its inputs exist, and who else is writing.

A plan is computed before anything runs: the blast radius from the asset graph, missing
inputs (gaps in upstream tables; for raw, landing files that raw holds but the landing zone
lost), sizes from the Delta log, the code versions that wrote the partitions and the one that
will rewrite them, and in-progress runs over the same partitions. Missing inputs and
conflicting runs block the plan unless explicitly overridden.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlparse

from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter
from pyspark.sql import functions as F

from backfill_platform.lineage import Lineage, blast_radius, upstream_keys
from backfill_platform.ranges import DayRange, ranges_of
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.resources.lakehouse import table_name
from backfill_platform.resources.landing import FX_RATES, ORDERS
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG
from backfill_platform.tables import RAW_FX_RATES, RAW_ORDERS

LANDING_KIND = {RAW_ORDERS: ORDERS, RAW_FX_RATES: FX_RATES}
ACTIVE_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


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
    selection = lineage.expand(selection)
    written = {key: lake.built_partitions(key) for key in lineage.toposorted()}
    radius = blast_radius(lineage, selection, first, last, lambda k: set(written[k]))
    assets = []
    for key in lineage.toposorted():
        if key not in radius:
            continue
        keys = sorted(radius[key])
        rows, files, size = _size(lake, key, lineage.column[key], keys)
        now = Counter(
            written[key][k].get("code_version") or "unknown" for k in keys if k in written[key]
        )
        in_range = {
            written[key][k].get("code_version") or "unknown"
            for k in DayRange(first, last).partition_keys()
            if k in written[key]
        }
        selected = key in selection
        missing = _missing_inputs(
            lake, landing, lineage, key, keys, selection, first, last, written
        )
        assets.append(
            AssetPlan(
                asset=table_name(key),
                role="selected" if selected else "downstream",
                partitions=keys,
                ranges=[(r.first, r.last) for r in ranges_of(keys)],
                rows=rows,
                files=files,
                bytes=size,
                code_version_now=dict(now),
                code_version_next=lineage.code_version[key],
                mixed_code_versions=len(in_range) > 1,
                missing_inputs=missing if selected else [],
                downstream_partitions=sorted(
                    set(keys) - set(DayRange(first, last).partition_keys())
                )
                if selected
                else keys,
            )
        )
    conflicts = _conflicting_runs(instance, radius, exclude_run_id) if instance else []
    return Plan(
        selection=[table_name(k) for k in selection],
        start=first,
        end=last,
        assets=assets,
        conflicting_runs=conflicts,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _size(lake: LakehouseResource, key: AssetKey, column: str, keys: list[str]):
    """Rows, files and bytes the partitions hold now (Delta prunes to their files)."""
    if not keys or not lake.exists(key):
        return 0, 0, 0
    df = lake.read(key).where(F.col(column).isin([date.fromisoformat(k) for k in keys]))
    paths = [Path(unquote(urlparse(f).path)) for f in df.inputFiles()]
    return df.count(), len(paths), sum(p.stat().st_size for p in paths if p.exists())


def _missing_inputs(
    lake: LakehouseResource,
    landing: LandingZoneResource,
    lineage: Lineage,
    key: AssetKey,
    keys: list[str],
    selection: list[AssetKey],
    first: str,
    last: str,
    written: dict[AssetKey, dict[str, dict]],
) -> list[str]:
    """Inputs the range needs that are gone: landing files raw holds, or upstream gaps."""
    if key in LANDING_KIND:
        return _lost_landing_files(lake, landing, key, lineage.column[key], first, last)
    rewritten = set(DayRange(first, last).partition_keys())
    missing = []
    for edge in lineage.parents(key):
        needed = upstream_keys(edge, keys)
        if edge.parent in selection:
            needed -= rewritten  # the range writes those itself
        built = set(written[edge.parent])
        if not built:
            gaps = sorted(k for k in needed if k <= last)
        else:
            gaps = sorted(k for k in needed if min(built) <= k <= max(built) and k not in built)
            if edge.parent == key:  # self-dependency: the partition before the range
                gaps = sorted(k for k in needed if k not in built)
        if gaps:
            runs = ", ".join(str(r) for r in ranges_of(gaps)[:10])
            missing.append(f"{table_name(edge.parent)} partitions {runs} not built")
    return missing


def _lost_landing_files(
    lake: LakehouseResource,
    landing: LandingZoneResource,
    key: AssetKey,
    column: str,
    first: str,
    last: str,
) -> list[str]:
    """Files raw was built from that the landing zone no longer has (raw never shrinks)."""
    if not lake.exists(key):
        return []
    end = date.fromisoformat(last) + timedelta(days=1)
    held = (
        lake.read_range(key, column, date.fromisoformat(first), end)
        .select(column, "file_name")
        .distinct()
        .collect()
    )
    kind = LANDING_KIND[key]
    lost = []
    for row in sorted(held, key=lambda r: (r[column], r["file_name"])):
        day = row[column].isoformat()
        present = {p.name for p in landing.files(kind, [day])}
        if row["file_name"] not in present:
            lost.append(f"landing file {kind}/{day}/{row['file_name']} is gone")
    return lost


def _conflicting_runs(
    instance: DagsterInstance, radius: dict[AssetKey, set[str]], exclude_run_id: str | None
) -> list[dict]:
    """In-progress runs whose asset selection and partition range overlap the radius."""
    conflicts = []
    for run in instance.get_runs(RunsFilter(statuses=ACTIVE_STATUSES)):
        if run.run_id == exclude_run_id:
            continue
        first = run.tags.get(RANGE_START_TAG) or run.tags.get("dagster/partition")
        last = run.tags.get(RANGE_END_TAG) or first
        if not first:
            continue
        keys = set(DayRange(first, last).partition_keys())
        assets = sorted(
            table_name(k)
            for k in (run.asset_selection or radius.keys())
            if k in radius and radius[k] & keys
        )
        if assets:
            conflicts.append({"run_id": run.run_id, "assets": assets, "first": first, "last": last})
    return conflicts
