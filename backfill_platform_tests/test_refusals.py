"""A refusal retrying cannot fix ends its run at once; a transient failure keeps the retries.

Runs execute on a real instance configured by deploy/dagster.yaml (run retries enabled,
max_retries 2, retry_on_asset_or_op_failure). The instance decides at the run's failure
whether it will be retried (the `dagster/will_retry` tag); the run-retry daemon retries
exactly the runs its `filter_runs_to_should_retry` keeps, which is asked here directly.
No Spark: the twin's refusal comes before anything is read or written.
"""

from __future__ import annotations

from pathlib import Path

from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    Failure,
    RunsFilter,
    job,
    materialize,
    op,
)
from dagster._core.storage.tags import WILL_RETRY_TAG
from dagster._daemon.auto_run_reexecution.auto_run_reexecution import (
    filter_runs_to_should_retry,
)

from backfill_platform.assets import all_assets, shadow_assets
from backfill_platform.definitions import build_resources
from backfill_platform.refusals import NOT_RETRIED, refusal
from backfill_platform.tables import FCT_DAILY_REVENUE, SHADOW_SUFFIX_TAG, shadow_key
from backfill_platform_tests.sensor_ticks import instance_at


def _instance(home: Path) -> DagsterInstance:
    instance = instance_at(home)
    assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
    assert instance.run_retries_retry_on_asset_or_op_failure
    return instance


def _step_failures(instance: DagsterInstance, run_id: str) -> list[str]:
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE).records
    return [r.event_log_entry.dagster_event.step_failure_data.error.message for r in records]


def test_a_twin_run_without_its_suffix_fails_once_with_the_reason_and_is_not_retried(
    tmp_path,
):
    """The case a UI user meets: a shadow twin launched without the suffix tag (as the UI's
    "Materialize all" launched it). One failed run, no retry, the reason in the step's
    failure; the run says why it was not retried."""
    instance = _instance(tmp_path / "home")
    resources = build_resources(str(tmp_path / "landing"), str(tmp_path / "lakehouse"))
    twin = shadow_key(FCT_DAILY_REVENUE)
    result = materialize(
        [*all_assets, *shadow_assets],
        selection=[twin],
        partition_key="2024-01-04",
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    runs = instance.get_runs()
    assert [r.run_id for r in runs] == [result.run_id]  # exactly one run
    run = runs[0]
    assert run.status == DagsterRunStatus.FAILURE
    assert run.tags[WILL_RETRY_TAG] == "false"
    assert run.tags.items() >= NOT_RETRIED.items()
    assert list(filter_runs_to_should_retry([run], instance)) == []  # the daemon's choice
    (message,) = _step_failures(instance, run.run_id)
    assert f"a shadow asset needs the run tag {SHADOW_SUFFIX_TAG}=<suffix>" in message
    assert "nothing was written" in message
    engine = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)
    assert any(
        "Refused, not retried" in (r.event_log_entry.dagster_event.message or "")
        for r in engine.records
    )
    assert len(instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": run.run_id}))) == 0


@op
def lost_lock():
    raise Failure("lost the table lock")  # transient: another writer held it


@op
def refused():
    raise refusal("landing file has no header; nothing was written")


@job
def transient_job():
    lost_lock()


@job
def refused_job():
    refused()


def test_a_transient_failure_keeps_the_run_retries_a_refusal_does_not(tmp_path):
    instance = _instance(tmp_path / "home")
    transient = transient_job.execute_in_process(instance=instance, raise_on_error=False)
    refusal_run = refused_job.execute_in_process(instance=instance, raise_on_error=False)
    retried = instance.get_run_by_id(transient.run_id)
    not_retried = instance.get_run_by_id(refusal_run.run_id)
    assert retried.tags[WILL_RETRY_TAG] == "true"
    assert not_retried.tags[WILL_RETRY_TAG] == "false"
    kept = list(filter_runs_to_should_retry([retried, not_retried], instance))
    assert [r.run_id for r in kept] == [transient.run_id]
    (message,) = _step_failures(instance, refusal_run.run_id)
    assert "landing file has no header" in message


def test_refusal_outside_a_step_is_a_plain_non_retryable_failure():
    failure = refusal("no step here")
    assert isinstance(failure, Failure) and failure.allow_retries is False
    assert failure.description == "no step here"
