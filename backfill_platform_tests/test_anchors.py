"""The benchmark's independent anchors compute the contract's marts: DuckDB and a
plain PySpark job, both written without the platform's transforms, equal the contract's
answer (reference.py) on a landing zone with late, duplicated and malformed lines."""

from datetime import date

import pytest

from backfill_platform import reference
from backfill_platform.sources.generate import generate_landing
from benchmarks.anchor_duckdb import normalized, run_duckdb
from benchmarks.anchor_spark import run_anchor_spark

FIRST, LAST = date(2024, 1, 1), date(2024, 1, 15)


@pytest.fixture(scope="module")
def landing(tmp_path_factory):
    root = tmp_path_factory.mktemp("anchors") / "landing"
    generate_landing(root, FIRST, LAST, 120, 7, malformed_rate=0.02, progress=False)
    return root


@pytest.fixture(scope="module")
def contract(landing):
    answer = reference.compute_contract_answer(landing, first_date=FIRST, last_date=LAST)
    assert answer.rejects, "the landing zone should hold malformed lines"
    fct = [
        (day, currency, r.orders, r.paid_orders, r.revenue_local, r.revenue_usd)
        for (day, currency), r in answer.fct_daily_revenue.items()
    ]
    ltv = [
        (day, customer, *value)
        for (day, customer), value in reference.customer_ltv_rows(answer, FIRST, LAST).items()
    ]
    return normalized(fct), normalized(ltv)


def test_duckdb_anchor_equals_the_contract(landing, contract):
    fct, ltv = run_duckdb(landing, FIRST, LAST, threads=2)
    assert (normalized(fct), normalized(ltv)) == contract


def test_plain_spark_anchor_equals_the_contract(landing, contract, spark, tmp_path):
    run_anchor_spark(spark, landing, FIRST, LAST, tmp_path)
    fct = [tuple(r) for r in spark.read.parquet(str(tmp_path / "fct_daily_revenue")).collect()]
    ltv = [tuple(r) for r in spark.read.parquet(str(tmp_path / "customer_ltv")).collect()]
    assert normalized(fct) == contract[0]
    assert normalized(ltv) == contract[1]
