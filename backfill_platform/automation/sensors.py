"""The live path's sensors, one module each (intervals: docs/live-path.md).

Landing and window every 30 s, staleness every 60 s: an audit run only when the instance
shows something can be stale, never behind a writer, at most every 30 min while clean.
Sensors only read the landing listing and Dagster's instance (no Spark in the code
server); every Spark scan and every write happens in a queued run under the instance's
concurrency limits.
"""

from backfill_platform.automation.landing_sensor import landing_sensor
from backfill_platform.automation.stale_sensor import stale_partitions_sensor
from backfill_platform.automation.stream_sensor import stream_supervisor
from backfill_platform.automation.window_sensor import rolling_window_sensor

all_sensors = [landing_sensor, rolling_window_sensor, stale_partitions_sensor, stream_supervisor]

__all__ = [
    "all_sensors",
    "landing_sensor",
    "rolling_window_sensor",
    "stale_partitions_sensor",
    "stream_supervisor",
]
