"""The stale-day repair run in process (`backfill-platform stale --repair`).

Detection lives in `staleness`; this turns its plan into runner work so the repair runs
through the one chunked-run loop (stage order, chunking, stop at the first failed run).
The staleness sensor requests the same steps as queued runs instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dagster import AssetKey, AssetsDefinition, DagsterInstance

from backfill_platform.automation.staleness import RepairStep
from backfill_platform.lineage import Lineage
from backfill_platform.runner import Executor, InProcessExecutor, RunReport, run_work

# Tags the in-process repair's runs, as opposed to the sensor's "stale-repair" requests.
REPAIR_TRIGGER = "stale-repair-cli"


def repair_work(steps: Sequence[RepairStep]) -> dict[AssetKey, set[str]]:
    """The repair plan as runner work: each step's assets over its days."""
    work: dict[AssetKey, set[str]] = {}
    for step in steps:
        days = step.days.partition_keys()
        for key in step.keys:
            work.setdefault(key, set()).update(days)
    return work


def run_repair(
    steps: Sequence[RepairStep],
    assets: Sequence[AssetsDefinition],
    resources: Mapping[str, object],
    instance: DagsterInstance,
    executor: Executor | None = None,
) -> RunReport:
    """Execute the targeted backfill (in process unless `executor` is given, e.g. a
    deployment's); stops at the first failed run and reports, never raises."""
    return run_work(
        executor or InProcessExecutor(assets, resources, instance),
        Lineage(assets),
        repair_work(steps),
        trigger=REPAIR_TRIGGER,
    )
