"""Refusals: failures that retrying cannot fix, so their runs are not retried.

`deploy/dagster.yaml` retries a failed run twice (`run_retries`, with
`retry_on_asset_or_op_failure`), which covers a transient failure (a JVM out of memory, a
lost lock, a CRM outage). A refusal is deterministic: a shadow twin without its suffix, a
landing file with a bad header, raw about to be replaced by less, a bad Launchpad config.
Re-running it refuses again, so two more red runs only bury the reason.

`refusal(reason)` is the `Failure` to raise for those. `allow_retries=False` makes an op
retry policy skip it, but Dagster's run retries do not read it: the instance decides
whether a failed run is retried (the `dagster/will_retry` tag) from the run's tags when the
run fails. So `refusal` also tags the step's run `dagster/max_retries=0` (the tag a retry
decision reads first) and records why in the run's event log; the run then ends with the
step's one-line reason and no retry run. Raise it from inside a step: asset and op bodies,
IO managers (pass their context), checks.

Not refusals, so still retried: an input that is not there yet (an upstream table not
built, LTV's previous snapshot missing, customers without a kept CRM answer, a missing FX
rate) and a failed blocking check (it compares tables another run may be rewriting). An
asset backfill may launch a run while the run building its input is still going (seen in
the UI journey: LTV's later days launched before its earlier days were rebuilt); the retry
runs after it and succeeds.
"""

from __future__ import annotations

from collections.abc import Mapping

from dagster import DagsterInstance, DagsterInvariantViolationError, Failure, OpExecutionContext

# The run tag a refused run gets: its retry budget is spent (Dagster's `dagster/max_retries`,
# which a run-retry decision reads before the instance's `run_retries.max_retries`).
NOT_RETRIED = {"dagster/max_retries": "0"}


def refusal(reason: str, metadata: Mapping[str, object] | None = None, context=None) -> Failure:
    """The `Failure` for a refusal retrying cannot fix; marks the current run not retried.

    `context`: an IO manager's `InputContext`/`OutputContext` (their step is not the
    current execution context); asset, op and check bodies need none.
    """
    mark_not_retried(reason, context)
    return Failure(description=reason, metadata=metadata, allow_retries=False)


def mark_not_retried(reason: str, context=None) -> None:
    """Tag the current step's run so run retries skip it, saying why in its event log
    (for a `Failure` subclass of its own raised with `allow_retries=False`)."""
    run = _current_run(context)
    if run is not None:
        instance, run_id = run
        instance.add_run_tags(run_id, NOT_RETRIED)
        dagster_run = instance.get_run_by_id(run_id)
        if dagster_run is not None:
            instance.report_engine_event(
                f"Refused, not retried (a retry would refuse again): {reason.splitlines()[0]}",
                dagster_run,
            )


def _current_run(context) -> tuple[DagsterInstance, str] | None:
    try:
        if context is not None:
            step = context.step_context
            return step.instance, step.run_id
        current = OpExecutionContext.get()
    except DagsterInvariantViolationError:
        return None  # outside a step (a unit test calling the function): nothing to mark
    return current.instance, current.run_id
