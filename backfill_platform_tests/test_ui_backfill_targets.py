"""What the UI's "Materialize" dialog really targets: Dagster's own backfill computation.

Sends the mutation the UI sends (`launchPartitionBackfill` with `partitionNames` and every
materializable asset) to a real workspace (the code location in a gRPC code server) on a
real instance, then reads, per asset, the partitions Dagster's asset backfill targets.
Nothing runs: the backfill record alone holds the target, so no daemon is needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DagsterInstance
from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

from backfill_platform.ranges import DayRange

FIRST, LAST = "2025-01-01", "2025-12-31"
D = "2025-06-10"

ASSET_KEYS = """
query AssetKeys { assetNodes { assetKey { path } isMaterializable isPartitioned } }
"""

LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

TARGETED = """
query Targeted($id: String!, $key: AssetKeyInput!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill {
      partitionsTargetedForAssetKey(assetKey: $key) { ranges { start end } }
      assetBackfillData {
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts { assetKey { path } numPartitionsTargeted }
        }
      }
    }
  }
}
"""


def ui_backfill_targets(
    home: Path, first: str, last: str
) -> dict[str, tuple[int, list[tuple[str, str]]]]:
    """Asset -> (partitions targeted, their ranges) for the UI's all-assets backfill."""
    with (
        DagsterInstance.local_temp(str(home)) as instance,
        define_out_of_process_context("workspace.yaml", None, instance) as context,
    ):
        nodes = execute_dagster_graphql(context, ASSET_KEYS).data["assetNodes"]
        selection = [{"path": n["assetKey"]["path"]} for n in nodes if n["isMaterializable"]]
        params = {
            "assetSelection": selection,
            "partitionNames": DayRange(first, last).partition_keys(),
            "fromFailure": False,
            "tags": [],
        }
        launched = execute_dagster_graphql(context, LAUNCH, {"params": params}).data
        result = launched["launchPartitionBackfill"]
        assert result["__typename"] == "LaunchBackfillSuccess", result
        targets = {}
        for key in selection:
            data = execute_dagster_graphql(
                context, TARGETED, {"id": result["backfillId"], "key": key}
            ).data["partitionBackfillOrError"]
            counts = {
                "/".join(s["assetKey"]["path"]): s["numPartitionsTargeted"]
                for s in data["assetBackfillData"]["assetBackfillStatuses"]
                if s
            }
            name = "/".join(key["path"])
            ranges = data["partitionsTargetedForAssetKey"]["ranges"] or []
            targets[name] = (counts[name], [(r["start"], r["end"]) for r in ranges])
        return targets


@pytest.fixture
def one_year(monkeypatch):
    monkeypatch.setenv("BACKFILL_START_DATE", FIRST)
    monkeypatch.setenv("BACKFILL_END_DATE", LAST)


def test_ui_backfill_of_three_days_targets_only_their_lineage(one_year, tmp_path):
    """All assets x D..D+2 from the UI: raw exactly the 3 days; staging the event days those
    ingest days can hold (late arrivals: D-10..D+2); the marts what staging and FX of those
    days reach (FX reach: ..D+2+7). Dagster does not widen through customer_ltv's
    previous-day self-dependency: LTV gets the same days as daily revenue, and the later
    snapshots are left to the staleness audit (its LTV rule), not to this backfill."""
    targets = ui_backfill_targets(tmp_path, D, "2025-06-12")
    assert "reference/fx_currencies" not in targets  # observed, never materialized
    expected = {
        "raw/orders": ("2025-06-10", "2025-06-12"),
        "raw/fx_rates": ("2025-06-10", "2025-06-12"),
        "staging/orders": ("2025-05-31", "2025-06-12"),
        "staging/orders_rejects": ("2025-05-31", "2025-06-12"),
        "marts/fct_daily_revenue": ("2025-05-31", "2025-06-19"),
        "marts/customer_ltv": ("2025-05-31", "2025-06-19"),
    }
    assert {name: ranges for name, (_, ranges) in targets.items()} == {
        name: [span] for name, span in expected.items()
    }
    assert {name: count for name, (count, _) in targets.items()} == {
        name: len(DayRange(*span)) for name, span in expected.items()
    }
