"""The IO manager every partitioned asset writes through: replace the run's range, never append.

Assets declare their date column as `partition_expr` definition metadata (the convention
of dagster-deltalake), so the IO manager knows which column the run's time window covers.

Shadow twins (`shadow/<table>` keys, assets/shadow.py) write `<table>__shadow_<suffix>`,
the suffix taken from the run's `SHADOW_SUFFIX_TAG`; a twin without the tag, or a
production asset in a run that carries it, is refused before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from dagster import (
    AssetKey,
    ConfigurableIOManager,
    IdentityPartitionMapping,
    InitResourceContext,
    InputContext,
    MetadataValue,
    OutputContext,
    TimeWindow,
)
from pydantic import PrivateAttr
from pyspark.sql import DataFrame, Observation

from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.settings import KEEP_WRITTEN_RANGES, bool_setting
from backfill_platform.tables import KEPT_IN_RUN, production_key, run_shadow_suffix

SOURCE_PURGE = "source_purge"  # output metadata key set by the raw assets' purge override
# Output metadata key: the Delta version of each input table the output was computed from,
# JSON {"raw/orders": 41}. Recorded on the commit so a check can read the same snapshot
# while another writer (the live stream) keeps appending to the input. An asset that reads
# its inputs itself sets it (assets/staging.py); the versions of the inputs this IO manager
# loads for the step are recorded otherwise.
READ_VERSIONS = "read_versions"

PARTITION_EXPR = "partition_expr"
# Input metadata (`AssetIn(metadata=...)`): load only the reading step's own days of a wider
# mapped window. The mapping still orders the runs (which days must be built first); the
# rows are the step's days, which a run that wrote them keeps in memory (`KeptRange`).
OWN_DAYS_ONLY = "own_days_only"


@dataclass(frozen=True)
class ObservedFrame:
    """A DataFrame to write and `Observation`s on it (`DataFrame.observe`): aggregates
    Spark computes inside the write job itself, added to the output's metadata once the
    commit is done. Counting the rows about to be written would otherwise take a pass of
    its own, or a cache of every row (raw/orders: the whole parsed delivery).
    `commit_metadata` is recorded on the write's commit alone, not on every partition's
    materialization as output metadata would be."""

    df: DataFrame
    observations: tuple[Observation, ...]
    commit_metadata: Mapping[str, str] = field(default_factory=dict)


class DeltaIOManager(ConfigurableIOManager):
    """Writes a DataFrame over exactly its run's partition range in one Delta commit."""

    lakehouse: LakehouseResource
    _shadow_suffix: str | None = PrivateAttr(default=None)
    # Step key -> {input table: the Delta version `load_input` read for that step}.
    _read_by_step: dict[str, dict[str, int]] = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._shadow_suffix = run_shadow_suffix(context.run.tags if context.run else {})

    def _table(
        self, context: InputContext | OutputContext, writing: bool
    ) -> tuple[LakehouseResource, AssetKey]:
        """The lakehouse and table of the context's asset: a twin's shadow, or production."""
        return self.lakehouse.for_asset(context.asset_key, self._shadow_suffix, writing, context)

    def handle_output(self, context: OutputContext, obj: DataFrame | ObservedFrame | None) -> None:
        if obj is None:
            return
        observed = obj if isinstance(obj, ObservedFrame) else None
        lakehouse, key = self._table(context, writing=True)
        # The output's own read_versions, else those of the inputs its step loaded.
        loaded = self._read_by_step.get(context.step_key)
        read = None
        if loaded and (context.output_metadata or {}).get(READ_VERSIONS) is None:
            read = json.dumps(loaded, sort_keys=True)
        column = _partition_column(context.definition_metadata, context)
        window = context.asset_partitions_time_window
        commit = lakehouse.replace_range(
            key,
            observed.df if observed else obj,
            partition_column=column,
            start=window.start.date(),
            end=window.end.date(),
            user_metadata={
                **commit_metadata(context, read),
                **(observed.commit_metadata if observed else {}),
            },
            # A shadow's lakehouse is built per call, so no later step could read its keep.
            keep=lakehouse is self.lakehouse
            and key in KEPT_IN_RUN
            and bool_setting(KEEP_WRITTEN_RANGES),
        )
        context.add_output_metadata(
            {
                "delta_version": commit.version,
                "rows_written": commit.rows_written,
                "files_written": commit.files_written,
                "files_removed": commit.files_removed,
                "rows_replaced": commit.rows_removed,
                "partition_range": f"[{window.start.date()}, {window.end.date()})",
                "table_path": MetadataValue.path(lakehouse.table_path(key)),
                **({READ_VERSIONS: read} if read else {}),
                # Only after a successful write: Observation.get waits for the first action.
                **{
                    k: v
                    for o in (observed.observations if observed else ())
                    for k, v in o.get.items()
                },
            }
        )

    def load_input(self, context: InputContext) -> DataFrame | None:
        """The upstream table filtered to the mapped partitions; None when there are none.

        None happens for the first partition of a self-dependent asset, or when the upstream
        table has not been written yet. A shadow twin's input is its upstream twin's shadow
        where that exists, production's table otherwise (a shadow of the marts alone reads
        production staging).
        """
        twins = reading_twins(context)
        if twins:  # a twin without the run's suffix is refused before anything is read
            self.lakehouse.for_asset(twins[0], self._shadow_suffix, writing=True, context=context)
        lakehouse, key = self._table(context, writing=False)
        if not context.has_asset_partitions:
            return None
        window = shadow_read_window(context, twins) or (
            context.asset_partitions_time_window if context.asset_partition_keys else None
        )
        if window is not None and (context.definition_metadata or {}).get(OWN_DAYS_ONLY):
            window = _within_step_days(context, window)
        if window is None:
            return None
        if not lakehouse.exists(key):
            lakehouse = self.lakehouse
        if not lakehouse.exists(key):
            return None
        column = _partition_column(context.upstream_output.definition_metadata, context)
        # The run's one version of the table, named: the output records what it read.
        version = lakehouse.run_version(key)
        read = self._read_by_step.setdefault(context.step_context.step.key, {})
        read[key.to_user_string()] = version
        return lakehouse.read_range(key, column, window.start.date(), window.end.date(), version)


