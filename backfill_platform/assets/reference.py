"""Reference data the graph can reason about: the set of currencies the FX files know.

Contract 1.1 rejects an order whose currency has no FX rate file anywhere in the landing
zone, so every staging day depends on *which currencies exist*, not on every FX day. As an
`AllPartitionMapping` on raw/fx_rates that dependency made Dagster widen any backfill
touching raw/fx_rates to every staging and mart day up to today. Here it is one
unpartitioned, observable (never materialized) node: asset backfills do not start from it
(it is not materializable), and its data version changes only when a currency appears or
disappears, which is exactly when staging's rejects can change, so staleness stays honest.
"""

from __future__ import annotations

import hashlib
import re

from dagster import (
    AssetKey,
    AssetSelection,
    AssetSpec,
    DagsterInstance,
    DataVersion,
    Definitions,
    MetadataValue,
    ObserveResult,
    define_asset_job,
    multi_observable_source_asset,
)

from backfill_platform.lineage import DERIVED_FROM
from backfill_platform.resources import LandingZoneResource
from backfill_platform.resources.landing import FX_RATES
from backfill_platform.tables import RAW_FX_RATES

FX_CURRENCIES = AssetKey(["reference", "fx_currencies"])

_CODE = re.compile(r"^[A-Z]{3}$")
_RATE = re.compile(r"^\d+(\.\d{1,8})?$")


def landing_currencies(landing: LandingZoneResource) -> list[str]:
    """USD plus every code with a valid rate line in any FX file of the landing zone.

    Plain Python over small CSVs (no Spark): cheap enough for every raw ingestion run.
    The same line rules as `transforms.fx.parse_rates`, so this is the set staging's
    `known_currencies` finds once raw/fx_rates has ingested the files.
    """
    codes = {"USD"}
    for file in landing.files(FX_RATES, landing.delivered_days(FX_RATES)):
        text = landing.read_bytes(file).removeprefix(b"\xef\xbb\xbf").decode("utf-8", "replace")
        lines = [line.rstrip("\r") for line in text.split("\n") if line.strip(" \t\r")]
        for line in lines[1:]:  # the first non-blank line is the header
            fields = line.split(",")
            valid = len(fields) == 2 and _CODE.match(fields[0]) and _RATE.match(fields[1])
            if valid and float(fields[1]) > 0:
                codes.add(fields[0])
    return sorted(codes)


def currencies_version(codes: list[str]) -> str:
    return hashlib.sha256(",".join(sorted(codes)).encode()).hexdigest()[:16]


# An AssetsDefinition (not a SourceAsset), so it sits in `all_assets` like the others.
@multi_observable_source_asset(
    specs=[
        AssetSpec(
            FX_CURRENCIES,
            group_name="reference",
            description="The currency codes with a valid FX rate anywhere in the landing "
            "zone (contract 1.1). Observed by every raw ingestion run; its data version is a "
            "hash of the sorted codes, so it changes only when a currency appears or goes.",
            # The runner and the operations' blast radius treat it as all of raw/fx_rates.
            metadata={DERIVED_FROM: RAW_FX_RATES.to_user_string()},
        )
    ],
    name="fx_currencies",
)
def fx_currencies(landing: LandingZoneResource):
    codes = landing_currencies(landing)
    yield ObserveResult(
        asset_key=FX_CURRENCIES,
        data_version=DataVersion(currencies_version(codes)),
        metadata={"currencies": MetadataValue.text(",".join(codes)), "count": len(codes)},
    )


def observe_currencies(landing: LandingZoneResource, instance: DagsterInstance) -> None:
    """One observation of the known currencies in process (the demo, before its backfill,
    so staging records the version it was built against)."""
    job = define_asset_job("observe_fx_currencies", selection=AssetSelection.assets(FX_CURRENCIES))
    defs = Definitions(assets=[fx_currencies], jobs=[job], resources={"landing": landing})
    defs.resolve_job_def(job.name).execute_in_process(instance=instance)
