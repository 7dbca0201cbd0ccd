"""Property-based tests: however the same logical events are delivered (order, duplicates,
files, days), latest-wins and dedupe give the same staging and marts; and the range-overwrite
rule holds for arbitrary sequences of writes.

The delivery properties run many examples against the plain-Python oracle (no Spark), and a
few against the Spark transforms themselves (`parse_orders`, `latest_wins`, `with_usd`,
`daily_revenue`) on tiny landing zones, without Dagster, so they stay fast.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from datetime import date, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from backfill_platform.reconcile import expected_fct_by_key, fct_by_key
from backfill_platform.reference import compute_contract_answer
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.lakehouse import TableWriteError
from backfill_platform.transforms.fx import parse_rates, with_usd
from backfill_platform.transforms.lines import read_lines
from backfill_platform.transforms.orders import latest_wins, parse_orders, with_unknown_currency
from backfill_platform.transforms.revenue import daily_revenue
from backfill_platform_tests.harness import order_line, spark_resource_for_tests

pytestmark = [pytest.mark.reliability]

DAY0 = date(2024, 1, 1)
RATES = {"EUR": "1.08500000", "GBP": "1.27100000"}
_stats: dict[str, int] = defaultdict(int)
# Examples per property: Spark examples cost seconds each, oracle examples milliseconds.
_FULL = os.environ.get("RELIABILITY_SIZE", "small") == "full"
SPARK_EXAMPLES, RANGE_EXAMPLES, ORACLE_EXAMPLES = (20, 12, 1000) if _FULL else (6, 5, 150)


@st.composite
def logical_orders(draw, max_orders: int = 5):
    """Orders, each with 1-4 versions at distinct updated_at (ties are another property)."""
    orders = []
    for n in range(draw(st.integers(1, max_orders))):
        day = draw(st.integers(0, 2))
        event = datetime(2024, 1, 1, 8) + timedelta(days=day, minutes=draw(st.integers(0, 600)))
        currency = draw(st.sampled_from(["USD", "EUR", "GBP"]))
        customer = draw(st.sampled_from(["c1", "c2", None]))
        steps = sorted(draw(st.sets(st.integers(0, 5000), min_size=1, max_size=4)))
        for step in steps:
            # An offset spelling varies: the instant, not the text, decides the latest.
            offset = draw(st.sampled_from([0, 60, -120]))
            at = event + timedelta(minutes=step + offset)
            stamp = at.strftime("%Y-%m-%dT%H:%M:%S") + (
                "Z" if offset == 0 else f"{'+' if offset > 0 else '-'}{abs(offset) // 60:02d}:00"
            )
            orders.append(
                order_line(
                    f"o{n}",
                    event.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    stamp,
                    status=draw(st.sampled_from(["placed", "paid", "paid", "refunded"])),
                    currency=currency,
                    amount=draw(st.sampled_from(["10.00", "0.01", "99.99", 5, 12.5])),
                    customer_id=customer,
                )
            )
    return orders


@st.composite
def deliveries(draw, lines: list[str]):
    """Each line delivered 1-3 times, to random (ingest day, file) slots, in random order."""
    copies = [line for line in lines for _ in range(draw(st.integers(1, 3)))]
    copies = draw(st.permutations(copies))
    slots: dict[tuple[int, str], list[str]] = defaultdict(list)
    for line in copies:
        slot = (draw(st.integers(3, 5)), draw(st.sampled_from(["a.jsonl", "b.jsonl"])))
        slots[slot].append(line)
    return dict(slots)


def _write(root: Path, delivery: dict[tuple[int, str], list[str]]) -> list[Path]:
    files = []
    for (offset, name), lines in sorted(delivery.items()):
        folder = root / "orders" / f"ingest_date={DAY0 + timedelta(days=offset)}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("".join(x + "\n" for x in lines))
        files.append(folder / name)
    for offset in range(3):
        folder = root / "fx_rates" / f"rate_date={DAY0 + timedelta(days=offset)}"
        folder.mkdir(parents=True, exist_ok=True)
        body = "currency,usd_per_unit\n" + "".join(f"{c},{r}\n" for c, r in RATES.items())
        (folder / "rates.csv").write_text(body)
    return files


def _answer(delivery):
    with tempfile.TemporaryDirectory() as tmp:
        _write(Path(tmp), delivery)
        answer = compute_contract_answer(Path(tmp))
    staging = {
        k: (v.status, v.amount, v.updated_at, v.customer_id) for k, v in answer.staging.items()
    }
    return staging, answer.fct_daily_revenue


@settings(max_examples=ORACLE_EXAMPLES, deadline=None)
@given(data=st.data())
def test_oracle_delivery_order_and_duplicates_never_change_the_answer(data):
    lines = data.draw(logical_orders())
    canonical = _answer({(3, "a.jsonl"): lines})
    shuffled = _answer(data.draw(deliveries(lines)))
    _stats["oracle_examples"] += 1
    assert shuffled == canonical


@settings(max_examples=ORACLE_EXAMPLES // 2, deadline=None)
@given(data=st.data())
def test_oracle_exact_ties_go_to_the_last_arrival(data):
    """Equal updated_at instants: the later ingest day, then file, then line wins."""
    versions = [
        order_line("t", "2024-01-01T10:00:00Z", "2024-01-01T12:00:00Z", status=s, amount=a)
        for s, a in [("placed", "1.00"), ("paid", "2.00"), ("cancelled", "3.00")]
    ]
    delivery = data.draw(deliveries(versions))
    last = max((day, name, i) for (day, name), ls in delivery.items() for i in range(len(ls)))
    expected_line = delivery[last[:2]][last[2]]
    staging, _ = _answer(delivery)
    _stats["oracle_tie_examples"] += 1
    assert staging["t"][0] == json.loads(expected_line)["status"]


def _spark_answer(spark, root: Path, files: list[Path]):
    """The Spark transforms on the landing files: staging rows and fct, no Dagster."""
    lines = read_lines(spark, files, "ingest_date")
    raw = parse_orders(lines.where(~F.col("is_blank")).drop("is_blank")).withColumnRenamed(
        "day", "ingest_date"
    )
    valid = with_unknown_currency(raw, ["USD", *RATES]).where(F.col("reject_reason").isNull())
    staged = latest_wins(valid)
    fx_files = sorted((root / "fx_rates").rglob("*.csv"))
    rates = parse_rates(read_lines(spark, fx_files, "rate_date"))
    fct = fct_by_key(daily_revenue(with_usd(staged, rates)).collect())
    staging = {
        r["order_id"]: (r["status"], r["amount"], r["updated_at"], r["customer_id"])
        for r in staged.collect()
    }
    versions = {r["order_id"]: r["raw_versions"] for r in staged.collect()}
    return staging, fct, versions


@settings(
    max_examples=SPARK_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_spark_latest_wins_and_marts_equal_the_oracle_for_any_delivery(spark, data):
    lines = data.draw(logical_orders(max_orders=4))
    delivery = data.draw(deliveries(lines))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = _write(root, delivery)
        answer = compute_contract_answer(root)
        staging, fct, versions = _spark_answer(spark, root, files)
    expected = {
        k: (v.status, v.amount, v.updated_at.replace(tzinfo=None), v.customer_id)
        for k, v in answer.staging.items()
    }
    _stats["spark_examples"] += 1
    _stats["rows_checked"] += len(staging) + len(fct)
    assert staging == expected
    assert fct == expected_fct_by_key(answer)
    # Dedupe keeps count of every delivered copy: nothing silently dropped.
    assert sum(versions.values()) == sum(len(x) for x in delivery.values())


@st.composite
def range_writes(draw):
    """A few writes of [start, end) ranges over 8 days; some carry a row outside the range."""
    writes = []
    for w in range(draw(st.integers(1, 4))):
        start = draw(st.integers(0, 6))
        end = draw(st.integers(start + 1, 8))
        days = draw(st.lists(st.integers(start, end - 1), max_size=4))
        stray = draw(st.booleans()) and draw(st.booleans())  # ~1 in 4 writes
        if stray:
            days = [*days, draw(st.sampled_from([d for d in range(9) if not start <= d < end]))]
        writes.append((start, end, [(d, f"w{w}-{i}") for i, d in enumerate(days)], stray))
    return writes


@settings(
    max_examples=RANGE_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(writes=range_writes())
def test_replace_range_leaves_exactly_the_model(spark, writes):
    """After any sequence of writes, the table holds, per day, the rows of the last write
    whose range covered that day; a write with a row outside its range changes nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        lake = LakehouseResource(root_dir=tmp, spark=spark_resource_for_tests())
        model: dict[date, set[str]] = {}
        for start, end, rows, stray in writes:
            first, last = DAY0 + timedelta(days=start), DAY0 + timedelta(days=end)
            df = spark.createDataFrame(
                [(DAY0 + timedelta(days=d), tag) for d, tag in rows], "d date, tag string"
            )
            _stats["range_writes"] += 1
            if stray:
                with pytest.raises(TableWriteError):
                    lake.replace_range("t/prop", df, "d", first, last, {})
                _stats["refused_writes"] += 1
            else:
                lake.replace_range("t/prop", df, "d", first, last, {})
                for n in range(start, end):
                    model.pop(DAY0 + timedelta(days=n), None)
                for d, tag in rows:
                    model.setdefault(DAY0 + timedelta(days=d), set()).add(tag)
            if lake.exists("t/prop"):
                got: dict[date, set[str]] = {}
                for r in lake.read("t/prop").collect():
                    got.setdefault(r["d"], set()).add(r["tag"])
                assert got == model


@pytest.fixture(scope="module", autouse=True)
def _report(figures):
    yield
    figures.update(_stats, trials=sum(v for k, v in _stats.items() if k.endswith("examples")))
