"""Sensor ticks against a real Dagster instance, evaluated one by one, and the runs they
request executed in process with the requests' tags, as the daemon would launch them."""

import shutil
from pathlib import Path

from dagster import (
    DagsterInstance,
    Definitions,
    RunRequest,
    SensorResult,
    SkipReason,
    build_sensor_context,
    in_process_executor,
)

from backfill_platform.automation import all_jobs, all_schedules, all_sensors
from backfill_platform.definitions import all_assets
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG

REPO = Path(__file__).resolve().parents[1]


def instance_at(home: Path) -> DagsterInstance:
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    return DagsterInstance.from_config(str(home))


def definitions(resources) -> Definitions:
    return Definitions(
        assets=all_assets,
        jobs=all_jobs,
        schedules=all_schedules,
        sensors=all_sensors,
        resources=resources,
        executor=in_process_executor,
    )


class Daemon:
    """Evaluates sensor ticks with their cursors and launches the requested runs in process."""

    def __init__(self, resources, instance: DagsterInstance):
        self.defs, self.resources, self.instance = definitions(resources), resources, instance
        self.cursors: dict[str, str | None] = {}
        self.run_keys: set[str] = set()

    def tick(self, sensor) -> tuple[list[RunRequest], str | None, list]:
        with build_sensor_context(
            instance=self.instance,
            cursor=self.cursors.get(sensor.name),
            definitions=self.defs,
            resources=self.resources,
        ) as context:
            result = sensor(context)
        if isinstance(result, SkipReason):
            return [], result.skip_message, []
        if isinstance(result, RunRequest):
            result = SensorResult(run_requests=[result])
        assert isinstance(result, SensorResult)
        if result.cursor is not None:
            self.cursors[sensor.name] = result.cursor
        requests = list(result.run_requests or [])
        for request in requests:  # the daemon never launches one run key twice
            assert request.run_key not in self.run_keys
            self.run_keys.add(request.run_key)
        skip = result.skip_reason.skip_message if result.skip_reason else None
        return requests, skip, list(result.asset_events or [])

    def launch(self, sensor, request: RunRequest) -> str:
        job_name = request.job_name or sensor.job_name
        job = self.defs.resolve_job_def(job_name)
        result = job.execute_in_process(
            instance=self.instance, tags={**request.tags, "dagster/run_key": request.run_key}
        )
        assert result.success
        return result.run_id

    def audit(self, sensor) -> str:
        """A tick that must request exactly one staleness audit, launched."""
        requests, skip, _ = self.tick(sensor)
        assert [r.job_name for r in requests] == ["staleness_audit_job"], skip
        return self.launch(sensor, requests[0])


def requested_range(request: RunRequest) -> tuple[str, str]:
    return request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]
