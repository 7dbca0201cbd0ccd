"""Every rule of contract sections 1.1 and 1.2, through the real assets where it matters."""

import json
import shutil
import uuid
from decimal import Decimal

import pytest
from pyspark.sql import functions as F

from backfill_platform.tables import RAW_FX_RATES
from backfill_platform.transforms import fx
from backfill_platform.transforms.fx import KNOWN_AFTER, KNOWN_FROM, known_currencies
from backfill_platform.transforms.orders import parse_orders
from backfill_platform_tests.harness import order_line

VALID = json.loads(order_line("o1", "2024-02-29T23:30:00-02:00", currency="EUR"))


def _line(**changes):
    record = {**VALID, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not ...})


REJECTS = [
    ("not json", "{bad", "invalid_json"),
    ("NaN", _line(amount=1).replace("1}", "NaN}"), "invalid_json"),
    ("duplicate key", '{"order_id":"a","order_id":"b"}', "invalid_json"),
    ("array", "[1, 2]", "not_an_object"),
    ("missing order_id", _line(order_id=...), "missing_field:order_id"),
    ("null amount", _line(amount=None), "missing_field:amount"),
    ("missing event_time", _line(event_time=...), "missing_field:event_time"),
    ("numeric order_id", _line(order_id=17), "wrong_type:order_id"),
    ("numeric customer", _line(customer_id=5), "wrong_type:customer_id"),
    ("nested status", _line(status={"v": "paid"}), "wrong_type:status"),
    ("boolean amount", _line(amount=True), "wrong_type:amount"),
    ("empty order_id", _line(order_id=""), "empty_order_id"),
    ("no offset", _line(event_time="2024-02-29T23:30:00"), "invalid_timestamp:event_time"),
    ("Feb 30", _line(event_time="2024-02-30T10:00:00Z"), "invalid_timestamp:event_time"),
    ("bad updated_at", _line(updated_at="yesterday"), "invalid_timestamp:updated_at"),
    ("unknown status", _line(status="PAID"), "unknown_status"),
    ("exponent", _line(amount=1).replace('"amount": 1', '"amount": 1e2'), "invalid_amount"),
    ("negative", _line(amount=-5), "negative_amount"),
    ("negative string", _line(amount="-5.00"), "negative_amount"),
    ("non-decimal string", _line(amount="12,50"), "invalid_amount"),
    ("three decimals", _line(amount="1.505"), "too_many_decimals"),
    ("huge", _line(amount="12345678901234567"), "amount_out_of_range"),
]

ACCEPTED = [
    ("number with 2 decimals", _line(amount=12.5), Decimal("12.50")),
    ("string amount", _line(amount="7.25"), Decimal("7.25")),
    ("integer", _line(amount=3), Decimal("3.00")),
    ("minus zero", _line(amount=-0.0).replace("-0.0", "-0.00"), Decimal("0.00")),
    ("trailing zeros", _line(amount="1.500"), Decimal("1.50")),
    ("guest, key absent", _line(customer_id=...), Decimal("10.00")),
    ("extra fields", _line(channel="web", items=[1, 2]), Decimal("10.00")),
]


def _parse(spark, lines):
    df = spark.createDataFrame([(i, line) for i, line in enumerate(lines)], "n int, line string")
    return {
        r["n"]: r
        for r in parse_orders(df.withColumn("line_bytes", F.lit(None).cast("binary"))).collect()
    }


def test_each_reject_kind_gets_its_reason(spark):
    parsed = _parse(spark, [line for _, line, _ in REJECTS])
    got = {name: parsed[i]["reject_reason"] for i, (name, _, _) in enumerate(REJECTS)}
    assert got == {name: reason for name, _, reason in REJECTS}
    assert all(parsed[i]["order_id"] is None for i in range(len(REJECTS)))


def test_valid_lines_parse_exactly(spark):
    parsed = _parse(spark, [line for _, line, _ in ACCEPTED])
    for i, (name, _, amount) in enumerate(ACCEPTED):
        row = parsed[i]
        assert row["reject_reason"] is None, name
        assert row["amount"] == amount, name
    first = parsed[0]
    # 23:30 at -02:00 is 01:30 UTC the next day: the event_date is the UTC date.
    assert str(first["event_date"]) == "2024-03-01"
    assert str(first["event_time"]) == "2024-03-01 01:30:00"
    assert parsed[5]["customer_id"] is None


