"""Dagster resources: the Spark session, the Delta lakehouse, the IO manager, the CRM."""

from backfill_platform.resources.crm import CrmResource
from backfill_platform.resources.delta_io_manager import DeltaIOManager
from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.resources.landing import LandingZoneResource
from backfill_platform.resources.spark import SparkSessionResource

__all__ = [
    "CrmResource",
    "DeltaIOManager",
    "LakehouseResource",
    "LandingZoneResource",
    "SparkSessionResource",
]
