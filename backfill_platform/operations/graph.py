"""The asset graph of the code location, read from its definitions: what a range touches.

Blast radius and input needs come from the partition mappings the assets declare (late
arrivals, FX reach, LTV's previous day), never from date arithmetic of our own, so the
operations stay right when an asset's dependencies change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import date, timedelta

from dagster import (
    AssetKey,
    AssetsDefinition,
    IdentityPartitionMapping,
    PartitionKeyRange,
    PartitionMapping,
)

from backfill_platform.partitions import commit_partition_keys, daily_partitions
from backfill_platform.resources.lakehouse import LakehouseResource, table_name


@dataclass(frozen=True)
class Edge:
    parent: AssetKey
    child: AssetKey
    mapping: PartitionMapping


class Lineage:
    """Parents, children, partition columns and code versions of every asset."""

    def __init__(self, assets: Sequence[AssetsDefinition] | None = None):
        if assets is None:
            from backfill_platform.definitions import all_assets

            assets = all_assets
        self.assets = list(assets)
        self.edges: list[Edge] = []
        self.column: dict[AssetKey, str] = {}
        self.code_version: dict[AssetKey, str | None] = {}
        self.siblings: dict[AssetKey, frozenset[AssetKey]] = {}
        for definition in self.assets:
            keys = frozenset(definition.keys)
            for spec in definition.specs:
                self.column[spec.key] = str(spec.metadata.get("partition_expr"))
                self.code_version[spec.key] = spec.code_version
                # A multi-asset that cannot be subset runs all its outputs together.
                self.siblings[spec.key] = (
                    keys if not definition.can_subset else frozenset([spec.key])
                )
                for dep in spec.deps:
                    mapping = dep.partition_mapping or IdentityPartitionMapping()
                    self.edges.append(Edge(dep.asset_key, spec.key, mapping))

    def parse(self, names: Iterable[str]) -> list[AssetKey]:
        """Asset keys from `marts/fct_daily_revenue`-style names, refusing unknown ones."""
        keys = []
        for name in names:
            key = AssetKey(name.strip().split("/"))
            if key not in self.column:
                known = ", ".join(sorted(table_name(k) for k in self.column))
                raise ValueError(f"unknown asset {name!r}; known assets: {known}")
            keys.append(key)
        return self.expand(keys)

    def expand(self, keys: Iterable[AssetKey]) -> list[AssetKey]:
        """The selection plus the outputs that must run with it, in dependency order."""
        wanted = set()
        for key in keys:
            wanted |= self.siblings[key]
        return [k for k in self.toposorted() if k in wanted]

    def children(self, key: AssetKey) -> list[Edge]:
        return [e for e in self.edges if e.parent == key]

    def parents(self, key: AssetKey) -> list[Edge]:
        return [e for e in self.edges if e.child == key]

    def toposorted(self) -> list[AssetKey]:
        order: list[AssetKey] = []
        remaining = set(self.column)
        while remaining:
            ready = sorted(
                (
                    k
                    for k in remaining
                    if all(e.parent not in remaining or e.parent == k for e in self.parents(k))
                ),
                key=table_name,
            )
            order += ready
            remaining -= set(ready)
        return order

    def groups(self, keys: Iterable[AssetKey]) -> list[list[AssetKey]]:
        """Keys grouped by the definition that must run them together, in dependency order."""
        seen: list[frozenset[AssetKey]] = []
        for key in self.toposorted():
            if key in set(keys) and self.siblings[key] not in seen:
                seen.append(self.siblings[key])
        return [[k for k in self.toposorted() if k in group] for group in seen]


def range_keys(first: str, last: str) -> list[str]:
    return daily_partitions.get_partition_keys_in_range(PartitionKeyRange(first, last))


def _subset(keys: Iterable[str]):
    return daily_partitions.empty_subset().with_partition_keys(list(keys))


def downstream_keys(edge: Edge, keys: Iterable[str]) -> set[str]:
    return set(
        edge.mapping.get_downstream_partitions_for_partitions(
            _subset(keys), daily_partitions, daily_partitions
        ).get_partition_keys()
    )


def upstream_keys(edge: Edge, keys: Iterable[str]) -> set[str]:
    result = edge.mapping.get_upstream_mapped_partitions_result_for_partitions(
        _subset(keys), daily_partitions, daily_partitions
    )
    return set(result.partitions_subset.get_partition_keys())


def blast_radius(
    lineage: Lineage,
    selection: Sequence[AssetKey],
    first: str,
    last: str,
    built: Callable[[AssetKey], set[str]],
) -> dict[AssetKey, set[str]]:
    """Partitions rewritten by the range, and every built partition downstream of them.

    Walks the partition mappings to a fixpoint, so LTV's previous-day self-dependency pulls
    in every later snapshot. Only partitions that exist are downstream work: an unbuilt one
    has nothing to correct.
    """
    radius = {key: set(range_keys(first, last)) for key in selection}
    frontier = {key: set(keys) for key, keys in radius.items()}
    while frontier:
        grown: dict[AssetKey, set[str]] = {}
        for parent, keys in frontier.items():
            for edge in lineage.children(parent):
                new = (downstream_keys(edge, keys) & built(edge.child)) - radius.get(
                    edge.child, set()
                )
                if new:
                    radius.setdefault(edge.child, set()).update(new)
                    grown.setdefault(edge.child, set()).update(new)
        frontier = grown
    return radius


def built_partitions(lake: LakehouseResource, key: AssetKey | str) -> dict[str, dict]:
    """Partition key -> metadata of the newest commit that wrote it (from the Delta log).

    Commits undone by a Delta RESTORE (versions between the restored-to version and the
    RESTORE) no longer describe the table and are skipped.
    """
    written: dict[str, dict] = {}
    undone: list[tuple[int, int]] = []
    for commit in lake.history(key):  # newest first
        version = commit["version"]
        if any(low < version < high for low, high in undone):
            continue
        if commit["operation"] == "RESTORE":
            undone.append((int(commit["parameters"].get("version", version)), version))
        meta = commit["metadata"]
        for key in commit_partition_keys(meta):
            written.setdefault(key, {**meta, "version": version})
    return written


def contiguous_keys(keys: Iterable[str]) -> list[tuple[str, str]]:
    """Partition keys grouped into inclusive (first, last) runs of consecutive days."""
    runs: list[tuple[str, str]] = []
    for key in sorted(keys):
        if runs and date.fromisoformat(key) == date.fromisoformat(runs[-1][1]) + timedelta(days=1):
            runs[-1] = (runs[-1][0], key)
        else:
            runs.append((key, key))
    return runs
