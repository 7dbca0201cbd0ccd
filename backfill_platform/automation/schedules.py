"""Schedules: yesterday's landing through every layer at 02:00 UTC; VACUUM weekly."""

from dagster import DefaultScheduleStatus, build_schedule_from_partitioned_job

from backfill_platform.automation.live_jobs import live_day_job
from backfill_platform.automation.maintenance import weekly_vacuum_schedule
from backfill_platform.runner import TRIGGER_TAG

# 02:00 UTC gives late-evening deliveries of the previous UTC day two hours to land. The
# partitions are UTC days, so the schedule fills the partition that ended at 00:00 UTC.
# Stopped by default: the landing sensor already builds every delivered day; turn this on
# in production so that a day with no delivery at all is still built (an empty partition
# keeps customer_ltv's day-by-day chain unbroken).
daily_live_schedule = build_schedule_from_partitioned_job(
    live_day_job,
    name="daily_live_schedule",
    hour_of_day=2,
    minute_of_hour=0,
    default_status=DefaultScheduleStatus.STOPPED,
    tags={TRIGGER_TAG: "daily-schedule"},
)

all_schedules = [daily_live_schedule, weekly_vacuum_schedule]
