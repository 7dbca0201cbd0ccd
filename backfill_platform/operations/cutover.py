"""Cutover: production's partitions of the range replaced by the shadow's, one commit per table.

Zero-copy where it applies (`LakehouseResource.adopt_range`): the commit removes the range's
files and adds the shadow's, hard-linked into production's directory, so its cost is the log
entry whatever the bytes. Where it cannot apply (an object-store root, a table shared with the
stream, a shadow whose schema or partitioning differs, deletion vectors), or when the operator
asks (`copy=True`), the copying cutover: the same replaceWhere commit every run uses, rows
read from the shadow. Either way a reader sees the version before (all old partitions) or
after (all new), never a mix.
Refused unless the newest validation of this shadow passed and still describes the shadow
(same shadow versions), or an explicit override is given; the commit records the shadow,
its version, the range, the validation and the operator's reason.
"""

from __future__ import annotations

import getpass
import uuid
from dataclasses import asdict, dataclass

from dagster import AssetKey, AssetMaterialization, DagsterInstance, MetadataValue

from backfill_platform.lineage import Lineage
from backfill_platform.operations.shadow import shadow_lakehouse
from backfill_platform.operations.validate import latest_validation
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.delta_files import ZeroCopyUnavailable
from backfill_platform.tables import table

CUTOVER = "cutover"
ZERO_COPY = "zero-copy"
COPY = "copy"


class CutoverRefused(Exception):
    """The cutover did not start; production is unchanged."""


@dataclass
class TableCutover:
    table: str
    shadow_table: str
    shadow_version: int | None
    version_before: int | None
    version_after: int
    rows_written: int
    rows_replaced: int
    mode: str = COPY  # ZERO_COPY or COPY
    copy_reason: str | None = None  # why a copying cutover, when it is one
    data_bytes_written: int = 0  # data files the commit wrote (none for zero-copy)


@dataclass
class Cutover:
    cutover_id: str
    suffix: str
    start: str
    end: str
    reason: str
    validation_id: str | None
    forced: bool
    tables: list[TableCutover]

    def to_dict(self) -> dict:
        return asdict(self)


def preflight(
    instance: DagsterInstance | None,
    shadow: LakehouseResource,
    keys: list[AssetKey],
    first: str,
    last: str,
    suffix: str,
    force: bool,
) -> str | None:
    """The validation id the cutover rests on; raises when it cannot rest on one."""
    problems, validation_ids = [], set()
    for key in keys:
        name = key.to_user_string()
        if not shadow.exists(key):
            raise CutoverRefused(f"no shadow table {shadow.storage_name(key)}")
        record = latest_validation(instance, key, suffix) if instance else None
        if record is None:
            problems.append(f"{name}: shadow {suffix!r} was never validated")
            continue
        validation_ids.add(record["validation_id"])
        if not record["passed"]:
            problems.append(f"{name}: validation {record['validation_id']} failed")
        if (record["start"], record["end"]) != (first, last):
            problems.append(
                f"{name}: validated range {record['start']}..{record['end']} is not {first}..{last}"
            )
        if record["shadow_version"] != shadow.current_version(key):
            problems.append(
                f"{name}: shadow changed since validation (v{record['shadow_version']}"
                f" validated, v{shadow.current_version(key)} now)"
            )
    if problems and not force:
        raise CutoverRefused(
            "cutover refused, production unchanged: "
            + "; ".join(problems)
            + ". Validate again, or pass the explicit override (--force) with a reason."
        )
    return ",".join(sorted(validation_ids)) or None


def cutover(
    lake: LakehouseResource,
    instance: DagsterInstance | None,
    selection: list[AssetKey],
    first: str,
    last: str,
    suffix: str,
    reason: str,
    force: bool = False,
    *,
    lineage: Lineage,
    copy: bool = False,
) -> Cutover:
    if not reason.strip():
        raise CutoverRefused("a cutover needs the operator's reason (--reason)")
    keys = lineage.expand(selection)
    shadow = shadow_lakehouse(lake, suffix, keys)
    validation_id = preflight(instance, shadow, keys, first, last, suffix, force)
    days = DayRange(first, last)
    cutover_id = uuid.uuid4().hex[:12]
    done = []
    for key in keys:  # dependency order
        column = table(key).partition_column
        shadow_version = shadow.current_version(key)
        written = shadow.built_partitions(key)
        code_versions = sorted(
            {
                written[k].get("code_version") or "unknown"
                for k in days.partition_keys()
                if k in written
            }
        )
        before = lake.current_version(key)
        metadata = {
            "operation": CUTOVER,
            "cutover_id": cutover_id,
            "asset_key": key.to_user_string(),
            "code_version": ",".join(code_versions),
            "shadow_suffix": suffix,
            "shadow_source": shadow.storage_name(key),
            "shadow_version": shadow_version,
            "validation_id": validation_id,
            "forced": force,
            "reason": reason,
            "operator": getpass.getuser(),  # who approved it, for the correction report
        }
        reason_to_copy = "asked for (--copy)" if copy else None
        if not copy:
            try:
                commit = lake.adopt_range(
                    key,
                    shadow,
                    column,
                    days.start,
                    days.end,
                    {**metadata, "cutover_mode": ZERO_COPY},
                    source_version=shadow_version,
                )
            except ZeroCopyUnavailable as unavailable:
                reason_to_copy = str(unavailable)
        if reason_to_copy is not None:
            commit = lake.replace_range(
                key,
                shadow.read_range(key, column, days.start, days.end, version=shadow_version),
                column,
                days.start,
                days.end,
                user_metadata={**metadata, "cutover_mode": COPY, "copy_reason": reason_to_copy},
            )
        done.append(
            TableCutover(
                table=key.to_user_string(),
                shadow_table=shadow.storage_name(key),
                shadow_version=shadow_version,
                version_before=before,
                version_after=commit.version,
                rows_written=commit.rows_written,
                rows_replaced=commit.rows_removed,
                mode=ZERO_COPY if reason_to_copy is None else COPY,
                copy_reason=reason_to_copy,
                data_bytes_written=commit.bytes_written,
            )
        )
    result = Cutover(cutover_id, suffix, first, last, reason, validation_id, force, done)
    if instance is not None:
        record_cutover(instance, result)
    return result


def record_cutover(instance: DagsterInstance, result: Cutover) -> None:
    """Each rewritten partition gets a materialization of the PRODUCTION key carrying the
    cutover: the shadow run materialized only `shadow/...` keys, so this is the moment
    the UI, staleness and automation learn production changed."""
    for t in result.tables:
        for key in DayRange(result.start, result.end).partition_keys():
            instance.report_runless_asset_event(
                AssetMaterialization(
                    asset_key=AssetKey.from_user_string(t.table),
                    partition=key,
                    description=f"cutover {result.cutover_id} from {t.shadow_table}",
                    metadata={
                        "operation": CUTOVER,
                        "cutover_id": result.cutover_id,
                        "delta_version": t.version_after,
                        "delta_version_before": t.version_before
                        if t.version_before is not None
                        else -1,
                        "shadow_table": MetadataValue.text(t.shadow_table),
                        "shadow_version": t.shadow_version,
                        "reason": result.reason,
                        "forced": result.forced,
                    },
                )
            )
