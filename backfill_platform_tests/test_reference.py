"""The oracle and the Spark parser must agree on every rule, or one of them is wrong."""

from datetime import date
from decimal import Decimal

import pytest

from backfill_platform.reference import _Invalid, compute_contract_answer, validate
from backfill_platform_tests.harness import Platform, order_line
from backfill_platform_tests.test_contract_rules import ACCEPTED, REJECTS


@pytest.mark.parametrize(("name", "line", "reason"), REJECTS, ids=[r[0] for r in REJECTS])
def test_oracle_rejects_like_spark(name, line, reason):
    with pytest.raises(_Invalid) as invalid:
        validate(line.encode())
    assert str(invalid.value) == reason


@pytest.mark.parametrize(("name", "line", "amount"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_oracle_accepts_like_spark(name, line, amount):
    assert validate(line.encode())["amount"] == amount


def test_fx_reach_blank_lines_bom_and_unknown_currency(tmp_path):
    platform = Platform(tmp_path, tmp_path, tmp_path / "lake", None, {})
    platform.write_rates("2024-01-01", {"EUR": "1.1"})
    platform.write_orders(
        "2024-01-08",
        [
            order_line("a", "2024-01-08T10:00:00Z", currency="EUR"),  # rate 7 days old: ok
            order_line("b", "2024-01-08T10:00:00Z", currency="CHF"),  # no rate anywhere
        ],
    )
    platform.write_bytes(
        "orders",
        "ingest_date=2024-01-09",
        "x.jsonl",
        b"\xef\xbb\xbf"
        + order_line("c", "2024-01-09T10:00:00Z", currency="EUR").encode()
        + b"\r\n  \n\xff\n",
    )
    answer = compute_contract_answer(tmp_path)
    assert [(r.order_id) for r in answer.staging.values()] == ["a", "c"]
    assert {(r.line_number, r.reason) for r in answer.rejects} == {
        (2, "unknown_currency"),
        (3, "invalid_utf8"),
    }
    assert answer.blank_line_counts == {date(2024, 1, 9): 1}
    assert answer.fct_daily_revenue[(date(2024, 1, 8), "EUR")].revenue_usd == Decimal("11.000")
    assert answer.fx_errors == [(date(2024, 1, 9), "EUR")]  # 8 days after the only rate
