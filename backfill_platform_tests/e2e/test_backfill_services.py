"""A backfill launched through the webserver's GraphQL API, run by the daemon, reconciled."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance

from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.reconcile import reconcile_marts, table_counts
from backfill_platform.runner import backfill
from backfill_platform.tables import TABLE_NAMES
from backfill_platform_tests.e2e.conftest import ALL_ASSETS, BACKFILL_TIMEOUT, FIRST_DAY, LAST_DAY
from backfill_platform_tests.e2e.services import wait_for
from backfill_platform_tests.e2e.tables import lakehouse_for, partition_fingerprints
from backfill_platform_tests.harness import order_line, spark_resource_for_tests

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_ui_backfill_completes_and_reconciles(deployment, first_backfill, spark):
    status = first_backfill.status
    assert status["status"] == "COMPLETED_SUCCESS", status
    runs = status["runs"]
    assert runs and all(r["status"] == "SUCCESS" for r in runs), runs

    lake = lakehouse_for(deployment.lakehouse, spark)
    counts = table_counts(lake)
    assert all(counts[t] > 0 for t in ("raw/orders", "staging/orders", "marts/customer_ltv"))
    result = reconcile_marts(lake, deployment.landing, FIRST_DAY, LAST_DAY)
    assert result.ok, "\n".join(result.details)


def test_cancelled_backfill_leaves_no_torn_partition(deployment, first_backfill, spark, tmp_path):
    """Cancel a running backfill through the API; every partition is all-old or all-new."""
    lake = lakehouse_for(deployment.lakehouse, spark)
    before = partition_fingerprints(lake)

    # New data for the second backfill: a late delivery that changes raw, staging and marts.
    late = deployment.landing / "orders" / "ingest_date=2024-01-02" / "part-e2e-late.jsonl"
    late.write_text(
        order_line("o-e2e-late-1", "2024-01-01T08:00:00Z", customer_id="c-e2e", amount="31.00")
        + "\n"
        + order_line("o-e2e-late-2", "2024-01-02T09:30:00Z", customer_id="c-e2e", amount="7.50")
        + "\n"
    )
    dagster = deployment.dagster
    backfill_id = dagster.launch_backfill(ALL_ASSETS, FIRST_DAY.isoformat(), LAST_DAY.isoformat())

    def a_step_is_running():
        for run in dagster.backfill(backfill_id)["runs"]:
            if run["status"] == "STARTED" and "ExecutionStepStartEvent" in dagster.run_event_types(
                run["runId"]
            ):
                return run["runId"]
        return None

    running = wait_for(
        "a run of the second backfill to start a step",
        a_step_is_running,
        BACKFILL_TIMEOUT,
        interval=0.5,
        logs=dagster.logs,
    )
    status, cancels_sent_again = dagster.cancel_backfill_until_it_ends(
        backfill_id, BACKFILL_TIMEOUT
    )
    print(f"cancelled_backfill: cancels_sent_again={cancels_sent_again}")
    assert status["status"] == "CANCELED", status
    run_statuses = {r["runId"]: r["status"] for r in status["runs"]}
    assert run_statuses[running] in {"CANCELED", "FAILURE", "SUCCESS"}, run_statuses

    after_cancel = partition_fingerprints(lake)
    # The Delta log of every table is readable and its latest version loads.
    for name in TABLE_NAMES:
        assert lake.delta_table(name).history().count() >= 1, name
        lake.read(name).count()

    # The fully-new state: the same landing zone through every layer, in-process.
    scratch = build_resources(
        str(deployment.landing), str(tmp_path / "lakehouse"), spark=spark_resource_for_tests()
    )
    runs = backfill(
        all_assets,
        FIRST_DAY.isoformat(),
        LAST_DAY.isoformat(),
        scratch,
        DagsterInstance.ephemeral(),
    )
    assert all(r.success for r in runs)
    new = partition_fingerprints(scratch["lakehouse"])

    torn, cut_short, changed = [], [], []
    for name in TABLE_NAMES:
        for key in sorted(set(before[name]) | set(after_cancel[name]) | set(new[name])):
            old_state, mid, new_state = (s[name].get(key) for s in (before, after_cancel, new))
            if mid not in (old_state, new_state):
                torn.append((name, key, old_state, mid, new_state))
            if old_state != new_state:
                changed.append((name, key))
                if mid == old_state:
                    cut_short.append((name, key))
    assert not torn, f"torn partitions (old, after cancel, new): {torn}"
    assert changed, "the late delivery should change some partitions"
    assert cut_short, f"the cancel came too late: every changed partition is new ({changed})"
