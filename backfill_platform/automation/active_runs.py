"""What other runs are doing: the queued or running runs and the days they write downstream.

The live path never requests a day another run is writing (docs/live-path.md, "the
boundary rule"). Backfills launched from the UI or by the runner carry the same range or
partition tags as the live path's runs, so one query over the instance finds every writer.
"""

from dataclasses import dataclass

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from backfill_platform.automation.live_jobs import DOWNSTREAM_KEYS, raw_ingest_job
from backfill_platform.ranges import DayRange, keys_in_window
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG

PARTITION_TAG = "dagster/partition"
ACTIVE_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


@dataclass(frozen=True)
class ActiveWrite:
    run_id: str
    days: DayRange


def active_runs(instance: DagsterInstance, **filters) -> list[str]:
    """Ids of the queued or running runs matching `RunsFilter` fields (job_name, tags...)."""
    records = instance.get_run_records(RunsFilter(statuses=ACTIVE_STATUSES, **filters))
    return [r.dagster_run.run_id for r in records]


def active_downstream_writes(instance: DagsterInstance) -> list[ActiveWrite]:
    """Queued or running runs that write staging or marts, with the days they cover."""
    writes = []
    for record in instance.get_run_records(RunsFilter(statuses=ACTIVE_STATUSES)):
        run = record.dagster_run
        selection = run.asset_selection
        if selection is not None and not set(selection) & set(DOWNSTREAM_KEYS):
            continue
        if selection is None and run.job_name == raw_ingest_job.name:
            continue
        tags = run.tags
        if RANGE_START_TAG in tags and RANGE_END_TAG in tags:
            days = DayRange(tags[RANGE_START_TAG], tags[RANGE_END_TAG])
        elif PARTITION_TAG in tags:
            days = DayRange(tags[PARTITION_TAG], tags[PARTITION_TAG])
        else:
            continue
        writes.append(ActiveWrite(run.run_id, days))
    return writes


def blocked_days(instance: DagsterInstance) -> dict[str, str]:
    """Partition key -> a run writing it downstream (the last one listed, if several).

    Every calendar day of a run's range counts, inside the partitions or not: a run's tags
    are what it writes, whatever the partitions definition says today.
    """
    return {
        key: write.run_id
        for write in active_downstream_writes(instance)
        for key in keys_in_window(write.days.start, write.days.end)
    }
