"""Demo source generator: a landing zone exactly to the contract, with every real-world mess.

Deterministic for a seed (one `random.Random`, nothing read from the clock), so a demo,
a test and a benchmark can regenerate the very same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

from tqdm import tqdm

CURRENCIES = {"EUR": 1.08, "GBP": 1.27, "JPY": 0.0067, "CHF": 1.12}
CURRENCY_WEIGHTS = {"USD": 0.5, "EUR": 0.2, "GBP": 0.12, "JPY": 0.1, "CHF": 0.08}
OFFSETS = ["Z"] * 6 + ["+02:00", "-05:00", "+05:30", "-08:00"]
HOT_CUSTOMER = "c-hot"
MAX_FX_GAP_DAYS = 6
MALFORMED_KINDS = (
    "truncated_json",
    "json_array",
    "missing_order_id",
    "missing_amount",
    "missing_event_time",
    "unknown_status",
    "timestamp_without_offset",
    "impossible_date",
    "negative_amount",
    "three_decimals",
    "non_numeric_amount",
    "unknown_currency",
)


def _timestamp(moment: datetime, rng: random.Random) -> str:
    """RFC 3339 with a random offset (same instant), sometimes with fractional seconds."""
    offset = rng.choice(OFFSETS)
    if offset == "Z":
        local, suffix = moment, "Z"
    else:
        sign = 1 if offset[0] == "+" else -1
        delta = timedelta(hours=int(offset[1:3]), minutes=int(offset[4:6])) * sign
        local, suffix = moment.astimezone(timezone(delta)), offset
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    if rng.random() < 0.2:
        text += f".{local.microsecond:06d}"[: rng.choice([4, 7])]
    return text + suffix


def _lateness(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.85:
        return 0
    if roll < 0.97:
        return rng.randint(1, 3)
    return rng.randint(4, 10)


def _amount_value(rng: random.Random, amount_cents: int) -> object:
    """The same amount written as a JSON number or a JSON string, as sources do."""
    text = f"{amount_cents // 100}.{amount_cents % 100:02d}"
    style = rng.random()
    if style < 0.4:
        return text
    if style < 0.6 and amount_cents % 100 == 0:
        return amount_cents // 100
    return float(text) if rng.random() < 0.5 else _RawNumber(text)


class _RawNumber(str):
    """A decimal literal to be written unquoted (keeps `12.50` as written)."""


def _dumps(record: dict) -> str:
    raw = {k: v for k, v in record.items() if isinstance(v, _RawNumber)}
    text = json.dumps({k: ("@@" + k if k in raw else v) for k, v in record.items()})
    for key, literal in raw.items():
        text = text.replace(f'"@@{key}"', literal)
    return text


def _customer(rng: random.Random, pool: int) -> tuple[bool, str | None]:
    """(key present, customer_id): ~20% hot customer, ~8% guests, Zipf-ish otherwise."""
    roll = rng.random()
    if roll < 0.2:
        return True, HOT_CUSTOMER
    if roll < 0.28:
        return rng.random() < 0.5, None
    rank = min(int(rng.paretovariate(1.2)), pool)
    return True, f"c-{rng.randint(1, pool) if rng.random() < 0.5 else rank:06d}"


def _order_versions(rng, order_id, event_at, pool) -> list[dict]:
    has_key, customer = _customer(rng, pool)
    currency = rng.choices(list(CURRENCY_WEIGHTS), weights=list(CURRENCY_WEIGHTS.values()))[0]
    cents = rng.randint(100, 2_000_00)
    base = {"order_id": order_id}
    if has_key:
        base["customer_id"] = customer
    event_text = _timestamp(event_at, rng)
    statuses = [("placed", event_at)]
    paid_at = event_at + timedelta(minutes=rng.randint(1, 600))
    roll = rng.random()
    if roll < 0.07:
        statuses.append(("cancelled", paid_at))
    elif roll < 0.87:
        statuses.append(("paid", paid_at))
        if rng.random() < 0.05:
            statuses.append(("refunded", paid_at + timedelta(days=rng.randint(1, 5))))
    versions = []
    for status, updated in statuses:
        record = {
            **base,
            "event_time": event_text,
            "updated_at": _timestamp(updated, rng),
            "status": status,
            "currency": currency,
            "amount": _amount_value(rng, cents),
        }
        if rng.random() < 0.1:
            record["channel"] = rng.choice(["web", "app", "store"])
        if rng.random() < 0.05:
            record["items"] = rng.randint(1, 5)
        versions.append((updated, record))
    return versions


def _malformed(rng: random.Random, day: date, n: int) -> tuple[str, str]:
    kind = rng.choice(MALFORMED_KINDS)
    when = f"{day.isoformat()}T12:00:00Z"
    record = {
        "order_id": f"bad-{day:%Y%m%d}-{n}",
        "customer_id": "c-000001",
        "event_time": when,
        "updated_at": when,
        "status": "paid",
        "currency": "USD",
        "amount": "10.00",
    }
    if kind == "truncated_json":
        return kind, json.dumps(record)[: rng.randint(5, 60)]
    if kind == "json_array":
        return kind, json.dumps(list(record.values()))
    if kind.startswith("missing_"):
        record.pop(kind.removeprefix("missing_"))
    elif kind == "unknown_status":
        record["status"] = rng.choice(["PAID", "shipped"])
    elif kind == "timestamp_without_offset":
        record["event_time"] = when[:-1]
    elif kind == "impossible_date":
        record["event_time"] = "2024-02-30T10:00:00Z"
    elif kind == "negative_amount":
        record["amount"] = -5
    elif kind == "three_decimals":
        record["amount"] = "10.505"
    elif kind == "non_numeric_amount":
        record["amount"] = "abc"
    elif kind == "unknown_currency":
        record["currency"] = "XXX"
    return kind, json.dumps(record)


def _fx_days(rng: random.Random, start: date, end: date) -> dict[date, dict[str, str]]:
    """Rates per day as random walks; weekends and ~3% of days skipped, gaps never > 6 days."""
    level = dict(CURRENCIES)
    files: dict[date, dict[str, str]] = {}
    last_written = start
    day = start
    while day <= end:
        for cur in level:
            level[cur] *= 1 + rng.gauss(0, 0.003)
        skip = day.weekday() >= 5 or rng.random() < 0.03
        if day == start or not skip or (day - last_written).days >= MAX_FX_GAP_DAYS:
            rates = {cur: f"{value:.8f}".rstrip("0").rstrip(".") for cur, value in level.items()}
            if rng.random() < 0.33:
                rates["USD"] = "1"
            files[day] = rates
            last_written = day
        day += timedelta(days=1)
    return files


def generate_landing(
    out: Path,
    start: date,
    end: date,
    orders_per_day: int,
    seed: int,
    *,
    malformed_rate: float = 0.001,
    progress: bool | None = None,
    force: bool = False,
) -> dict:
    """Write a landing zone as of the end of `end`; returns a summary of what was written."""
    out = Path(out)
    for kind in ("orders", "fx_rates"):
        folder = out / kind
        if folder.exists() and any(folder.iterdir()):
            if not force:
                raise FileExistsError(f"{folder} is not empty; refusing to mix generated data")
            shutil.rmtree(folder)
    rng = random.Random(seed)
    pool = max(50, orders_per_day * 5)
    days = (end - start).days + 1
    show = progress if progress is not None else days > 60
    deliveries: dict[date, list[str]] = defaultdict(list)
    stats: Counter = Counter()
    n = 0
    for offset in tqdm(range(days), desc="orders", disable=not show, file=sys.stderr):
        day = start + timedelta(days=offset)
        for _ in range(max(0, int(rng.gauss(orders_per_day, orders_per_day * 0.1)))):
            n += 1
            event_at = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(
                seconds=rng.randint(0, 86_399)
            )
            stats["orders"] += 1
            for updated, record in _order_versions(rng, f"o-{seed}-{n:08d}", event_at, pool):
                late = _lateness(rng)
                arrive = max(updated.date(), day) + timedelta(days=late)
                text = _dumps(record)
                stats["late_lines" if arrive > day else "on_time_lines"] += 1
                if arrive <= end:
                    deliveries[arrive].append(text)
                    stats["lines"] += 1
                    if rng.random() < 0.02:  # at-least-once: the same line again
                        again = arrive + timedelta(days=rng.choice([0, 0, 1, 2]))
                        if again <= end:
                            deliveries[again].append(text)
                            stats["duplicate_lines"] += 1
            if rng.random() < malformed_rate * 2:  # ~2 lines per order: rate is per line
                kind, text = _malformed(rng, day, n)
                deliveries[day].append(text)
                stats[f"malformed:{kind}"] += 1
                stats["malformed_lines"] += 1

    files_written = 0
    for day in sorted(deliveries):
        lines = deliveries[day]
        rng.shuffle(lines)
        folder = out / "orders" / f"ingest_date={day.isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        parts = rng.randint(1, 4)
        for p in range(parts):
            chunk = lines[p::parts]
            if not chunk:
                continue
            newline = "\r\n" if rng.random() < 0.15 else "\n"
            if rng.random() < 0.1:
                chunk = [*chunk[:1], rng.choice(["", "   "]), *chunk[1:]]
            name = f"part-{p:04d}.jsonl" if p < parts - 1 or parts == 1 else f"late-{p:04d}.jsonl"
            (folder / name).write_bytes(newline.join(chunk).encode() + newline.encode())
            files_written += 1
    for day, rates in _fx_days(rng, start, end).items():
        folder = out / "fx_rates" / f"rate_date={day.isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        body = "currency,usd_per_unit\n" + "".join(f"{c},{r}\n" for c, r in sorted(rates.items()))
        (folder / "rates.csv").write_text(body)
        files_written += 1
    return {"files": files_written, **dict(sorted(stats.items()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--start", type=date.fromisoformat, default=date(2023, 1, 1))
    parser.add_argument("--end", type=date.fromisoformat, default=date(2025, 12, 31))
    parser.add_argument("--orders-per-day", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("./data/landing"))
    parser.add_argument("--malformed-rate", type=float, default=0.001)
    parser.add_argument("--force", action="store_true", help="replace existing generated data")
    args = parser.parse_args(argv)
    summary = generate_landing(
        args.out,
        args.start,
        args.end,
        args.orders_per_day,
        args.seed,
        malformed_rate=args.malformed_rate,
        force=args.force,
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
