"""Schedules: yesterday's landing through every layer at 02:00 UTC; VACUUM weekly."""

from datetime import timedelta

from dagster import (
    DefaultScheduleStatus,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from backfill_platform.automation.freeze import frozen_days
from backfill_platform.automation.live_jobs import DOWNSTREAM_KEYS, RAW_KEYS, live_day_job
from backfill_platform.automation.maintenance import weekly_vacuum_schedule
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.runner import TRIGGER_TAG


# 02:00 UTC gives late-evening deliveries of the previous UTC day two hours to land. The
# partitions are UTC days, so the schedule fills the partition that ended at 00:00 UTC.
# Stopped by default: the landing sensor already builds every delivered day; turn this on
# in production so that a day with no delivery at all is still built (an empty partition
# keeps customer_ltv's day-by-day chain unbroken). Written out rather than built by
# `build_schedule_from_partitioned_job` so that a day under correction is skipped.
@schedule(
    job=live_day_job,
    cron_schedule="0 2 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Yesterday's UTC day through every layer, unless it is frozen.",
)
def daily_live_schedule(context: ScheduleEvaluationContext):
    yesterday = context.scheduled_execution_time - timedelta(days=1)
    day = daily_partitions.get_partition_key_for_timestamp(yesterday.timestamp())
    if day < daily_partitions.start.date().isoformat():
        return SkipReason(f"{day} is before the first daily partition")
    frozen = frozen_days(context.instance, (*RAW_KEYS, *DOWNSTREAM_KEYS), DayRange(day, day))
    if frozen:
        return SkipReason(f"{day} is frozen by {frozen[day].freeze_id} ({frozen[day].reason})")
    return RunRequest(partition_key=day, tags={TRIGGER_TAG: "daily-schedule"})


all_schedules = [daily_live_schedule, weekly_vacuum_schedule]
