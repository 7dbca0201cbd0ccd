"""Comparing the lakehouse with the contract's answer and with itself over time.

`reconcile_marts` checks the marts against `reference` (the contract in plain Python, read
straight from the landing files); `fingerprints` summarize each table's rows (audit
columns excluded) so two runs can be shown to leave identical tables. Only the demo and the
tests use it: the oracle is how they judge the platform, so the platform never runs it
(validation reconciles between layers, `operations/reconciliation.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from pathlib import Path

from pyspark.sql import functions as F

from backfill_platform.ranges import DayRange
from backfill_platform.reference import (
    ContractAnswer,
    StreamMessage,
    compute_contract_answer,
    ltv_daily_totals,
    revenue_by_segment,
)
from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    FCT_REVENUE_BY_SEGMENT,
    TABLE_NAMES,
)


@dataclass
class Reconciliation:
    ok: bool
    details: list[str] = field(default_factory=list)


def history_answer(
    landing: Path, last_day: date, messages: Iterable[StreamMessage] = ()
) -> ContractAnswer:
    """The contract's answer over all history up to `last_day`: what both mart
    reconciliations compare with (their ranges filter it)."""
    return compute_contract_answer(landing, last_date=last_day, messages=messages)


def table_counts(lake: LakehouseResource) -> dict[str, int]:
    return {t: lake.read(t).count() if lake.exists(t) else 0 for t in TABLE_NAMES}


def fingerprints(lake: LakehouseResource) -> dict[str, list[str]]:
    """[row count, order-independent hash of the non-audit columns] per table."""
    result = {}
    for name in TABLE_NAMES:
        if not lake.exists(name):
            continue
        df = lake.read(name)
        cols = sorted(c for c in df.columns if not c.startswith("_"))
        row = df.agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.xxhash64(*cols).cast("decimal(38,0)")).alias("h"),
        ).first()
        result[name] = [str(row["n"]), str(row["h"])]
    return result


def fct_by_key(rows) -> dict[tuple[date, str], tuple]:
    """fct_daily_revenue rows as {(event_date, currency): (orders, paid, local, usd)}."""
    return {
        (r["event_date"], r["currency"]): (
            r["orders"],
            r["paid_orders"],
            r["revenue_local"],
            r["revenue_usd"],
        )
        for r in rows
    }


def expected_fct_by_key(answer: ContractAnswer) -> dict[tuple[date, str], tuple]:
    """The contract's fct answer in the shape of `fct_by_key`."""
    return {
        k: (v.orders, v.paid_orders, v.revenue_local, v.revenue_usd)
        for k, v in answer.fct_daily_revenue.items()
    }


def reconcile_marts(
    lake: LakehouseResource,
    landing: Path,
    first_day: date,
    last_day: date,
    messages: Iterable[StreamMessage] = (),
    answer: ContractAnswer | None = None,
) -> Reconciliation:
    """fct_daily_revenue row by row, and customer_ltv by daily totals, vs the contract.

    The answer is computed from all history up to `last_day` (LTV snapshots in the range
    carry every earlier order), over the landing files and the topic's `messages`, and
    compared on the range only. A caller that reconciles several marts passes `answer`
    (`history_answer`) so the oracle reads the landing zone once.
    """
    if answer is None:
        answer = history_answer(landing, last_day, messages)
    days = DayRange.of_days(first_day, last_day)
    details: list[str] = []
    fct = fct_by_key(lake.read_partitions(FCT_DAILY_REVENUE, days.start, days.end).collect())
    expected = {k: v for k, v in expected_fct_by_key(answer).items() if k[0] >= first_day}
    fct_diff = sorted(set(fct.items()) ^ set(expected.items()), key=str)
    details.append(
        f"fct_daily_revenue: {len(fct)} rows, {len(expected)} expected, {len(fct_diff)} differing"
    )
    details += [f"  differs: {d}" for d in fct_diff[:5]]

    ltv = {
        r["snapshot_date"]: (r["customers"], r["orders"], r["revenue"])
        for r in lake.read_partitions(CUSTOMER_LTV, days.start, days.end)
        .groupBy("snapshot_date")
        .agg(
            F.count(F.lit(1)).alias("customers"),
            F.sum("lifetime_paid_orders").alias("orders"),
            F.sum("lifetime_revenue_usd").alias("revenue"),
        )
        .collect()
    }
    expected_ltv = {
        d: (c, o, Decimal(r))
        for d, (c, o, r) in ltv_daily_totals(answer, first_day, last_day).items()
        if c
    }
    ltv_diff = sorted(d for d in set(ltv) | set(expected_ltv) if ltv.get(d) != expected_ltv.get(d))
    details.append(
        f"customer_ltv: {len(ltv)} snapshot days with customers, {len(expected_ltv)} expected, "
        f"{len(ltv_diff)} differing"
    )
    details += [f"  differs on {d}: {ltv.get(d)} vs {expected_ltv.get(d)}" for d in ltv_diff[:5]]
    if answer.fx_errors:
        details.append(f"contract FX errors (days that must fail): {answer.fx_errors[:5]}")
    return Reconciliation(ok=not fct_diff and not ltv_diff, details=details)


def reconcile_segments(
    lake: LakehouseResource,
    landing: Path,
    crm_data: Path,
    first_day: date,
    last_day: date,
    answer: ContractAnswer | None = None,
) -> tuple[bool, str]:
    """marts/fct_revenue_by_segment row by row vs the contract computed from the landing
    files (or `answer`, `history_answer`'s) and the demo CRM's data (the oracle may read it;
    the platform never does)."""
    if answer is None:
        answer = history_answer(landing, last_day)
    histories = json.loads((Path(crm_data) / "customers.json").read_text(encoding="utf-8"))
    expected = {
        key: row
        for key, row in revenue_by_segment(answer, histories["customers"]).items()
        if first_day <= key[0] <= last_day
    }
    days = DayRange.of_days(first_day, last_day)
    got = {
        (r["event_date"], r["segment"], r["country"]): (
            r["orders"],
            r["paid_orders"],
            r["revenue_usd"],
        )
        for r in lake.read_partitions(FCT_REVENUE_BY_SEGMENT, days.start, days.end).collect()
    }
    differing = sorted(set(got.items()) ^ set(expected.items()), key=str)
    return not differing, (
        f"fct_revenue_by_segment: {len(got)} rows, {len(expected)} expected, "
        f"{len(differing)} differing"
    )
