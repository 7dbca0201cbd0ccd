"""The platform against the contract computed in plain Python from the landing files alone."""

from datetime import date

import pytest

from backfill_platform.reconcile import expected_fct_by_key, fct_by_key
from backfill_platform.reference import compute_contract_answer, customer_ltv_rows
from backfill_platform.sources.generate import generate_landing

START, END = date(2024, 1, 1), date(2024, 1, 20)


@pytest.mark.slow
def test_marts_equal_the_contracts_answer_and_a_rerun_changes_no_row(platform):
    summary = generate_landing(platform.landing, START, END, 25, seed=11, malformed_rate=0.01)
    assert summary["malformed_lines"] > 0 and summary["duplicate_lines"] > 0
    runs = platform.backfill(START.isoformat(), END.isoformat(), per_run=8)
    assert all(r.success for r in runs)
    answer = compute_contract_answer(platform.landing, first_date=START, last_date=END)
    assert not answer.fx_errors

    raw_per_day = {}
    for r in platform.rows("raw/orders"):
        raw_per_day[r["ingest_date"]] = raw_per_day.get(r["ingest_date"], 0) + 1
    assert raw_per_day == answer.raw_line_counts

    staged = {r["order_id"]: r for r in platform.rows("staging/orders")}
    assert set(staged) == set(answer.staging)
    for order_id, expected in answer.staging.items():
        got = staged[order_id]
        assert (got["status"], got["amount"], got["event_date"], got["customer_id"]) == (
            expected.status,
            expected.amount,
            expected.event_date,
            expected.customer_id,
        ), order_id
        assert (got["ingest_date"], got["file_name"], got["line_number"]) == (
            expected.ingest_date,
            expected.file_name,
            expected.line_number,
        ), order_id

    rejects = {
        (r["ingest_date"], r["file_name"], r["line_number"]): r["reason"]
        for r in platform.rows("staging/orders_rejects")
    }
    assert rejects == {
        (r.ingest_date, r.file_name, r.line_number): r.reason for r in answer.rejects
    }

    assert fct_by_key(platform.rows("marts/fct_daily_revenue")) == expected_fct_by_key(answer)

    ltv = {
        (r["snapshot_date"], r["customer_id"]): (
            r["lifetime_paid_orders"],
            r["lifetime_revenue_usd"],
            r["first_order_date"],
        )
        for r in platform.rows("marts/customer_ltv")
    }
    assert ltv == customer_ltv_rows(answer, START, END)

    before = platform.snapshot()
    platform.backfill(START.isoformat(), END.isoformat(), per_run=20)  # other chunking
    assert platform.snapshot() == before
