"""What the UI's "Materialize" dialog really targets: Dagster's own backfill computation.

Sends the mutation the UI sends (`launchPartitionBackfill` with `partitionNames` and every
materializable asset, as the unfiltered "Materialize all" of the global lineage does) to a
real workspace (the code location in a gRPC code server) on a real instance, then reads,
per asset, the partitions Dagster's asset backfill targets. Nothing runs: the backfill
record alone holds the target, so no daemon is needed.
"""

from __future__ import annotations

import pytest
from dagster import AssetMaterialization, DagsterInstance, SkipReason, build_sensor_context
from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

from backfill_platform.assets.reference import FX_CURRENCIES, observe_currencies
from backfill_platform.automation.stale_sensor import stale_partitions_sensor
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LandingZoneResource, SparkSessionResource
from backfill_platform.tables import RAW_ORDERS, SHADOW_GROUP

FIRST, LAST = "2025-01-01", "2025-12-31"
D = "2025-06-10"

ASSET_KEYS = """
query AssetKeys { assetNodes { assetKey { path } groupName isMaterializable isPartitioned } }
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
    }
  }
}
"""

STATUSES = """
query Statuses($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill {
      assetBackfillData {
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts { assetKey { path } numPartitionsTargeted }
        }
      }
    }
  }
}
"""


def launch_ui_backfill(context, first: str, last: str) -> tuple[str, list[dict]]:
    """The UI's mutation of an unfiltered "Materialize all" on the global lineage: every
    materializable asset, the `shadow/...` twins included, `partitionNames` first..last."""
    nodes = execute_dagster_graphql(context, ASSET_KEYS).data["assetNodes"]
    selection = [{"path": n["assetKey"]["path"]} for n in nodes if n["isMaterializable"]]
    assert any(n["groupName"] == SHADOW_GROUP for n in nodes)
    params = {
        "assetSelection": selection,
        "partitionNames": DayRange(first, last).partition_keys(),
        "fromFailure": False,
        "tags": [],
    }
    result = execute_dagster_graphql(context, LAUNCH, {"params": params}).data[
        "launchPartitionBackfill"
    ]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    return result["backfillId"], selection


def targets_of(context, backfill_id: str, selection) -> dict[str, tuple[int, list]]:
    """Asset -> (partitions targeted, their ranges), as the Backfills page reads them; an
    asset of the selection the backfill targets nothing of: (0, [])."""
    data = execute_dagster_graphql(context, STATUSES, {"id": backfill_id}).data
    counts = {
        "/".join(s["assetKey"]["path"]): s["numPartitionsTargeted"]
        for s in data["partitionBackfillOrError"]["assetBackfillData"]["assetBackfillStatuses"]
        if s
    }
    targets = {}
    for key in selection:
        name = "/".join(key["path"])
        if not counts.get(name):
            targets[name] = (0, [])
            continue
        data = execute_dagster_graphql(context, TARGETED, {"id": backfill_id, "key": key}).data[
            "partitionBackfillOrError"
        ]
        ranges = data["partitionsTargetedForAssetKey"]["ranges"] or []
        targets[name] = (counts[name], [(r["start"], r["end"]) for r in ranges])
    return targets


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """The code location in a gRPC code server over one year of partitions, on a real
    instance in a temp DAGSTER_HOME."""
    monkeypatch.setenv("BACKFILL_START_DATE", FIRST)
    monkeypatch.setenv("BACKFILL_END_DATE", LAST)
    with (
        DagsterInstance.local_temp(str(tmp_path)) as instance,
        define_out_of_process_context("workspace.yaml", None, instance) as context,
    ):
        yield instance, context


