"""The correction report: what a cutover changed, on one page, for the people who own the
numbers (finance), not the engineers who validated it.

Every figure comes from Delta: each table is read at the version before its cutover commit
and at the cutover commit itself, over the range the commit stamped; the reason, operator,
validation and time come from the commit's metadata and the validation record, the
downstream rebuild from the commits of runs tagged with the cutover. Nothing is carried
over by hand, so the report can be generated again at any time while the history is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import date
from decimal import Decimal

from dagster import AssetKey, AssetObservation, DagsterInstance, MetadataValue

from backfill_platform.operations.rebuild import CUTOVER_TAG
from backfill_platform.operations.rollback import find_cutover, table_histories
from backfill_platform.operations.validate import (
    keys_and_measures,
    latest_validation,
    per_partition_stats,
)
from backfill_platform.partitions import commit_partition_keys
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.tables import TABLE_NAMES, table

REPORT_MARKER = "correction_report"
ROWS = "rows"
TOTAL = "total"


class ReportRefused(Exception):
    """No such cutover in the Delta history."""


@dataclass(frozen=True)
class Change:
    table: str
    day: str  # a partition, or "total" over the range
    measure: str  # "rows" or a numeric column's sum
    old: str
    new: str
    change: str
    relative: float | None  # change / old; None when old is 0

    @property
    def order(self) -> tuple[float, Decimal]:
        """Largest first: by relative change (from zero counts as largest), then absolute."""
        rel = float("inf") if self.relative is None else abs(self.relative)
        return (rel, abs(Decimal(self.change)))


@dataclass
class Rebuilt:
    table: str
    days: str
    version: int
    run_id: str


@dataclass
class CorrectionReport:
    cutover_id: str
    reason: str
    operator: str
    went_live: str
    start: str
    end: str
    validation_id: str | None
    validation: dict | None
    forced: bool
    tables: list[dict] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)  # per day, changed only, largest first
    totals: list[Change] = field(default_factory=list)  # per table and measure
    rebuilt: list[Rebuilt] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def markdown(self, top: int = 20) -> str:
        days = DayRange(self.start, self.end)
        approval = (
            f"validation `{self.validation_id}`"
            + (
                f" ({'passed' if self.validation['passed'] else 'FAILED'}, "
                f"{self.validation.get('created_at', 'time not recorded')})"
                if self.validation
                else ""
            )
            if self.validation_id
            else "no validation"
        ) + (" — **forced past validation**" if self.forced else "")
        lines = [
            f"# Correction {self.cutover_id}: {days} ({len(days.partition_keys())} days)",
            "",
            f"- **Why:** {self.reason}",
            f"- **Approved by:** {self.operator}, relying on {approval}",
            f"- **Live since:** {self.went_live} (UTC)",
            "- **Tables:** "
            + ", ".join(
                f"`{t['table']}` v{t['version_before']} -> v{t['version_after']}"
                f" ({t['cutover_mode']})"
                for t in self.tables
            ),
            "",
            "## In total over the period",
            "",
            "| table | measure | before | after | change | change % |",
            "|---|---|---:|---:|---:|---:|",
            *(_row(c, with_day=False) for c in self.totals),
            "",
            f"## Largest changes by day ({min(top, len(self.changes))} of {len(self.changes)})",
            "",
            "| table | day | measure | before | after | change | change % |",
            "|---|---|---|---:|---:|---:|---:|",
            *(_row(c, with_day=True) for c in self.changes[:top]),
            "",
            "## Rebuilt downstream",
            "",
            *(
                [f"- `{r.table}` {r.days} (v{r.version}, run {r.run_id})" for r in self.rebuilt]
                or ["- nothing downstream was rebuilt"]
            ),
        ]
        return "\n".join(lines)


def _row(c: Change, with_day: bool) -> str:
    pct = "new" if c.relative is None else f"{c.relative:+.2%}"
    day = f" {c.day} |" if with_day else ""
    return f"| {c.table} |{day} {c.measure} | {c.old} | {c.new} | {c.change} | {pct} |"


def correction_report(
    lake: LakehouseResource, instance: DagsterInstance | None, cutover_id: str
) -> CorrectionReport:
    histories = table_histories(lake)
    commits = find_cutover(histories, cutover_id)
    if not commits:
        raise ReportRefused(f"no cutover {cutover_id!r} in the Delta history of any table")
    first = next(iter(commits.values()))
    meta = first["metadata"]
    keys = commit_partition_keys(meta)
    report = CorrectionReport(
        cutover_id=cutover_id,
        reason=meta.get("reason", ""),
        operator=meta.get("operator") or "not recorded",
        went_live=max(c["timestamp"] for c in commits.values()).isoformat(sep=" "),
        start=keys[0],
        end=keys[-1],
        validation_id=meta.get("validation_id"),
        validation=_validation(instance, commits, meta),
        forced=bool(meta.get("forced")),
    )
    for name in TABLE_NAMES:  # dependency order
        if name in commits:
            commit = commits[name]
            report.tables.append(
                {
                    "table": name,
                    "shadow_table": commit["metadata"].get("shadow_source"),
                    "version_before": commit["version"] - 1,
                    "version_after": commit["version"],
                    # zero-copy or copy (commits before zero-copy existed copied)
                    "cutover_mode": commit["metadata"].get("cutover_mode", "copy"),
                }
            )
            day_changes, totals = _table_changes(lake, name, commit)
            report.changes += day_changes
            report.totals += totals
    report.changes.sort(key=lambda c: c.order, reverse=True)
    report.rebuilt = _rebuilt(histories, instance, cutover_id)
    return report


def _validation(instance, commits: dict, meta: dict) -> dict | None:
    if instance is None or not meta.get("validation_id"):
        return None
    for name in commits:
        record = latest_validation(instance, AssetKey.from_user_string(name), meta["shadow_suffix"])
        if record and record["validation_id"] in meta["validation_id"].split(","):
            return record
    return None


def _table_changes(
    lake: LakehouseResource, name: str, commit: dict
) -> tuple[list[Change], list[Change]]:
    """Per day and in total, rows and each measure's sum before and after the commit."""
    meta, version = commit["metadata"], commit["version"]
    column = table(name).partition_column
    start, end = (
        date.fromisoformat(meta["partition_start"]),
        date.fromisoformat(meta["partition_end"]),
    )
    new = lake.read_range(name, column, start, end, version=version)
    old = lake.read_range(name, column, start, end, version=version - 1) if version else None
    keys, measures = keys_and_measures(new, name)
    after = per_partition_stats(new, column, keys, measures)
    before = per_partition_stats(old, column, keys, measures) if old is not None else {}
    changes: list[Change] = []
    sums = {m: [Decimal(0), Decimal(0)] for m in (ROWS, *measures)}
    for day in commit_partition_keys(meta):
        b, a = before.get(day, {}), after.get(day, {})
        for measure in (ROWS, *measures):
            field_name = "_rows" if measure == ROWS else measure
            pair = (Decimal(b.get(field_name) or 0), Decimal(a.get(field_name) or 0))
            sums[measure][0] += pair[0]
            sums[measure][1] += pair[1]
            if pair[0] != pair[1]:
                changes.append(_change(name, day, measure, *pair))
    totals = [_change(name, TOTAL, m, old_sum, new_sum) for m, (old_sum, new_sum) in sums.items()]
    return changes, totals


