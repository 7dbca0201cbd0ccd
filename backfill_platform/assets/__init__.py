"""Assets, one module per layer: raw (as delivered), staging (validated, latest wins), marts;
reference: the observable set of known currencies."""

from dagster import load_assets_from_modules

from backfill_platform.assets import crm, marts, raw, reference, staging
from backfill_platform.assets.shadow import shadow_twins

# The code location's assets, in one list: definitions serve them, the plan job and the
# runner read their graph (lineage, partition mappings) from the same objects.
all_assets = load_assets_from_modules([raw, reference, staging, marts, crm])
# Their shadow twins (`shadow/<table>`): served by the code location so a deployment can
# launch shadow backfills; the production graph (lineage, automation) never includes them.
shadow_assets = shadow_twins(all_assets)

__all__ = ["all_assets", "shadow_assets"]
