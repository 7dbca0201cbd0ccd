"""What other runs are doing: the queued or running runs and the days they write downstream.

The live path never requests a day another run is writing (docs/live-path.md, "the
boundary rule"). Backfills launched from the UI or by the runner carry the same range or
partition tags as the live path's runs, so one query over the instance finds every writer.
"""

from dataclasses import dataclass

from dagster import DagsterInstance

from backfill_platform.automation.live_jobs import DOWNSTREAM_KEYS, RAW_KEYS, raw_ingest_job
from backfill_platform.ranges import DayRange, keys_in_window
from backfill_platform.runner import active_runs, run_days


@dataclass(frozen=True)
class ActiveWrite:
    run_id: str
    days: DayRange


def active_run_ids(instance: DagsterInstance, **filters) -> list[str]:
    """Ids of the queued or running runs matching `RunsFilter` fields (job_name, tags...)."""
    return [run.run_id for run in active_runs(instance, **filters)]


def active_downstream_writes(instance: DagsterInstance) -> list[ActiveWrite]:
    """Queued or running runs that write staging or marts, with the days they cover."""
    writes = []
    for run in active_runs(instance):
        selection = run.asset_selection
        if selection is not None and not set(selection) & set(DOWNSTREAM_KEYS):
            continue
        if selection is None and run.job_name == raw_ingest_job.name:
            continue
        days = run_days(run)
        if days is not None:
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


def active_raw_writes(instance: DagsterInstance) -> list[ActiveWrite]:
    """Queued or running runs that write raw, with the ingest days they cover.

    A raw ingestion run records raw/fx_rates before raw/orders; until it ends a day's
    raw is half delivered, so the rolling window waits for it.
    """
    writes = []
    for run in active_runs(instance):
        selection = run.asset_selection
        if selection is not None and not set(selection) & set(RAW_KEYS):
            continue
        days = run_days(run)
        if days is not None:
            writes.append(ActiveWrite(run.run_id, days))
    return writes
