"""Dagster resources: the Spark session, the Delta lakehouse and the IO manager over it."""

from backfill_platform.resources.delta_io_manager import DeltaIOManager
from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.resources.landing import LandingZoneResource
from backfill_platform.resources.spark import SparkSessionResource

__all__ = ["DeltaIOManager", "LakehouseResource", "LandingZoneResource", "SparkSessionResource"]