def _within_step_days(context: InputContext, window: TimeWindow) -> TimeWindow | None:
    """`window` cut to the days of the step that loads the input; None when they miss."""
    partitions = context.asset_partitions_def
    days = context.step_context.partition_key_range
    start = max(window.start, partitions.time_window_for_partition_key(days.start).start)
    end = min(window.end, partitions.time_window_for_partition_key(days.end).end)
    return TimeWindow(start, end) if start < end else None


def reading_twins(context: InputContext) -> list[AssetKey]:
    """The shadow twins among the assets of the step that loads this input."""
    step = context.step_context
    readers = step.job_def.asset_layer.get_assets_def_for_node(step.node_handle)
    return [k for k in (readers.keys if readers else ()) if production_key(k) is not None]


def shadow_read_window(context: InputContext, twins: list[AssetKey]) -> TimeWindow | None:
    """A twin's read of a production table: the window production's own mapping gives.

    A twin's edge from a production table maps no partitions (assets/shadow.py: so no
    backfill of production days reaches a twin), so Dagster gives its input none; the twin
    reads what its production asset reads for the same days. None for any other input.
    """
    if not twins or production_key(context.asset_key) is not None:
        return None
    step = context.step_context
    layer = step.job_def.asset_layer
    partitions = context.asset_partitions_def
    days = partitions.empty_subset().with_partition_key_range(partitions, step.partition_key_range)
    windows = []
    for twin in twins:
        production = production_key(twin)
        mapping = (
            layer.get(production).partition_mappings.get(context.asset_key)
            if layer.has(production)
            else None
        ) or IdentityPartitionMapping()  # an edge without a mapping: the same days
        read = mapping.get_upstream_mapped_partitions_result_for_partitions(
            days, partitions, partitions
        ).partitions_subset
        windows += read.get_partition_key_ranges(partitions)
    if not windows:
        return None
    first = min(partitions.time_window_for_partition_key(r.start).start for r in windows)
    last = max(partitions.time_window_for_partition_key(r.end).end for r in windows)
    return TimeWindow(first, last)


def commit_metadata(context: OutputContext, read: str | None = None) -> dict[str, str | None]:
    """Who wrote the commit and with which code (the lakehouse adds the partition range).

    A deliberate source purge (assets/preservation.py) and the input versions the output
    was computed from (the output's own, else `read`: the JSON of those its step loaded)
    are recorded on the commit too.
    """
    recorded = {READ_VERSIONS: read} if read else {}
    for name in (SOURCE_PURGE, READ_VERSIONS):
        value = (context.output_metadata or {}).get(name)
        if value is not None:
            recorded[name] = getattr(value, "value", value)
    return {
        "dagster_run_id": context.run_id,
        "asset_key": context.asset_key.to_user_string(),
        "code_version": context.asset_spec.code_version,
        **recorded,
    }


def _partition_column(metadata, context: InputContext | OutputContext) -> str:
    column = (metadata or {}).get(PARTITION_EXPR)
    if not column:
        raise ValueError(
            f"{context.asset_key.to_user_string()}: asset has no '{PARTITION_EXPR}' metadata "
            "naming its date column; the Delta IO manager needs it to replace the run's range."
        )
    return str(column)