@pytest.mark.slow
def test_late_duplicate_out_of_order_and_tied_versions_resolve_by_the_contract(platform):
    day1, day2, day3 = "2024-01-01", "2024-01-02", "2024-01-03"
    for day in (day1, day2, day3):
        platform.write_rates(day, {"EUR": "1.10000000"})
    platform.write_orders(
        day1,
        [
            order_line("late", "2024-01-01T10:00:00Z", "2024-01-01T10:00:00Z", "placed"),
            order_line("tie", "2024-01-01T11:00:00Z", "2024-01-01T12:00:00Z", "paid"),
            order_line("ooo", "2024-01-01T09:00:00Z", "2024-01-01T09:00:00Z", "placed"),
            "",
            "   ",
        ],
    )
    platform.write_orders(
        day2,
        [
            # Out of order: the paid version arrived first (day 2 file a) ...
            order_line("ooo", "2024-01-01T09:00:00Z", "2024-01-01T18:00:00+01:00", "paid"),
            # ... equal updated_at instant, written with another offset: the later arrival wins
            order_line("tie", "2024-01-01T11:00:00Z", "2024-01-01T13:00:00+01:00", "cancelled"),
        ],
        name="a.jsonl",
    )
    platform.write_orders(
        day3,
        [
            # ... then an older version arrives late and must not win.
            order_line("ooo", "2024-01-01T09:00:00Z", "2024-01-01T10:00:00Z", "placed"),
            # A late paid version of day 1's order folds into day 1.
            order_line("late", "2024-01-01T10:00:00Z", "2024-01-03T08:00:00Z", "paid"),
            # The same line again (at-least-once delivery).
            order_line("late", "2024-01-01T10:00:00Z", "2024-01-03T08:00:00Z", "paid"),
            '{"order_id": "broken"',
        ],
    )
    platform.materialize(day1, day3)
    staged = {r["order_id"]: r for r in platform.rows("staging/orders")}
    assert {k: v["status"] for k, v in staged.items()} == {
        "late": "paid",
        "tie": "cancelled",
        "ooo": "paid",
    }
    assert staged["late"]["raw_versions"] == 3
    assert {str(v["event_date"]) for v in staged.values()} == {day1}
    rejects = platform.rows("staging/orders_rejects")
    assert [(str(r["ingest_date"]), r["line_number"], r["reason"]) for r in rejects] == [
        (day3, 4, "invalid_json")
    ]
    assert len(platform.rows("raw/orders")) == 3 + 2 + 4  # blank lines are not rows
    fct = platform.rows("marts/fct_daily_revenue")
    assert [(r["orders"], r["paid_orders"], r["revenue_local"]) for r in fct] == [
        (3, 2, Decimal("20.00"))
    ]
    assert fct[0]["currency"] == "USD" and fct[0]["revenue_usd"] == Decimal("20.0000000000")


@pytest.mark.slow
def test_fx_uses_the_latest_rate_within_seven_days_and_fails_beyond(platform):
    platform.write_rates("2024-01-01", {"EUR": "1.10000000", "JPY": "0.00670001"})
    platform.write_rates("2024-01-05", {"EUR": "1.20000000"})  # no JPY that day
    platform.write_orders(
        "2024-01-08",
        [
            order_line("e1", "2024-01-08T10:00:00Z", currency="EUR", amount="10.00"),
            order_line("j1", "2024-01-08T10:00:00Z", currency="JPY", amount="1000"),
            order_line("u1", "2024-01-08T10:00:00Z", currency="USD", amount="2.50"),
        ],
    )
    platform.write_orders(
        "2024-01-09", [order_line("j2", "2024-01-09T10:00:00Z", currency="JPY", amount="1")]
    )
    platform.materialize("2024-01-01", "2024-01-09", selection=["raw/orders", "raw/fx_rates"])
    platform.materialize(
        "2024-01-01", "2024-01-09", selection=["staging/orders", "staging/orders_rejects"]
    )
    platform.materialize("2024-01-08", selection=["marts/fct_daily_revenue"])
    fct = {r["currency"]: r["revenue_usd"] for r in platform.rows("marts/fct_daily_revenue")}
    # EUR uses Jan 5 (3 days old), JPY uses Jan 1 (exactly 7 days old), USD is 1.
    assert fct == {
        "EUR": Decimal("12.0000000000"),
        "JPY": Decimal("6.7000100000"),
        "USD": Decimal("2.5000000000"),
    }
    before = platform.version("marts/fct_daily_revenue")
    failed = platform.materialize(
        "2024-01-08", "2024-01-09", selection=["marts/fct_daily_revenue"], raise_on_error=False
    )
    assert not failed.success
    error = next(e for e in failed.all_events if e.event_type_value == "STEP_FAILURE")
    assert "2024-01-09 JPY" in error.step_failure_data.error.message
    assert platform.version("marts/fct_daily_revenue") == before


