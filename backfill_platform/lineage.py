"""The asset graph of a code location, read from its definitions: order, reach, blast radius.

Which partitions a run reads and which partitions a change reaches come from the partition
mappings the assets declare (late arrivals, FX reach, LTV's previous day), never from date
arithmetic of our own, so the runner and the operations stay right when an asset's
dependencies change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from dagster import (
    AllPartitionMapping,
    AssetKey,
    AssetsDefinition,
    IdentityPartitionMapping,
    PartitionMapping,
)

from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange

# Metadata of an observed reference asset naming the table whose content it summarizes.
DERIVED_FROM = "backfill_platform/derived_from"


class UnknownAsset(ValueError):
    """An asset key an operator named that the code location does not have."""


@dataclass(frozen=True)
class Edge:
    parent: AssetKey
    child: AssetKey
    mapping: PartitionMapping


class Lineage:
    """Parents, children, partition columns and code versions of every asset."""

    def __init__(self, assets: Sequence[AssetsDefinition]):
        self.assets = list(assets)
        self.edges: list[Edge] = []
        self.column: dict[AssetKey, str] = {}
        self.code_version: dict[AssetKey, str | None] = {}
        self.siblings: dict[AssetKey, frozenset[AssetKey]] = {}
        # Observed reference nodes (the known currencies) are nothing to run; a partitioned
        # table they are derived from stands in for them, read in full (see below).
        derived_from = {
            spec.key: AssetKey.from_user_string(spec.metadata[DERIVED_FROM])
            for definition in self.assets
            if not definition.is_materializable
            for spec in definition.specs
            if DERIVED_FROM in spec.metadata
        }
        for definition in self.assets:
            if not definition.is_materializable:
                continue
            keys = frozenset(definition.keys)
            for spec in definition.specs:
                self.column[spec.key] = str(spec.metadata.get("partition_expr"))
                self.code_version[spec.key] = spec.code_version
                # A multi-asset that cannot be subset runs all its outputs together.
                self.siblings[spec.key] = (
                    keys if not definition.can_subset else frozenset([spec.key])
                )
                for dep in spec.deps:
                    if dep.asset_key in derived_from:
                        # Any day of the source table can change the reference set: the
                        # runner orders and the operations' blast radius stay conservative
                        # (Dagster's own graph keeps the narrow, observed node).
                        edge = Edge(derived_from[dep.asset_key], spec.key, AllPartitionMapping())
                        self.edges.append(edge)
                        continue
                    mapping = dep.partition_mapping or IdentityPartitionMapping()
                    self.edges.append(Edge(dep.asset_key, spec.key, mapping))

    def parse(self, names: Iterable[str]) -> list[AssetKey]:
        """Asset keys from `marts/fct_daily_revenue`-style names, refusing unknown ones."""
        keys = []
        for name in names:
            key = AssetKey.from_user_string(name.strip())
            if key not in self.column:
                known = ", ".join(sorted(k.to_user_string() for k in self.column))
                raise UnknownAsset(f"--select: unknown asset {name!r}; known assets: {known}")
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
                key=AssetKey.to_user_string,
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

    def forward_reaching(self, edge: Edge) -> bool:
        """Whether the child's partition D reads parent partitions after D (late arrivals,
        all of FX): then the parent must be built over the whole range before the child."""
        probe = daily_partitions.get_first_partition_key()
        return any(k > probe for k in upstream_keys(edge, [probe]))

    def stages(self, keys: Iterable[AssetKey]) -> list[list[AssetKey]]:
        """`keys` in stages: a stage runs chunk by chunk, oldest first, after every earlier
        stage has covered the whole range. A key joins its parents' stage unless it reads
        a parent's later partitions (then the next one); self-dependencies never split."""
        wanted = set(self.expand(keys))
        stage: dict[AssetKey, int] = {}
        for key in self.toposorted():
            if key not in wanted:
                continue
            stage[key] = max(
                (
                    stage[e.parent] + (1 if self.forward_reaching(e) else 0)
                    for e in self.parents(key)
                    if e.parent in stage and e.parent != key
                ),
                default=0,
            )
            for sibling in self.siblings[key]:  # outputs of one definition run together
                stage[sibling] = max(stage.get(sibling, 0), stage[key])
        count = max(stage.values(), default=-1) + 1
        return [[k for k in self.toposorted() if stage.get(k) == i] for i in range(count)]


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
    radius = {key: set(DayRange(first, last).partition_keys()) for key in selection}
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
