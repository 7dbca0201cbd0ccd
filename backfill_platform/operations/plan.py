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

from backfill_platform.lineage import Lineage, blast_radius
from backfill_platform.operations.conflicts import conflicting_runs
from backfill_platform.operations.inputs import missing_inputs
from backfill_platform.ranges import DayRange, ranges_of
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.tables import table


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
    return Plan(
        selection=[k.to_user_string() for k in selection],
        start=first,
        end=last,
        assets=assets,
        conflicting_runs=conflicts,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _size(lake: LakehouseResource, key: AssetKey, keys: list[str]) -> tuple[int, int, int]:
    """Rows, files and bytes the partitions hold now, in one pass over Delta's file list."""
    if not keys:
        return 0, 0, 0
    files = lake.partition_files(key, keys).values()
    return sum(f.rows for f in files), sum(f.files for f in files), sum(f.bytes for f in files)
