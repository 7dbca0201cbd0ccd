"""Assets, one module per layer: raw (as delivered), staging (validated, latest wins), marts;
reference: the observable set of known currencies."""

from dagster import load_assets_from_modules

from backfill_platform.assets import crm, marts, raw, reference, staging

# The code location's assets, in one list: definitions serve them, the plan job and the
# runner read their graph (lineage, partition mappings) from the same objects.
all_assets = load_assets_from_modules([raw, reference, staging, marts, crm])

__all__ = ["all_assets"]
