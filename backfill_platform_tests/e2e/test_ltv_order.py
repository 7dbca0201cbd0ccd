"""customer_ltv's snapshots are committed oldest first by a UI backfill on the deployment.

Snapshot D is D-1 plus day D, so a range built before the range before it reads an old
snapshot and stays stale (issue 36, item 2). The UI's backfill names raw days; Dagster widens
it to staging's late-arrival days and LTV's FX reach, so LTV's target runs past staging's.
Before the fix the daemon requested those later LTV days while staging was still running,
ahead of the earlier ones (docs/lineage.md, "Order of the LTV chunks").
"""

from __future__ import annotations

import time
from datetime import timedelta
from itertools import pairwise

import pytest

from backfill_platform.tables import CUSTOMER_LTV, SHADOW_GROUP
from backfill_platform_tests.e2e.conftest import BACKFILL_TIMEOUT, FIRST_DAY, LAST_DAY
from backfill_platform_tests.e2e.tables import lakehouse_for
from backfill_platform_tests.e2e.test_cli_deployment import cli
from backfill_platform_tests.test_ui_backfill_targets import ASSET_KEYS, LAUNCH

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def launch_ui_backfill(dagster, first: str, last: str) -> str:
    """The UI's mutation over HTTP: every materializable production asset, raw days."""
    nodes = dagster.graphql(ASSET_KEYS)["assetNodes"]
    selection = [
        {"path": n["assetKey"]["path"]}
        for n in nodes
        if n["isMaterializable"] and n["groupName"] != SHADOW_GROUP
    ]
    days = [f"{first[:8]}{day:02d}" for day in range(int(first[8:]), int(last[8:]) + 1)]
    params = {"assetSelection": selection, "partitionNames": days, "fromFailure": False}
    result = dagster.graphql(LAUNCH, {"params": params})["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    return result["backfillId"]


def test_ui_backfill_commits_ltv_snapshots_oldest_first(deployment, first_backfill, spark):
    """After the first backfill (LTV snapshots exist for its days, as in any deployment), a
    UI backfill of its raw days: the old code built LTV 01-04..01-10 from the old 01-03
    snapshot before rebuilding 01-01..01-03."""
    started = time.monotonic()
    lake = lakehouse_for(deployment.lakehouse, spark)
    before = max((c["version"] for c in lake.history(CUSTOMER_LTV)), default=-1)

    backfill_id = launch_ui_backfill(
        deployment.dagster, FIRST_DAY.isoformat(), LAST_DAY.isoformat()
    )
    status = deployment.dagster.wait_backfill(backfill_id, BACKFILL_TIMEOUT)
    assert status["status"] == "COMPLETED_SUCCESS", status

    commits = sorted(
        (c for c in lake.history(CUSTOMER_LTV) if c["version"] > before),
        key=lambda c: c["version"],
    )
    ranges = [
        (c["metadata"]["partition_start"], c["metadata"]["partition_end"])
        for c in commits
        if c["metadata"].get("partition_start")
    ]
    print(f"LTV commits in version order: {ranges}")
    # Raw 01-01..01-03 reach LTV 01-01..01-10 (FX reach): every range starts where the one
    # before ended, from the first day to the last, none out of order.
    assert ranges and ranges[0][0].startswith(FIRST_DAY.isoformat()), ranges
    assert ranges[-1][1].startswith((LAST_DAY + timedelta(days=8)).isoformat()), ranges
    for (_, end), (start, _) in pairwise(ranges):
        assert start == end, f"LTV range {start} committed out of order: {ranges}"

    # Nothing the backfill built is stale for the staleness audit (its cumulative LTV rule).
    result, payload = cli(deployment, "stale")
    assert result.returncode == 0, payload
    print(f"UI backfill + audit: {time.monotonic() - started:.0f} s")
