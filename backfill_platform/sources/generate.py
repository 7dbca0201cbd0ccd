"""Demo source generator: a landing zone exactly to the contract, with every real-world mess.

Deterministic for a seed (one `random.Random`, nothing read from the clock), so a demo,
a test and a benchmark can regenerate the very same bytes.

`deliver_next_day` continues a generated landing zone by one day, the way the live path
receives data: the day's new orders (ids no generated order has), the lines of earlier
orders due that day (late arrivals, later versions), duplicates and malformed lines. It
replays the generation from the parameters recorded in `_generator.json`, so it is
deterministic for those parameters and the day (`make deliver-day`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

from tqdm import tqdm

CURRENCIES = {"EUR": 1.08, "GBP": 1.27, "JPY": 0.0067, "CHF": 1.12}
CURRENCY_WEIGHTS = {"USD": 0.5, "EUR": 0.2, "GBP": 0.12, "JPY": 0.1, "CHF": 0.08}
OFFSETS = ["Z"] * 6 + ["+02:00", "-05:00", "+05:30", "-08:00"]
HOT_CUSTOMER = "c-hot"
MAX_FX_GAP_DAYS = 6
# Beside the two folders of a generated landing zone: the parameters it was made from.
MANIFEST = "_generator.json"
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


def order_lines(
    rng: random.Random, order_id: str, event_at: datetime, pool: int
) -> list[tuple[datetime, str]]:
    """The versions of one order as (updated_at instant, landing line): the record format
    both sources share (the landing files here, the stream's messages in `producer.py`)."""
    return [
        (updated, _dumps(record))
        for updated, record in _order_versions(rng, order_id, event_at, pool)
    ]


def malformed_line(rng: random.Random, day: date, n: int) -> tuple[str, str]:
    """(kind, text) of a line that breaks contract 1.1 in one of `MALFORMED_KINDS`' ways."""
    return _malformed(rng, day, n)


def lateness_days(rng: random.Random) -> int:
    """Days a version arrives after it was made: mostly 0, a few 1-3, rarely up to 10."""
    return _lateness(rng)


@dataclass
class _FxWalk:
    """The FX random walk's state: today's levels and the last day a file was written."""

    level: dict[str, float] = field(default_factory=lambda: dict(CURRENCIES))
    last_written: date | None = None

    def walk(self, rng: random.Random, days: Iterable[date]) -> dict[date, dict[str, str]]:
        """Rates per day as random walks; weekends and ~3% of days skipped, gaps never > 6."""
        files: dict[date, dict[str, str]] = {}
        for day in days:
            for cur in self.level:
                self.level[cur] *= 1 + rng.gauss(0, 0.003)
            skip = day.weekday() >= 5 or rng.random() < 0.03
            if (
                self.last_written is None
                or not skip
                or (day - self.last_written).days >= MAX_FX_GAP_DAYS
            ):
                rates = {
                    cur: f"{value:.8f}".rstrip("0").rstrip(".") for cur, value in self.level.items()
                }
                if rng.random() < 0.33:
                    rates["USD"] = "1"
                files[day] = rates
                self.last_written = day
        return files


def _fx_days(rng: random.Random, start: date, end: date) -> dict[date, dict[str, str]]:
    """Rates per day from `start` to `end` (inclusive), the walk starting at `CURRENCIES`."""
    return _FxWalk().walk(rng, _days(start, end))


def _days(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


@dataclass
class _Orders:
    """One pass over order days: lines per ingest day up to `end`, and those due later."""

    deliveries: dict[date, list[str]] = field(default_factory=lambda: defaultdict(list))
    pending: dict[date, list[str]] = field(default_factory=lambda: defaultdict(list))
    stats: Counter = field(default_factory=Counter)
    fx: _FxWalk | None = None  # the FX walk after the pass's days, once its files are made


def _orders_pass(
    rng: random.Random,
    days: Sequence[date],
    end: date | None,
    orders_per_day: int,
    malformed_rate: float,
    order_id: Callable[[date, int], str],
    show: bool = False,
) -> _Orders:
    """The orders placed on `days`, each version delivered on its (possibly late) ingest day,
    sometimes twice. Lines due after `end` are kept in `pending` (what a later delivery
    holds); `end=None` keeps nothing back."""
    pool = max(50, orders_per_day * 5)
    result = _Orders()
    deliveries, stats = result.deliveries, result.stats
    n = 0
    for day in tqdm(days, desc="orders", disable=not show, file=sys.stderr):
        for _ in range(max(0, int(rng.gauss(orders_per_day, orders_per_day * 0.1)))):
            n += 1
            event_at = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(
                seconds=rng.randint(0, 86_399)
            )
            stats["orders"] += 1
            for updated, record in _order_versions(rng, order_id(day, n), event_at, pool):
                late = _lateness(rng)
                arrive = max(updated.date(), day) + timedelta(days=late)
                text = _dumps(record)
                stats["late_lines" if arrive > day else "on_time_lines"] += 1
                if end is None or arrive <= end:
                    deliveries[arrive].append(text)
                    stats["lines"] += 1
                    if rng.random() < 0.02:  # at-least-once: the same line again
                        again = arrive + timedelta(days=rng.choice([0, 0, 1, 2]))
                        if end is None or again <= end:
                            deliveries[again].append(text)
                            stats["duplicate_lines"] += 1
                        else:
                            result.pending[again].append(text)
                else:
                    result.pending[arrive].append(text)
            if rng.random() < malformed_rate * 2:  # ~2 lines per order: rate is per line
                kind, text = _malformed(rng, day, n)
                deliveries[day].append(text)
                stats[f"malformed:{kind}"] += 1
                stats["malformed_lines"] += 1
    return result


def _order_files(
    rng: random.Random, deliveries: dict[date, list[str]]
) -> Iterator[tuple[str, bytes]]:
    """Each ingest day's lines shuffled over 1-4 files, some with CRLF or a blank line."""
    for day in sorted(deliveries):
        lines = deliveries[day]
        rng.shuffle(lines)
        parts = rng.randint(1, 4)
        for p in range(parts):
            chunk = lines[p::parts]
            if not chunk:
                continue
            newline = "\r\n" if rng.random() < 0.15 else "\n"
            if rng.random() < 0.1:
                chunk = [*chunk[:1], rng.choice(["", "   "]), *chunk[1:]]
            name = f"part-{p:04d}.jsonl" if p < parts - 1 or parts == 1 else f"late-{p:04d}.jsonl"
            body = newline.join(chunk).encode() + newline.encode()
            yield f"orders/ingest_date={day.isoformat()}/{name}", body


def _fx_files(files: dict[date, dict[str, str]]) -> Iterator[tuple[str, bytes]]:
    for day, rates in files.items():
        body = "currency,usd_per_unit\n" + "".join(f"{c},{r}\n" for c, r in sorted(rates.items()))
        yield f"fx_rates/rate_date={day.isoformat()}/rates.csv", body.encode()


@dataclass(frozen=True)
class Params:
    """What a generated landing zone was made from; stored beside it as `_generator.json`."""

    start: date
    end: date
    orders_per_day: int
    seed: int
    malformed_rate: float = 0.001

    def to_json(self) -> str:
        fields = {**asdict(self), "start": self.start.isoformat(), "end": self.end.isoformat()}
        return json.dumps(fields, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Params:
        fields = json.loads(text)
        fields["start"] = date.fromisoformat(fields["start"])
        fields["end"] = date.fromisoformat(fields["end"])
        return cls(**fields)

    def describe(self) -> str:
        return f"{self.start}..{self.end} at {self.orders_per_day} orders/day (seed {self.seed})"


def read_params(out: Path) -> Params | None:
    """The parameters recorded beside a generated landing zone (None: not recorded)."""
    path = Path(out) / MANIFEST
    return Params.from_json(path.read_text()) if path.is_file() else None


def landing_days(out: Path) -> list[date]:
    """Every day a folder of either kind exists for, oldest first."""
    found: set[date] = set()
    for kind, prefix in (("orders", "ingest_date="), ("fx_rates", "rate_date=")):
        folder = Path(out) / kind
        if folder.is_dir():
            for path in folder.iterdir():
                with contextlib.suppress(ValueError):
                    found.add(date.fromisoformat(path.name.removeprefix(prefix)))
    return sorted(found)


def _base(params: Params, show: bool = False) -> tuple[_Orders, Iterator[tuple[str, bytes]]]:
    """The landing zone of `params` as (its orders pass, its files in writing order). The
    files are produced lazily: FX draws on the same generator after the order files."""
    rng = random.Random(params.seed)
    orders = _orders_pass(
        rng,
        _days(params.start, params.end),
        params.end,
        params.orders_per_day,
        params.malformed_rate,
        lambda day, n: f"o-{params.seed}-{n:08d}",
        show,
    )

    def files() -> Iterator[tuple[str, bytes]]:
        yield from _order_files(rng, orders.deliveries)
        fx = _FxWalk()
        yield from _fx_files(fx.walk(rng, _days(params.start, params.end)))
        orders.fx = fx  # the walk's state, for the days delivered after `end`

    return orders, files()


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
    """Write a landing zone as of the end of `end`; returns a summary of what was written.

    The parameters are recorded in `_generator.json` beside the two folders, so
    `deliver_next_day` can continue the same landing zone one day at a time."""
    out = Path(out)
    for kind in ("orders", "fx_rates"):
        folder = out / kind
        if folder.exists() and any(folder.iterdir()):
            if not force:
                raise FileExistsError(f"{folder} is not empty; refusing to mix generated data")
            shutil.rmtree(folder)
    params = Params(start, end, orders_per_day, seed, malformed_rate)
    show = progress if progress is not None else (end - start).days + 1 > 60
    orders, files = _base(params, show)
    written = 0
    for name, body in files:
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        written += 1
    (out / MANIFEST).write_text(params.to_json())
    return {"files": written, **dict(sorted(orders.stats.items()))}


class CannotDeliver(Exception):
    """The next day cannot be delivered into this landing zone; nothing was written."""


@dataclass
class Delivery:
    day: date
    files: list[str]
    lines: int
    new_order_lines: int
    late_lines: int
    duplicate_lines: int
    malformed_lines: int
    order_ids: list[str]

    def summary(self) -> str:
        ids = sorted(self.order_ids)
        span = f"{ids[0]}..{ids[-1]}" if ids else "none"
        return (
            f"delivered {self.day} ({len(self.files)} files): {self.lines} order lines, "
            f"{self.late_lines} of them for orders of earlier days (late or later versions), "
            f"{self.duplicate_lines} duplicated, {self.malformed_lines} malformed; "
            f"{len(ids)} new orders {span}"
        )


def _day_orders(params: Params, day: date) -> tuple[random.Random, _Orders]:
    """The orders placed on a day after the generated range: a generator of their own,
    seeded by the seed and the day, and ids `o-<seed>-<YYYYMMDD>-<n>` that no generated
    order has (those are `o-<seed>-<n>`)."""
    rng = random.Random(f"{params.seed}/{day.isoformat()}")
    orders = _orders_pass(
        rng,
        [day],
        None,
        params.orders_per_day,
        params.malformed_rate,
        lambda d, n: f"o-{params.seed}-{d:%Y%m%d}-{n:05d}",
    )
    return rng, orders


def deliver_next_day(
    out: Path, params: Params | None = None, today: date | None = None
) -> Delivery:
    """Deliver the day after the landing zone's newest day, as the generator would have:
    the orders placed that day (fresh ids) with their versions due that day, the lines of
    earlier orders that arrive late that day, duplicates, malformed lines, and the day's FX
    file if the walk writes one. Deterministic for the landing zone's parameters and the day.

    The generation is replayed (the recorded parameters, or `params` for a landing zone
    generated before they were recorded) and its last day checked against the files, so a
    landing zone that is not what the parameters make is refused rather than continued.
    The day's folders appear complete at once (written aside, then renamed).
    """
    out = Path(out)
    params = read_params(out) or params
    if params is None:
        raise CannotDeliver(f"{out}: no {MANIFEST}; pass the parameters it was generated with")
    days = landing_days(out)
    if not days:
        raise CannotDeliver(f"{out} holds no landing days; generate it first (make demo)")
    if days[0] != params.start or days[-1] < params.end:
        raise CannotDeliver(
            f"{out} holds {days[0]}..{days[-1]}, not the generated {params.start}..{params.end}"
        )
    day = days[-1] + timedelta(days=1)
    today = today or datetime.now(UTC).date()
    if day >= today:
        raise CannotDeliver(
            f"the next day, {day}, is not over yet (today is {today}, UTC); "
            "it can be delivered from tomorrow on"
        )
    orders, files = _base(params)
    for name, body in files:
        if name.startswith(f"orders/ingest_date={params.end.isoformat()}/"):
            path = out / name
            if not path.is_file() or path.read_bytes() != body:
                raise CannotDeliver(
                    f"{path} is not what {params.describe()} generates; refusing to continue it"
                )
    pending, fx = orders.pending, orders.fx
    # Days delivered since: their lines due later, their draws on the FX walk.
    for earlier in _days(params.end + timedelta(days=1), day - timedelta(days=1)):
        rng, placed = _day_orders(params, earlier)
        for arrive, lines in [*placed.deliveries.items(), *placed.pending.items()]:
            if arrive != earlier:
                pending[arrive].extend(lines)
        for _ in _order_files(
            rng, {earlier: [*pending.get(earlier, []), *placed.deliveries[earlier]]}
        ):
            pass
        fx.walk(rng, [earlier])
    rng, placed = _day_orders(params, day)
    due, own = pending.get(day, []), placed.deliveries.get(day, [])
    lines = [*due, *own]
    history = set(_history_lines(out))
    ids = {json.loads(text).get("order_id") for text in own if _is_object(text)}
    counts = Counter(lines)
    delivery = Delivery(
        day=day,
        files=[],
        lines=len(lines),
        new_order_lines=len(own),
        late_lines=sum(1 for text in lines if _event_day(text) not in (None, day)),
        duplicate_lines=sum(n - 1 for n in counts.values()) + len(set(lines) & history),
        malformed_lines=placed.stats["malformed_lines"],
        order_ids=sorted(i for i in ids if isinstance(i, str) and not i.startswith("bad-")),
    )
    order_files = list(_order_files(rng, {day: lines}))
    staged = dict([*order_files, *_fx_files(fx.walk(rng, [day]))])
    for kind in ("orders", "fx_rates"):
        parts = {n.split("/", 2)[1]: None for n in staged if n.startswith(f"{kind}/")}
        for folder in parts:
            tmp = out / kind / f".{folder}.incoming"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for name, body in staged.items():
                if name.startswith(f"{kind}/{folder}/"):
                    (tmp / name.rsplit("/", 1)[1]).write_bytes(body)
            tmp.rename(out / kind / folder)
    delivery.files = sorted(staged)
    return delivery


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _event_day(text: str) -> date | None:
    """The UTC day of a line's event_time, None when the line has no readable one."""
    try:
        record = json.loads(text)
        moment = datetime.fromisoformat(record["event_time"].replace("Z", "+00:00"))
        return moment.astimezone(UTC).date() if moment.tzinfo else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _history_lines(out: Path) -> Iterator[str]:
    for path in sorted((Path(out) / "orders").glob("ingest_date=*/*.jsonl")):
        yield from (line.rstrip("\r") for line in path.read_text().split("\n") if line.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--start", type=date.fromisoformat, default=date(2023, 1, 1))
    parser.add_argument("--end", type=date.fromisoformat, default=date(2025, 12, 31))
    parser.add_argument("--orders-per-day", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("./data/landing"))
    parser.add_argument("--malformed-rate", type=float, default=0.001)
    parser.add_argument("--force", action="store_true", help="replace existing generated data")
    parser.add_argument(
        "--deliver-next-day",
        action="store_true",
        help="add the day after the newest one to an existing landing zone (its recorded "
        "parameters win over --start/--end/--orders-per-day/--seed)",
    )
    args = parser.parse_args(argv)
    if args.deliver_next_day:
        given = Params(args.start, args.end, args.orders_per_day, args.seed, args.malformed_rate)
        try:
            delivery = deliver_next_day(args.out, given)
        except CannotDeliver as refused:
            print(f"Refused: {refused}")
            return 1
        print(delivery.summary())
        return 0
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