def test_ui_backfill_of_three_days_targets_only_their_lineage(workspace):
    """All assets x D..D+2 from the UI: raw exactly the 3 days; staging the event days those
    ingest days can hold (late arrivals: D-10..D+2); the marts what staging and FX of those
    days reach (FX reach: ..D+2+7). Dagster does not widen through customer_ltv's
    previous-day self-dependency: LTV gets the same days as daily revenue, and the later
    snapshots are left to the staleness audit (its LTV rule), not to this backfill."""
    _, context = workspace
    backfill_id, selection = launch_ui_backfill(context, D, "2025-06-12")
    targets = targets_of(context, backfill_id, selection)
    assert "reference/fx_currencies" not in targets  # observed, never materialized
    # The twins are in the selection but the backfill targets none of their partitions: a
    # twin needs a shadow suffix, and no mapping from production days reaches it.
    twins = {name for name in targets if name.startswith(f"{SHADOW_GROUP}/")}
    assert len(twins) == 6
    assert {name: targets.pop(name) for name in twins} == {name: (0, []) for name in twins}
    expected = {
        "raw/orders": ("2025-06-10", "2025-06-12"),
        "raw/fx_rates": ("2025-06-10", "2025-06-12"),
        "staging/orders": ("2025-05-31", "2025-06-12"),
        "staging/orders_rejects": ("2025-05-31", "2025-06-12"),
        "marts/fct_daily_revenue": ("2025-05-31", "2025-06-19"),
        "marts/customer_ltv": ("2025-05-31", "2025-06-19"),
        # The CRM's tables follow staging's days (customers of those orders), the segment
        # mart the daily revenue's.
        "raw/crm_customer_history": ("2025-05-31", "2025-06-12"),
        "staging/customers": ("2025-05-31", "2025-06-12"),
        "marts/fct_revenue_by_segment": ("2025-05-31", "2025-06-19"),
    }
    assert {name: ranges for name, (_, ranges) in targets.items()} == {
        name: [span] for name, span in expected.items()
    }
    assert {name: count for name, (count, _) in targets.items()} == {
        name: len(DayRange(*span)) for name, span in expected.items()
    }


def test_no_staleness_audit_is_queued_behind_a_requested_backfill(workspace):
    """A late delivery could make days stale, but the UI backfill just launched will
    rebuild them: the audit waits for it instead of taking a run slot now."""
    instance, context = workspace
    instance.report_runless_asset_event(
        AssetMaterialization(RAW_ORDERS, partition=D, metadata={"late_rows": 1})
    )
    backfill_id, _ = launch_ui_backfill(context, D, "2025-06-12")
    with build_sensor_context(instance=instance) as sensor_context:
        result = stale_partitions_sensor(sensor_context)
    assert isinstance(result, SkipReason)
    assert result.skip_message == (
        f"audit deferred: ['backfill {backfill_id}'] still writing tables (it would be moot)"
    )


def test_known_currencies_version_changes_only_when_a_currency_appears(tmp_path):
    """The reference node's data version (what Dagster's staleness compares) follows the
    set of codes with a valid rate line, not the FX deliveries."""
    landing = LandingZoneResource(
        landing_dir=str(tmp_path / "landing"), spark=SparkSessionResource()
    )

    def deliver(day: str, body: str) -> dict:
        folder = tmp_path / "landing" / "fx_rates" / f"rate_date={day}"
        folder.mkdir(parents=True)
        (folder / "rates.csv").write_text("currency,usd_per_unit\n" + body)
        observe_currencies(landing, instance)
        (record,) = instance.fetch_observations(FX_CURRENCIES, limit=1).records
        observation = record.asset_observation
        return {
            "codes": observation.metadata["currencies"].value,
            "version": observation.tags["dagster/data_version"],
        }

    (tmp_path / "home").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        first = deliver("2025-06-10", "EUR,1.1\nbad,1\nGBP,0\n")  # invalid lines: not known
        assert first["codes"] == "EUR,USD"
        same = deliver("2025-06-11", "EUR,1.12\n")
        assert same == first
        grown = deliver("2025-06-12", "EUR,1.1\nJPY,0.0067\n")
        assert grown["codes"] == "EUR,JPY,USD" and grown["version"] != first["version"]
