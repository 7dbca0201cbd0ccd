"""The live path: daily schedule, landing and rolling-window sensors, staleness repair."""

from backfill_platform.automation.live_jobs import all_jobs
from backfill_platform.automation.schedules import all_schedules
from backfill_platform.automation.sensors import all_sensors

__all__ = ["all_jobs", "all_schedules", "all_sensors"]
