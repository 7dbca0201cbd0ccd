"""Keeping the lakehouse's tables healthy: VACUUM, dropping a shadow.

Reading and writing tables is `lakehouse.py`'s job; this module's is what keeps them cheap
to read and within their disk over months, under the same per-table lock as every writer.
"""

from __future__ import annotations

from dagster import AssetKey

from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.resources.storage import hadoop_fs
from backfill_platform.tables import TABLES, shadow_name

_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


class TableDropRefused(Exception):
    """A drop was refused before anything was deleted."""


def vacuum(lake: LakehouseResource, key: AssetKey | str, retention_hours: float) -> int | None:
    """VACUUM under the table lock, with the caller's retention window in place of
    Delta's fixed 7-day check (callers enforce their own floor: the shadow retention).

    The lock matters for a short window: VACUUM must not delete a writer's new files.
    Returns the files it deleted, from the VACUUM END commit Delta logs (None if Delta's
    VACUUM logging is off).

    Delta lists the table's files with Spark's partition-discovery parallelism, 10,000
    tasks by default whatever the table's size: 30 to 60 s for a table of 8 folders in a
    2-core session, 4 to 6 s with one task per core (docs/performance.md). The cores are
    what can run at once, so more tasks than that only queue.
    """
    settings = {
        _RETENTION_CHECK: "false",
        _LISTING_PARALLELISM: str(lake.session.sparkContext.defaultParallelism),
    }
    with lake.spark.temporary_conf(settings), lake.table_lock(key):
        table_ = lake.delta_table(key)
        table_.vacuum(retention_hours)
        latest = table_.history(1).first()
    if latest["operation"] != "VACUUM END":
        return None
    return int((latest["operationMetrics"] or {}).get("numDeletedFiles", 0))


def drop_shadows(lake: LakehouseResource, suffix: str) -> list[str]:
    """Delete every shadow table of `suffix`; returns their names.

    Only ever removes Delta table directories directly under their table's layer in this
    lakehouse: names come from the registry and a validated suffix, then each resolved
    path (symlinks followed) is compared with its resolved layer directory. Every shadow
    is checked before the first is deleted, so a refusal deletes nothing.
    """
    root = lake.local_root()
    doomed = []
    for registered in TABLES:
        name = shadow_name(registered.name, suffix)
        if root is None:
            # Object stores have no symlinks: the validated name is the whole guard.
            path = shown = lake.table_path(name)
            filesystem, hadoop_path = hadoop_fs(lake.session, path)
            if not filesystem.exists(hadoop_path):
                continue
        else:
            layer_dir = (root / registered.layer).resolve()
            resolved = (root / name).resolve()
            if not (root / name).exists() and not (root / name).is_symlink():
                continue
            if (
                layer_dir.parent != root
                or resolved.parent != layer_dir
                or resolved.name != name.split("/")[1]
            ):
                raise TableDropRefused(
                    f"{name}: resolves to {resolved}, not a table directly under "
                    f"{root / registered.layer}; nothing was deleted."
                )
            path, shown = resolved.as_uri(), resolved
        if not lake.exists(name):
            raise TableDropRefused(f"{name}: {shown} is not a Delta table; nothing was deleted.")
        doomed.append((name, path))
    for name, path in doomed:
        with lake.table_lock(name):
            filesystem, hadoop_path = hadoop_fs(lake.session, path)
            filesystem.delete(hadoop_path, True)
    return [name for name, _ in doomed]
