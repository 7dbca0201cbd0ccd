"""Raw is never replaced by less: a re-ingest whose landing files are gone or shrank fails.

Landing files are immutable by contract, so a raw partition re-ingested from fewer lines than
it holds means the source lost data (a deleted folder, a truncated copy). Replacing raw with
that would silently destroy the only copy. A deliberate purge (a privacy deletion) is allowed
through typed run config and recorded in the Delta commit's userMetadata.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date

from dagster import AssetExecutionContext, AssetKey, Config, MetadataValue
from pydantic import Field
from pyspark.sql import DataFrame

from backfill_platform.refusals import refusal
from backfill_platform.resources.delta_io_manager import SOURCE_PURGE
from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.tables import table


class SourcePreservationConfig(Config):
    """Run config of the raw assets; the default refuses to replace raw by less."""

    allow_source_purge: bool = Field(
        default=False,
        description="Allow replacing raw rows whose landing files are gone or shrank "
        "(a deliberate purge, e.g. a privacy deletion). Recorded in the commit metadata.",
    )
    purge_reason: str = Field(default="", description="Why the purge is deliberate.")


@dataclass(frozen=True)
class SourceLoss:
    day: date
    file_name: str
    rows_in_raw: int
    rows_delivered: int

    def describe(self) -> str:
        now = "file gone" if not self.rows_delivered else f"now {self.rows_delivered} lines"
        return f"{self.day} {self.file_name}: {self.rows_in_raw} rows in raw, {now}"


def held_rows(
    lake: LakehouseResource, key: AssetKey, start: date, end: date
) -> dict[tuple[date, str], int]:
    """Rows raw holds per (day, file) in [start, end); empty for days never ingested.

    Only the rows the landing path owns count (raw/orders: not the stream's messages,
    which a re-ingest keeps). Asked before the delivery is parsed: a first ingest holds
    nothing, so it needs no comparison, and the parse can stream into the write without
    being cached.
    """
    if not lake.exists(key):
        return {}
    day_column = table(key).partition_column
    rows = lake.read_partitions(key, start, end, owned_only=True)
    return {
        (r[day_column], r["file_name"]): r["count"]
        for r in rows.groupBy(day_column, "file_name").count().collect()
    }


def rows_per_file(key: AssetKey, incoming: DataFrame) -> dict[tuple[date, str], int]:
    """Rows per (day, file name) of a frame with `key`'s day column and `file_name`."""
    day_column = table(key).partition_column
    return {
        (r[day_column], r["file_name"]): r["count"]
        for r in incoming.groupBy(day_column, "file_name").count().collect()
    }


def source_losses(
    held: dict[tuple[date, str], int], delivered: Mapping[tuple[date, str], int]
) -> list[SourceLoss]:
    """Files that raw holds more rows of than the re-ingest delivers, by day and name."""
    return [
        SourceLoss(day, name, rows, delivered.get((day, name), 0))
        for (day, name), rows in sorted(held.items())
        if delivered.get((day, name), 0) < rows
    ]


def guard_source(
    context: AssetExecutionContext,
    config: SourcePreservationConfig,
    key: AssetKey,
    held: dict[tuple[date, str], int],
    delivered: Mapping[tuple[date, str], int],
) -> None:
    """Fail before writing when the re-ingest would lose rows, unless a purge is allowed.

    `held` is `held_rows` of the run's range; `delivered` the rows the re-ingest brings per
    (day, file name), counted only when `held` has any (a first ingest needs no count).
    """
    losses = source_losses(held, delivered)
    if not losses:
        return
    listed = "; ".join(loss.describe() for loss in losses[:20])
    if not config.allow_source_purge:
        raise refusal(
            f"{key.to_user_string()}: refusing to replace raw by less; landing files are gone or "
            f"shrank: {listed}. Raw is unchanged. Restore the files, or re-run with run "
            "config allow_source_purge=true and a purge_reason for a deliberate purge.",
            metadata={"lost_files": MetadataValue.json([loss.describe() for loss in losses])},
        )
    context.log.warning(f"deliberate source purge ({config.purge_reason!r}): {listed}")
    context.add_output_metadata(
        {
            SOURCE_PURGE: json.dumps(
                {
                    "reason": config.purge_reason,
                    "files": [loss.describe() for loss in losses],
                },
                sort_keys=True,
            )
        }
    )
