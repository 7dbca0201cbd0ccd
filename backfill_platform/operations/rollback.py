"""Rollback: every table a cutover touched restored to its version before it (Delta RESTORE).

RESTORE undoes the cutover and everything committed after it (the downstream rebuild), so the
tables read exactly as before the cutover. It is refused when the old version's data files
were vacuumed: checked file by file before any table is restored, so a refused rollback
leaves every table as it was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from dagster import AssetKey, AssetMaterialization, DagsterInstance

from backfill_platform.operations.cutover import CUTOVER
from backfill_platform.operations.rebuild import CUTOVER_TAG
from backfill_platform.partitions import commit_partition_keys
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.delta_files import USER_METADATA_CONF
from backfill_platform.tables import TABLE_NAMES

ROLLBACK = "rollback"


class RollbackRefused(Exception):
    """The rollback did not start; every table is unchanged."""


@dataclass
class TableRollback:
    table: str
    cutover_version: int
    restored_to: int
    undone_commits: list[str]
    restore_version: int | None = None


@dataclass
class Rollback:
    cutover_id: str
    reason: str
    tables: list[TableRollback]

    def to_dict(self) -> dict:
        return asdict(self)


def table_histories(lake: LakehouseResource) -> dict[str, list[dict]]:
    """Every registered table's Delta history, newest first: read once per operation."""
    return {table: lake.history(table) for table in TABLE_NAMES}


def find_cutover(histories: Mapping[str, list[dict]], cutover_id: str | None) -> dict[str, dict]:
    """Table -> the cutover commit (the newest cutover when no id is given)."""
    found: dict[str, dict] = {}
    newest = None
    for table, history in histories.items():
        for commit in history:
            meta = commit["metadata"]
            if meta.get("operation") != CUTOVER:
                continue
            if cutover_id is None and (newest is None or commit["timestamp"] > newest[0]):
                newest = (commit["timestamp"], meta["cutover_id"])
            if cutover_id and meta.get("cutover_id") == cutover_id:
                found[table] = commit
    if cutover_id is None:
        return find_cutover(histories, newest[1]) if newest else {}
    return found


def missing_files(lake: LakehouseResource, table: str, version: int) -> list[str]:
    """Data files of `version` that are gone (vacuumed): time travel to it would fail."""
    return lake.missing_files(table, version)


def _commit_metadata(lake: LakehouseResource, metadata: dict):
    """RESTORE takes no userMetadata option; Delta reads it from this session setting."""
    return lake.spark.temporary_conf({USER_METADATA_CONF: json.dumps(metadata, sort_keys=True)})


def _foreign(instance: DagsterInstance | None, meta: dict, cutover_id: str) -> bool:
    """A commit after the cutover that is neither the cutover nor its downstream rebuild."""
    if meta.get("cutover_id") == cutover_id:
        return False
    run = instance.get_run_by_id(meta["dagster_run_id"]) if meta.get("dagster_run_id") else None
    return not (run and run.tags.get(CUTOVER_TAG) == cutover_id)


def rollback(
    lake: LakehouseResource,
    instance: DagsterInstance | None,
    reason: str,
    cutover_id: str | None = None,
    force: bool = False,
) -> Rollback:
    """Restore every table of the cutover; refuses to undo other work unless forced."""
    if not reason.strip():
        raise RollbackRefused("a rollback needs the operator's reason (--reason)")
    histories = table_histories(lake)
    commits = find_cutover(histories, cutover_id)
    if not commits:
        raise RollbackRefused(f"no cutover {cutover_id or ''} found in the Delta history")
    cutover_id = next(iter(commits.values()))["metadata"]["cutover_id"]
    plans, problems = [], []
    for table, commit in commits.items():
        history = histories[table]
        if any(
            h["metadata"].get("operation") == ROLLBACK
            and h["metadata"].get("cutover_id") == cutover_id
            for h in history
        ):
            problems.append(f"{table}: cutover {cutover_id} was already rolled back")
            continue
        target = commit["version"] - 1
        gone = missing_files(lake, table, target)
        if gone:
            problems.append(
                f"{table}: version {target} was vacuumed ({len(gone)} data files gone, "
                f"e.g. {gone[0]}); it can no longer be restored"
            )
            continue
        undone = [
            f"v{h['version']} {h['operation']} {h['metadata'].get('operation', '')} "
            f"run={h['metadata'].get('dagster_run_id') or '-'} "
            f"{_written_days(h['metadata'])}"
            for h in history
            if h["version"] > target
        ]
        foreign = [
            f"v{h['version']}"
            for h in history
            if h["version"] > target and _foreign(instance, h["metadata"], cutover_id)
        ]
        if foreign and not force:
            problems.append(
                f"{table}: commits {foreign} after the cutover are not part of it and would "
                "be undone too (pass --force to undo them as well)"
            )
            continue
        plans.append(TableRollback(table, commit["version"], target, undone))
    if problems:
        raise RollbackRefused("rollback refused, every table unchanged: " + "; ".join(problems))
    for plan in plans:
        with (
            lake.table_lock(plan.table),
            _commit_metadata(
                lake, {"operation": ROLLBACK, "cutover_id": cutover_id, "reason": reason}
            ),
        ):
            lake.delta_table(plan.table).restoreToVersion(plan.restored_to)
        plan.restore_version = lake.current_version(plan.table)
    result = Rollback(cutover_id, reason, plans)
    if instance is not None:
        record_rollback(instance, lake, result)
    return result


def record_rollback(instance: DagsterInstance, lake: LakehouseResource, result: Rollback) -> None:
    """Each partition the RESTORE changed gets a materialization of the production key, as
    the cutover's did: the UI's latest materialization of those days is the rollback, not
    the cutover it undid (an observation left the cutover showing as the latest)."""
    for plan in result.tables:
        undone = [h for h in lake.history(plan.table) if plan.restored_to < h["version"]]
        days = sorted(
            {
                key
                for h in undone
                if h["version"] != plan.restore_version
                for key in commit_partition_keys(h["metadata"])
            }
        )
        for day in days:
            instance.report_runless_asset_event(
                AssetMaterialization(
                    asset_key=AssetKey.from_user_string(plan.table),
                    partition=day,
                    description=f"rollback of cutover {result.cutover_id}",
                    metadata={
                        "operation": ROLLBACK,
                        "cutover_id": result.cutover_id,
                        "delta_version": plan.restore_version,
                        "restored_to_version": plan.restored_to,
                        "reason": result.reason,
                        "undone_commits": "\n".join(plan.undone_commits),
                    },
                )
            )


def _written_days(metadata: dict) -> str:
    """The days a commit wrote, inclusive (`a..b`, the CLI's one range notation)."""
    keys = commit_partition_keys(metadata)
    return str(DayRange(keys[0], keys[-1])) if keys else "-"
