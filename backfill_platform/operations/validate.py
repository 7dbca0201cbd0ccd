"""Validate a shadow against production per partition, and reconcile it between layers.

The comparison (rows, sums, distinct keys, a sample of changed rows) says what the cutover
will change; the reconciliation (each shadow table against the layer it was built from, by
the blocking checks' equations: `reconciliation.py`) says whether the shadow is right. A
validation passes when the shadow has the production schema, covers every partition of the
range and reconciles. It is recorded as an AssetObservation on each production asset, where
the UI shows it and where the cutover looks for it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from dagster import (
    AssetKey,
    AssetObservation,
    AssetRecordsFilter,
    DagsterInstance,
    MetadataValue,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill_platform.lineage import Lineage
from backfill_platform.operations.reconciliation import reconcile_layers
from backfill_platform.operations.shadow import shadow_lakehouse
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.tables import table


class ValidationRefused(Exception):
    """Nothing to validate: the shadow tables are missing."""


VALIDATION_MARKER = "shadow_validation"


@dataclass
class PartitionDiff:
    partition: str
    rows: tuple[int, int]  # (production, shadow)
    distinct_keys: tuple[int, int]
    sums: dict[str, tuple[str, str]]  # numeric column -> (production, shadow)
    changed: bool


@dataclass
class TableValidation:
    table: str
    shadow_table: str
    shadow_version: int | None
    production_version: int | None
    schema_matches: bool
    uncovered_partitions: list[str]
    partitions: list[PartitionDiff]
    changed_partitions: int
    sample_changed_rows: list[dict] = field(default_factory=list)


@dataclass
class Validation:
    validation_id: str
    suffix: str
    start: str
    end: str
    tables: list[TableValidation]
    reconciliation: dict | None
    passed: bool
    created_at: str

    def to_dict(self) -> dict:
        return {**asdict(self), "failures": self.failures()}

    def failures(self) -> list[str]:
        problems = []
        for t in self.tables:
            if not t.schema_matches:
                problems.append(f"{t.shadow_table}: schema differs from {t.table}")
            if t.uncovered_partitions:
                problems.append(
                    f"{t.shadow_table}: partitions not built {t.uncovered_partitions[:10]}"
                )
        if self.reconciliation and not self.reconciliation["ok"]:
            problems.append("shadow tables do not reconcile with the layers they were built from")
        return problems

    def markdown(self, table: str | None = None) -> str:
        lines = [
            f"### Shadow `{self.suffix}` vs production, {self.start}..{self.end}: "
            f"**{'PASSED' if self.passed else 'FAILED'}**",
            "",
        ]
        for t in self.tables:
            if table and t.table != table:
                continue
            lines += [
                f"**{t.table}** (shadow v{t.shadow_version}, production v{t.production_version})"
                f": {t.changed_partitions} of {len(t.partitions)} partitions differ",
                "",
                "| partition | rows prod/shadow | keys prod/shadow | sums that differ |",
                "|---|---|---|---|",
            ]
            for p in t.partitions:
                if not p.changed:
                    continue
                sums = "; ".join(f"{c}: {a} -> {b}" for c, (a, b) in p.sums.items() if a != b)
                lines.append(
                    f"| {p.partition} | {p.rows[0]}/{p.rows[1]} | "
                    f"{p.distinct_keys[0]}/{p.distinct_keys[1]} | {sums} |"
                )
            if t.sample_changed_rows:
                lines += ["", "Sample of changed rows:", "```"]
                lines += [json.dumps(r, sort_keys=True) for r in t.sample_changed_rows]
                lines += ["```"]
            lines.append("")
        if self.reconciliation:
            lines += [
                "Reconciliation between layers: "
                + ("OK" if self.reconciliation["ok"] else "FAILED"),
                *(f"- {d}" for d in self.reconciliation["details"]),
            ]
        if self.failures():
            lines += ["", "Failures:", *(f"- {f}" for f in self.failures())]
        return "\n".join(lines)


def _data_columns(df: DataFrame) -> list[str]:
    return sorted(c for c in df.columns if not c.startswith("_"))


def _numeric(df: DataFrame, column: str) -> bool:
    return isinstance(df.schema[column].dataType, T.NumericType)


def keys_and_measures(df: DataFrame, key: AssetKey | str) -> tuple[list[str], list[str]]:
    """The table's key columns present in `df` (all data columns when none is), and the
    numeric data columns outside them: what a comparison counts and sums per partition."""
    columns = _data_columns(df)
    keys = [k for k in table(key).key_columns if k in columns] or columns
    return keys, [c for c in columns if _numeric(df, c) and c not in keys]


def per_partition_stats(
    df: DataFrame, column: str, keys: list[str], numeric: list[str]
) -> dict[str, dict]:
    """Per partition: rows (`_rows`), distinct keys (`_keys`) and each numeric column's sum
    (as text, exact for decimals); shared with the correction report."""
    aggs = [
        F.count(F.lit(1)).alias("_rows"),
        F.count_distinct(*[F.col(k) for k in keys]).alias("_keys"),
        *[F.sum(c).cast("string").alias(c) for c in numeric],
    ]
    return {r[column].isoformat(): r.asDict() for r in df.groupBy(column).agg(*aggs).collect()}


def compare_table(
    lake: LakehouseResource,
    shadow: LakehouseResource,
    key: AssetKey,
    days: DayRange,
    sample: int = 5,
) -> TableValidation:
    column = table(key).partition_column
    prod = lake.read_range(key, column, days.start, days.end) if lake.exists(key) else None
    shad = shadow.read_range(key, column, days.start, days.end)
    cols = _data_columns(shad)
    schema_matches = prod is None or {
        f.name: f.dataType for f in prod.schema.fields if f.name in _data_columns(prod)
    } == {f.name: f.dataType for f in shad.schema.fields if f.name in cols}
    keys, numeric = keys_and_measures(shad, key)
    shadow_stats = per_partition_stats(shad, column, keys, numeric)
    prod_stats = per_partition_stats(prod, column, keys, numeric) if prod is not None else {}
    covered = set(shadow.built_partitions(key))
    partitions = []
    for day in days.partition_keys():
        p, s = prod_stats.get(day, {}), shadow_stats.get(day, {})
        diff = PartitionDiff(
            partition=day,
            rows=(p.get("_rows", 0), s.get("_rows", 0)),
            distinct_keys=(p.get("_keys", 0), s.get("_keys", 0)),
            sums={c: (p.get(c), s.get(c)) for c in numeric},
            changed=False,
        )
        diff.changed = (
            diff.rows[0] != diff.rows[1]
            or diff.distinct_keys[0] != diff.distinct_keys[1]
            or any(a != b for a, b in diff.sums.values())
        )
        partitions.append(diff)
    samples: list[dict] = []
    if prod is not None and schema_matches and any(d.changed for d in partitions):
        new = shad.select(*cols).exceptAll(prod.select(*cols)).limit(sample).collect()
        old_rows = prod.select(*cols).exceptAll(shad.select(*cols)).limit(sample * 4).collect()
        old = {tuple(str(r[c]) for c in [column, *keys]): r for r in old_rows}
        for row in new:
            before = old.get(tuple(str(row[c]) for c in [column, *keys]))
            samples.append(
                {
                    "key": {c: str(row[c]) for c in [column, *keys]},
                    "production": {c: str(before[c]) for c in cols} if before else None,
                    "shadow": {c: str(row[c]) for c in cols},
                }
            )
    return TableValidation(
        table=key.to_user_string(),
        shadow_table=shadow.storage_name(key),
        shadow_version=shadow.current_version(key),
        production_version=lake.current_version(key),
        schema_matches=schema_matches,
        uncovered_partitions=[d for d in days.partition_keys() if d not in covered],
        partitions=partitions,
        changed_partitions=sum(d.changed for d in partitions),
        sample_changed_rows=samples,
    )


def validate_shadow(
    lake: LakehouseResource,
    landing: LandingZoneResource,
    instance: DagsterInstance | None,
    selection: list[AssetKey],
    first: str,
    last: str,
    suffix: str,
    *,
    lineage: Lineage,
    reconcile: bool = True,
    sample: int = 5,
) -> Validation:
    keys = lineage.expand(selection)
    shadow = shadow_lakehouse(lake, suffix, keys)
    missing = [shadow.storage_name(k) for k in keys if not shadow.exists(k)]
    if missing:
        raise ValidationRefused(f"no shadow table(s) {missing}; run `shadow` for this range first")
    days = DayRange(first, last)
    tables = [compare_table(lake, shadow, k, days, sample) for k in keys]
    reconciliation = reconcile_layers(shadow, landing, keys, days) if reconcile else None
    validation = Validation(
        validation_id=uuid.uuid4().hex[:12],
        suffix=suffix,
        start=first,
        end=last,
        tables=tables,
        reconciliation=reconciliation,
        passed=False,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    validation.passed = not validation.failures()
    if instance is not None:
        record_validation(instance, validation)
    return validation


def record_validation(instance: DagsterInstance, validation: Validation) -> None:
    """One observation per production asset: the comparison in markdown, the record in JSON."""
    for t in validation.tables:
        instance.report_runless_asset_event(
            AssetObservation(
                asset_key=AssetKey.from_user_string(t.table),
                metadata={
                    VALIDATION_MARKER: MetadataValue.md(validation.markdown(t.table)),
                    "validation_id": validation.validation_id,
                    "shadow_suffix": validation.suffix,
                    "passed": validation.passed,
                    "range": f"{validation.start}..{validation.end}",
                    "changed_partitions": t.changed_partitions,
                    "record": MetadataValue.json(
                        {
                            "validation_id": validation.validation_id,
                            "suffix": validation.suffix,
                            "start": validation.start,
                            "end": validation.end,
                            "passed": validation.passed,
                            "created_at": validation.created_at,
                            "shadow_version": t.shadow_version,
                            "production_version": t.production_version,
                        }
                    ),
                },
            )
        )


def latest_validation(instance: DagsterInstance, key: AssetKey, suffix: str) -> dict | None:
    """The newest validation record of `suffix` observed on production `key`."""
    records = instance.fetch_observations(AssetRecordsFilter(asset_key=key), limit=100).records
    for record in records:
        observation = record.asset_observation
        metadata = observation.metadata if observation else {}
        if VALIDATION_MARKER not in metadata or "record" not in metadata:
            continue
        data = metadata["record"].value
        if data.get("suffix") == suffix:
            return data
    return None