def _change(name: str, day: str, measure: str, old: Decimal, new: Decimal) -> Change:
    delta = new - old
    relative = float(delta / old) if old else None
    return Change(name, day, measure, str(old), str(new), str(delta), relative)


def _rebuilt(
    histories: Mapping[str, list[dict]], instance: DagsterInstance | None, cutover_id: str
) -> list[Rebuilt]:
    """Commits of the runs the cutover's downstream rebuild launched (tagged with it)."""
    if instance is None:
        return []
    runs: dict[str, bool] = {}
    found = []
    for name, history in histories.items():
        for commit in reversed(history):
            run_id = commit["metadata"].get("dagster_run_id")
            if not run_id:
                continue
            if run_id not in runs:
                run = instance.get_run_by_id(run_id)
                runs[run_id] = bool(run and run.tags.get(CUTOVER_TAG) == cutover_id)
            keys = commit_partition_keys(commit["metadata"])
            if runs[run_id] and keys:
                found.append(
                    Rebuilt(name, str(DayRange(keys[0], keys[-1])), commit["version"], run_id)
                )
    return found


def record_report(instance: DagsterInstance, report: CorrectionReport) -> None:
    """The report's Markdown on each cut-over asset, where the UI shows it beside the
    cutover's materializations."""
    text = report.markdown()
    for t in report.tables:
        instance.report_runless_asset_event(
            AssetObservation(
                asset_key=AssetKey.from_user_string(t["table"]),
                description=f"correction report of cutover {report.cutover_id}",
                metadata={
                    REPORT_MARKER: MetadataValue.md(text),
                    "cutover_id": report.cutover_id,
                    "range": f"{report.start}..{report.end}",
                },
            )
        )
