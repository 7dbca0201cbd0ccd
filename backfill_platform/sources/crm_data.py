"""The demo CRM's data, written beside a generated landing zone (contract 1.3).

`generate_crm(landing, crm_dir, seed)` reads the customer ids of the landing zone's orders
and writes `crm_dir/customers.json`: for each customer a history of versions (segment,
country) changing over the years, some customers unknown to the CRM, some whose first
version starts after their first orders, and a few changes placed exactly at an order's
event_time (written with another offset, the same instant). With `unicode_orders` it first
adds one order file of customers with Unicode ids (spaces, `/`, accents, CJK) to the
landing zone. Deterministic for a seed, and it draws on its own generator: the landing
zone `generate_landing` wrote for that seed is unchanged apart from the added file.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, date, datetime, time, timedelta, timezone
from pathlib import Path

from backfill_platform.reference import parse_timestamp
from backfill_platform.sources.crm_server import CUSTOMERS_FILE

SEGMENTS = ("consumer", "smb", "enterprise")
COUNTRIES = ("US", "DE", "GB", "FR", "JP", "CH", "BR", None)
UNICODE_CUSTOMERS = ("ü-müller", "客户 42", "a/b c", "ëlodie + ñ", "Ωmega%20")
UNICODE_FILE = "crm-unicode-customers.jsonl"
_OFFSETS = (timedelta(0), timedelta(hours=2), timedelta(hours=-5), timedelta(hours=5, minutes=30))


def _text(moment: datetime, rng: random.Random) -> str:
    offset = rng.choice(_OFFSETS)
    local = moment.astimezone(timezone(offset))
    return local.isoformat().replace("+00:00", "Z")


def _orders(landing: Path) -> list[tuple[str, datetime]]:
    """(customer_id, event instant) of every parseable order line with a customer."""
    found = []
    for path in sorted((landing / "orders").glob("ingest_date=*/*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or not isinstance(record.get("customer_id"), str):
                continue
            at = parse_timestamp(str(record.get("event_time", "")))
            if at is not None:
                found.append((record["customer_id"], at))
    return found


def _write_unicode_orders(landing: Path, seed: int, rng: random.Random) -> None:
    days = sorted((landing / "orders").glob("ingest_date=*"))
    if not days:
        return
    lines = []
    for n, customer in enumerate(UNICODE_CUSTOMERS):
        folder = days[n % len(days)]
        day = date.fromisoformat(folder.name.removeprefix("ingest_date="))
        at = datetime.combine(day, time(rng.randint(0, 23), rng.randint(0, 59)), UTC)
        lines.append(
            json.dumps(
                {
                    "order_id": f"u-{seed}-{n:04d}",
                    "customer_id": customer,
                    "event_time": _text(at, rng),
                    "updated_at": _text(at + timedelta(minutes=5), rng),
                    "status": "paid",
                    "currency": "USD",
                    "amount": f"{rng.randint(100, 99999) / 100:.2f}",
                },
                ensure_ascii=False,
            )
        )
    (days[0] / UNICODE_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")


def generate_crm(landing: Path, crm_dir: Path, seed: int, *, unicode_orders: bool = True) -> dict:
    """Write `crm_dir/customers.json` for the landing zone's customers; returns counts."""
    landing, crm_dir = Path(landing), Path(crm_dir)
    rng = random.Random(f"crm-{seed}")
    if unicode_orders:
        _write_unicode_orders(landing, seed, rng)
    orders = _orders(landing)
    if not orders:
        raise ValueError(f"{landing}: no orders with a customer_id; generate the landing first")
    first = min(at for _, at in orders)
    last = max(at for _, at in orders)
    span = max((last - first).total_seconds(), 1.0)
    customers = sorted({c for c, _ in orders})
    histories: dict[str, list[dict]] = {}
    late_start = unknown = 0
    for customer in customers:
        if customer not in UNICODE_CUSTOMERS and customer != "c-hot" and rng.random() < 0.06:
            unknown += 1
            continue
        if rng.random() < 0.1:
            start = first + timedelta(seconds=rng.uniform(0, span))
            late_start += 1
        else:
            start = first - timedelta(days=rng.randint(1, 400), seconds=rng.randint(0, 86399))
        moments = {start} | {
            first + timedelta(seconds=rng.uniform(0, span)) for _ in range(rng.randint(0, 3))
        }
        histories[customer] = [
            {"valid_from": m, "segment": rng.choice(SEGMENTS), "country": rng.choice(COUNTRIES)}
            for m in moments
            if m >= start
        ]
    # A few changes exactly at an order's event_time.
    exact = 0
    for customer, at in rng.sample(orders, min(5, len(orders))):
        versions = histories.get(customer)
        if versions is None or any(v["valid_from"] == at for v in versions):
            continue
        versions.append({"valid_from": at, "segment": "enterprise", "country": "CH"})
        exact += 1
    payload = {
        customer: [
            {**v, "valid_from": _text(v["valid_from"], rng)}
            for v in rng.sample(versions, len(versions))  # any order, as the contract allows
        ]
        for customer, versions in histories.items()
    }
    crm_dir.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"seed": seed, "customers": payload}, ensure_ascii=False, indent=1)
    (crm_dir / CUSTOMERS_FILE).write_text(body + "\n", encoding="utf-8")
    return {
        "customers": len(customers),
        "known": len(histories),
        "unknown": unknown,
        "first_version_after_first_orders": late_start,
        "changes_at_an_event_time": exact,
    }