def test_known_currencies_follow_every_new_version_and_a_recreated_table(platform):
    """Kept per version of raw/fx_rates in the process: a new rates file (a new version) and
    a table deleted and created again at its path (version 0 again, a new table id) are read
    anew, never answered from what an older table said."""
    lake = platform.resources["lakehouse"]
    platform.write_rates("2024-01-01", {"EUR": "1.10000000"})
    platform.materialize("2024-01-01", selection=["raw/fx_rates"])
    assert known_currencies(lake) == ["EUR", "USD"] == known_currencies(lake)
    platform.write_rates("2024-01-02", {"JPY": "0.00670001"})
    platform.materialize("2024-01-02", selection=["raw/fx_rates"])
    assert known_currencies(lake) == ["EUR", "JPY", "USD"]

    shutil.rmtree(lake.table_path(RAW_FX_RATES))
    shutil.rmtree(platform.landing / "fx_rates")
    platform.write_rates("2024-01-01", {"GBP": "1.25000000"})
    platform.materialize("2024-01-01", selection=["raw/fx_rates"])
    assert platform.version("raw/fx_rates") == 0
    assert known_currencies(lake) == ["GBP", "USD"]


def test_a_rates_write_records_the_known_currencies_only_when_its_delivery_tells_them(platform):
    """A write whose delivery brings every currency known before it, or whose days held no
    row, records the known set after it on its commit, and a new process's first answer is
    that record, with no Spark job, equal to a scan of the table. A delivery that leaves a
    known currency out, or a commit that records nothing (a RESTORE), leaves it to a scan."""
    lake = platform.resources["lakehouse"]

    def recorded():
        meta = lake.newest_commit(RAW_FX_RATES).user_metadata
        return meta.get(KNOWN_AFTER), meta.get(KNOWN_FROM)

    def scanned():
        rows = lake.read(RAW_FX_RATES).where(F.col("reject_reason").isNull()).select("currency")
        return sorted({"USD", *(r["currency"] for r in rows.distinct().collect())})

    def answer_in_a_new_process():
        """The answer, and whether it took a Spark job."""
        fx._KNOWN.clear()
        context, group = lake.session.sparkContext, uuid.uuid4().hex
        context.setJobGroup(group, "known_currencies")
        try:
            known = known_currencies(lake)
        finally:
            context.setJobGroup("", "")
        return known, bool(context.statusTracker().getJobIdsForGroup(group))

    platform.write_rates("2024-01-01", {"EUR": "1.10000000", "XYZ": "-1"})
    platform.materialize("2024-01-01", selection=["raw/fx_rates"])
    assert recorded() == ("EUR,USD", "none:-1")  # the table's first commit; XYZ invalid
    table_id, _ = lake.content_id(RAW_FX_RATES)
    platform.write_rates("2024-01-02", {"JPY": "0.00670001"})  # a day that held nothing
    platform.materialize("2024-01-02", selection=["raw/fx_rates"])
    assert recorded() == ("EUR,JPY,USD", f"{table_id}:0")
    assert answer_in_a_new_process() == (["EUR", "JPY", "USD"], False)
    assert scanned() == ["EUR", "JPY", "USD"]

    platform.write_rates("2024-01-02", {"GBP": "1.25"}, name="more.csv")  # EUR left out
    platform.materialize("2024-01-02", selection=["raw/fx_rates"])
    assert recorded() == (None, None)
    assert answer_in_a_new_process() == (["EUR", "GBP", "JPY", "USD"], True)

    platform.write_rates("2024-01-03", {"EUR": "1.1", "GBP": "1.25", "JPY": "0.0067"})
    platform.materialize("2024-01-03", selection=["raw/fx_rates"])
    assert recorded() == ("EUR,GBP,JPY,USD", f"{table_id}:2")
    assert answer_in_a_new_process() == (["EUR", "GBP", "JPY", "USD"], False)
    assert scanned() == ["EUR", "GBP", "JPY", "USD"]
    platform.materialize("2024-01-04", selection=["raw/fx_rates"])  # no file: removes nothing
    assert recorded() == ("EUR,GBP,JPY,USD", f"{table_id}:3")

    lake.delta_table(RAW_FX_RATES).restoreToVersion(1)
    assert answer_in_a_new_process() == (["EUR", "JPY", "USD"], True)
    assert scanned() == ["EUR", "JPY", "USD"]

    # A record on a commit that does not follow the version it was derived from (another
    # writer committed in between) is not trusted: version 6 carries version 4's record.
    stale = {KNOWN_AFTER: "EUR,GBP,JPY,USD", KNOWN_FROM: f"{table_id}:3"}
    lake.record_unchanged(RAW_FX_RATES, stale)
    assert (lake.newest_commit(RAW_FX_RATES).version, recorded()) == (
        6,
        ("EUR,GBP,JPY,USD", f"{table_id}:3"),
    )
    assert answer_in_a_new_process() == (["EUR", "JPY", "USD"], True)
