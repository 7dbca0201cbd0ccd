"""Shadow twins of the correctable assets: the same code under `shadow/<table>` keys.

A shadow backfill must not be recorded as production being rebuilt (the UI, staleness and
automation read materializations by key), so it materializes these twins instead: same op,
partitions, backfill policy and pool as production, group `shadow`, keys prefixed
`shadow/`. Their dependencies on other correctable assets point at those assets' twins;
raw stays production's (raw is never shadowed). A twin run carries the run tag
`SHADOW_SUFFIX_TAG`; the IO manager writes `<table>__shadow_<suffix>` and reads an
upstream twin's shadow where it exists (resources/delta_io_manager.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from dagster import (
    AssetDep,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    SpecificPartitionsPartitionMapping,
)

from backfill_platform.tables import (
    CORRECTABLE_LAYERS,
    SHADOW_GROUP,
    TABLE_NAMES,
    shadow_key,
    table,
)


def _is_correctable(key: AssetKey) -> bool:
    """A table of a correctable layer (the observed currency reference is no table)."""
    return key.to_user_string() in TABLE_NAMES and table(key).layer in CORRECTABLE_LAYERS


def _correctable(definition: AssetsDefinition) -> bool:
    keys = definition.keys  # empty for a checks definition
    return bool(keys) and all(_is_correctable(key) for key in keys)


# A twin's edge from a production table maps no partition either way: Dagster's asset
# backfill widens a selection downstream through partition mappings, so a backfill launched
# from production days (the UI's "Materialize all", every asset over a range) never reaches
# a twin, which needs a shadow suffix no such backfill has. Only a backfill naming the
# twins' own partitions (`backfill-platform shadow`) runs them; the IO manager reads the
# production table over the window production's own mapping gives (`shadow_read_window`).
NO_PARTITIONS = SpecificPartitionsPartitionMapping([])


def _production_table(key: AssetKey) -> bool:
    """A production table a twin reads (partitioned; the observed reference is no table)."""
    return key.to_user_string() in TABLE_NAMES and not _is_correctable(key)


def shadow_twin(definition: AssetsDefinition) -> AssetsDefinition:
    """`definition` under shadow keys, in the shadow group, depending on shadow twins; its
    edges from production tables map no partitions (`NO_PARTITIONS`)."""
    upstream = {key for deps in definition.asset_deps.values() for key in deps}
    replaced = {key: shadow_key(key) for key in definition.keys | upstream if _is_correctable(key)}

    def regroup(spec: AssetSpec) -> AssetSpec:
        deps = [
            AssetDep(dep.asset_key, partition_mapping=NO_PARTITIONS)
            if _production_table(dep.asset_key)
            else dep
            for dep in spec.deps
        ]
        return spec.replace_attributes(group_name=SHADOW_GROUP, deps=deps)

    return definition.with_attributes(asset_key_replacements=replaced).map_asset_specs(regroup)


def shadow_twins(assets: Sequence[AssetsDefinition]) -> list[AssetsDefinition]:
    """The twins of every correctable asset among `assets`."""
    return [shadow_twin(d) for d in assets if _correctable(d)]
