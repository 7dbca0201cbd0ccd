"""The incident this product exists to prevent, and the rules that make re-runs safe."""

import json

import pytest
from dagster import AssetKey

from backfill_platform.tables import TABLE_NAMES
from backfill_platform_tests.harness import Platform, order_line

DAYS = ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05", "2024-01-06"]


def _deliver_week(platform: Platform) -> None:
    for i, day in enumerate(DAYS):
        platform.write_rates(day, {"EUR": f"1.{10 + i}", "GBP": "1.25"})
        platform.write_orders(
            day,
            [
                order_line(f"o{i}a", f"{day}T08:00:00Z", customer_id="c1", currency="EUR"),
                order_line(f"o{i}b", f"{day}T09:00:00+02:00", customer_id="c2", amount=3),
                order_line(f"o{i}c", f"{day}T10:00:00Z", customer_id=None, status="placed"),
                # delivered twice (at-least-once): must not double anything
                order_line(f"o{i}a", f"{day}T08:00:00Z", customer_id="c1", currency="EUR"),
            ],
        )
    # A late version of day 2's order arrives on day 5 and wins.
    platform.write_orders(
        DAYS[4],
        [order_line("o1b", "2024-01-02T09:00:00+02:00", "2024-01-05T00:00:00Z", "refunded")],
        name="late.jsonl",
    )


@pytest.mark.slow
def test_backfilling_a_range_twice_leaves_every_table_identical(platform):
    """The doubled-history incident: a second backfill must not add a second copy."""
    _deliver_week(platform)
    runs = platform.backfill(DAYS[0], DAYS[-1], per_run=3)
    assert all(r.success for r in runs) and len(runs) == 4  # 2 raw chunks + 2 downstream
    first = platform.snapshot()
    versions = {t: platform.version(t) for t in first}
    platform.backfill(DAYS[0], DAYS[-1], per_run=3)
    assert platform.snapshot() == first
    # Every table that replaces its days really rewrote them; the CRM's two, whose re-run
    # kept no answer and found its days recorded, made no version of the same rows.
    recorded = {"raw/crm_customer_history", "staging/customers"}
    assert recorded <= set(first)
    assert all(platform.version(t) > versions[t] for t in set(first) - recorded)
    assert all(platform.version(t) == versions[t] for t in recorded)

    staged = first["staging/orders"]
    assert len(staged) == len({r["order_id"] for r in staged}) == 18
    assert next(r for r in staged if r["order_id"] == "o1b")["status"] == "refunded"
    fct = {(str(r["event_date"]), r["currency"]): r for r in first["marts/fct_daily_revenue"]}
    assert fct[("2024-01-01", "EUR")]["orders"] == 1
    assert fct[("2024-01-02", "USD")]["paid_orders"] == 0  # o1b was refunded late
    assert len(first["raw/orders"]) == 6 * 4 + 1  # every delivered line, duplicates kept

    # Every commit names its run, range and code version.
    commit = platform.resources["lakehouse"].history("marts/fct_daily_revenue", limit=1)[0]
    meta = commit["metadata"]
    assert meta["code_version"] == "fct-daily-revenue-1"
    assert (meta["partition_start"], meta["partition_end"]) == ("2024-01-04", "2024-01-07")
    assert platform.instance.get_run_by_id(meta["dagster_run_id"]) is not None


@pytest.mark.slow
def test_rerunning_one_partition_inside_a_range_changes_nothing_else(platform):
    _deliver_week(platform)
    platform.backfill(DAYS[0], DAYS[-1], per_run=6)
    before = platform.snapshot()
    result = platform.materialize(
        DAYS[2], selection=["staging/orders", "staging/orders_rejects", "marts/fct_daily_revenue"]
    )
    assert platform.snapshot() == before
    mats = result.asset_materializations_for_node("marts__fct_daily_revenue")
    assert [m.partition for m in mats] == [DAYS[2]]
    metadata = mats[0].metadata
    assert metadata["rows_written"].value == 2 and metadata["partition_range"].value == (
        "[2024-01-03, 2024-01-04)"
    )
    last = platform.resources["lakehouse"].history("staging/orders", limit=1)[0]
    assert (last["metadata"]["partition_start"], last["metadata"]["partition_end"]) == (
        "2024-01-03",
        "2024-01-04",
    )


@pytest.mark.slow
def test_customer_ltv_refuses_to_skip_ahead_and_ranges_equal_day_by_day(platform, tmp_path):
    _deliver_week(platform)
    platform.materialize(DAYS[0], DAYS[-1], selection=["raw/orders", "raw/fx_rates"])
    platform.materialize(DAYS[0], DAYS[-1], selection=["staging/orders", "staging/orders_rejects"])
    skipped = platform.materialize(
        DAYS[3], DAYS[4], selection=["marts/customer_ltv"], raise_on_error=False
    )
    assert not skipped.success
    failure = next(e for e in skipped.all_events if e.event_type_value == "STEP_FAILURE")
    assert "no snapshot for 2024-01-03" in failure.step_failure_data.error.message

    platform.materialize(DAYS[0], DAYS[-1], selection=["marts/customer_ltv"])
    ranged = platform.rows("marts/customer_ltv")
    for day in DAYS:  # the same snapshots, one run per day, oldest first
        platform.materialize(day, selection=["marts/customer_ltv"])
    assert platform.rows("marts/customer_ltv") == ranged
    c1 = [r for r in ranged if r["customer_id"] == "c1"]
    assert [r["lifetime_paid_orders"] for r in c1] == [1, 2, 3, 4, 5, 6]
    assert {str(r["first_order_date"]) for r in c1} == {"2024-01-01"}
    assert not any(r["customer_id"] is None for r in ranged)


@pytest.mark.slow
def test_raw_counts_come_from_the_write_on_a_first_ingest_and_a_reingest(platform):
    """raw/orders' row counts are Spark observations of the write itself (no cache on a
    first ingest); a re-ingest, which the guard compares first, reports the same."""
    platform.write_rates(DAYS[0], {"EUR": "1.10"})
    platform.write_orders(DAYS[0], [order_line("a"), "", "  ", "{not json", order_line("b")])
    platform.write_orders(
        DAYS[1],
        [order_line("c", "2023-12-31T23:00:00Z"), order_line("d", "2024-01-02T01:00:00Z")],
        name="p.jsonl",
    )
    expected = {
        DAYS[0]: {"rows": 3, "blank_lines_skipped": 2, "invalid_rows": 1, "late_rows": 0},
        DAYS[1]: {"rows": 2, "blank_lines_skipped": 0, "invalid_rows": 0, "late_rows": 1},
    }
    for _ in ("first ingest", "re-ingest"):
        for day, counts in expected.items():
            result = platform.materialize(day, selection=["raw/orders", "raw/fx_rates"])
            (mat,) = result.asset_materializations_for_node("raw__orders")
            assert {k: mat.metadata[k].value for k in counts} == counts
            assert mat.metadata["rows_written"].value == counts["rows"]
            (fx,) = result.asset_materializations_for_node("raw__fx_rates")
            assert fx.metadata["rows"].value == (1 if day == DAYS[0] else 0)


def test_definitions_load_with_every_contract_asset_key():
    from backfill_platform.definitions import defs

    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert set(TABLE_NAMES) <= keys
    graph = defs.resolve_asset_graph()
    staging = graph.get(AssetKey(["staging", "orders"]))
    assert AssetKey(["raw", "orders"]) in staging.parent_keys
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        if node.is_materializable:
            assert node.backfill_policy is not None, key
    json.dumps(sorted(keys))
