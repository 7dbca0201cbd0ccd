"""`backfill-platform backfill` and `retry` as subprocesses against the real webserver + daemon.

The CLI launches one Dagster asset backfill over GraphQL and follows it; the daemon runs it
under deploy/dagster.yaml (run queue, pools, `dagster/backfill` limit 1). The tables equal an
in-process run's; a failing backfill exits non-zero and `retry` re-runs only what failed.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys

import pytest
from dagster import AssetKey, DagsterInstance, RunsFilter

from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.deployment import REASON_TAG
from backfill_platform.reconcile import fingerprints
from backfill_platform.runner import TRIGGER_TAG, backfill
from backfill_platform.tables import TABLE_NAMES
from backfill_platform_tests.e2e.conftest import FIRST_DAY, LAST_DAY
from backfill_platform_tests.e2e.services import FINISHED_BACKFILL, REPO_ROOT, cli_env, run_cli
from backfill_platform_tests.e2e.tables import lakehouse_for
from backfill_platform_tests.harness import spark_resource_for_tests

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FIRST, LAST = FIRST_DAY.isoformat(), LAST_DAY.isoformat()


def instance_of(deployment) -> DagsterInstance:
    return DagsterInstance.from_config(str(deployment.dagster.home))


def targeted(deployment, backfill_id: str) -> dict[str, int]:
    status = deployment.dagster.graphql(
        """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
          ... on PartitionBackfill { assetBackfillData { assetBackfillStatuses {
            ... on AssetPartitionsStatusCounts { assetKey { path } numPartitionsTargeted }
          } } } } }""",
        {"id": backfill_id},
    )["partitionBackfillOrError"]["assetBackfillData"]["assetBackfillStatuses"]
    return {"/".join(s["assetKey"]["path"]): s["numPartitionsTargeted"] for s in status}


def test_cli_backfill_runs_on_the_deployment_and_equals_in_process(deployment, spark, tmp_path):
    everything = ",".join(TABLE_NAMES)
    result, payload = run_cli(
        deployment, "backfill", "--select", everything, "--start", FIRST, "--end", LAST,
        "--reason", "e2e: the CLI through the deployment",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    backfill_id = payload["backfill_id"]
    assert payload["outcome"] == "COMPLETED_SUCCESS"
    assert payload["backfill_url"].endswith(f"/runs/b/{backfill_id}")
    assert f"backfill {backfill_id} launched" in result.stderr  # before the bar
    assert "partitions" in result.stderr and "runs" in result.stderr  # the progress bar

    # Each asset exactly its three days: nothing widened through the FX mapping.
    assert targeted(deployment, backfill_id) == {name: 3 for name in TABLE_NAMES}

    instance = instance_of(deployment)
    assert backfill_id in {b.backfill_id for b in instance.get_backfills()}
    records = instance.get_run_records(RunsFilter(tags={"dagster/backfill": backfill_id}))
    assert records and all(r.dagster_run.is_success for r in records)
    for record in records:
        run = record.dagster_run
        assert run.tags[TRIGGER_TAG] == "backfill"
        assert run.tags[REASON_TAG] == "e2e: the CLI through the deployment"
        pools = run.run_op_concurrency.all_pools if run.run_op_concurrency else set()
        assert pools and pools <= {"lakehouse_raw", "lakehouse_downstream"}, run.run_id
    # deploy/dagster.yaml: `dagster/backfill` limit 1, so the backfill's runs never overlap.
    spans = sorted((r.start_time, r.end_time) for r in records)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans)), spans

    # The same landing zone in process, into a scratch lakehouse: the same tables.
    scratch = build_resources(
        str(deployment.landing), str(tmp_path / "lakehouse"), spark=spark_resource_for_tests()
    )
    backfill(all_assets, FIRST, LAST, scratch, DagsterInstance.ephemeral())
    deployed = fingerprints(lakehouse_for(deployment.lakehouse, spark))
    # The CRM history keeps each answer with its fetch time: equal rows, not equal bytes.
    deployed.pop("raw/crm_customer_history", None)
    local = fingerprints(scratch["lakehouse"])
    local.pop("raw/crm_customer_history", None)
    assert deployed == local


def test_failed_backfill_exits_non_zero_and_retry_reruns_only_what_failed(deployment):
    """Orders' landing file of a built day goes missing: raw/orders refuses to shrink (the
    preservation guard) while raw/fx_rates succeeds; the file comes back; retry reruns orders."""
    day = deployment.landing / "orders" / f"ingest_date={FIRST}"
    hidden = deployment.landing.parent / "hidden-orders"
    day.rename(hidden)
    try:
        result, payload = run_cli(
            deployment, "backfill", "--select", "raw/orders,raw/fx_rates",
            "--start", FIRST, "--end", LAST, "--tag", "dagster/max_retries=0",
        )  # fmt: skip
    finally:
        hidden.rename(day)
    assert result.returncode == 1, result.stdout + result.stderr
    failed_id = payload["backfill_id"]
    assert payload["outcome"] != "COMPLETED_SUCCESS"
    retry, retried_payload = run_cli(deployment, "retry", failed_id)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    retried = retried_payload["backfill_id"]
    assert retried_payload["outcome"] == "COMPLETED_SUCCESS"
    assert retried != failed_id
    assert targeted(deployment, retried) == {"raw/orders": 3}
    instance = instance_of(deployment)
    runs = instance.get_run_records(RunsFilter(tags={"dagster/backfill": retried}))
    assert runs and all(r.dagster_run.is_success for r in runs)
    assert {k for r in runs for k in r.dagster_run.asset_selection} == {AssetKey(["raw", "orders"])}


def test_ctrl_c_leaves_the_backfill_running_and_cancel_stops_it(deployment):
    """Ctrl-C while following: exit 130 naming the backfill and how to cancel it; the
    backfill is still on the deployment; `cancel` ends it CANCELED."""
    process = subprocess.Popen(
        [sys.executable, "-m", "backfill_platform", "backfill", "--select", "raw/fx_rates",
         "--start", FIRST, "--end", LAST, "--json"],
        cwd=REPO_ROOT, env=cli_env(deployment), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        for line in process.stderr:
            if " launched: " in line:
                break
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, out
    payload = json.loads(out)
    backfill_id = payload["backfill_id"]
    assert f"backfill-platform cancel {backfill_id}" in payload["error"]
    assert deployment.dagster.backfill(backfill_id)["status"] not in FINISHED_BACKFILL

    result, cancelled = run_cli(deployment, "cancel", backfill_id)
    assert result.returncode == 1 and cancelled["outcome"] == "CANCELED", cancelled
