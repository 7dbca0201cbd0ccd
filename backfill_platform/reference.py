"""The data contract in plain Python: the answer the lakehouse must equal.

Independent of Spark on purpose (standard library only), so tests and the demo can check
the platform against the contract read straight from the landing files.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal, localcontext
from pathlib import Path

STATUSES = {"placed", "paid", "refunded", "cancelled"}
REQUIRED = ("order_id", "event_time", "updated_at", "status", "currency", "amount")
STRING_FIELDS = ("event_time", "updated_at", "status", "currency")
TIMESTAMP = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|([+-])(\d{2}):(\d{2}))$"
)
DECIMAL_TEXT = re.compile(r"^\d+(\.\d+)?$")
NEGATIVE_TEXT = re.compile(r"^-\d+(\.\d+)?$")
RATE_TEXT = re.compile(r"^\d+(\.\d{1,8})?$")
CURRENCY_CODE = re.compile(r"^[A-Z]{3}$")
HEADER = "currency,usd_per_unit"
REACH_DAYS = 7
MAX_AMOUNT = Decimal(10) ** 16


@dataclass(frozen=True)
class Reject:
    ingest_date: date
    file_name: str
    line_number: int
    reason: str
    text: str


@dataclass(frozen=True)
class StagedOrder:
    order_id: str
    customer_id: str | None
    event_time: datetime
    event_date: date
    updated_at: datetime
    status: str
    currency: str
    amount: Decimal
    ingest_date: date
    file_name: str | None  # None: the winning version came from the topic
    line_number: int | None


@dataclass(frozen=True)
class StreamMessage:
    """A message as the broker stored it (contract 1.4): where, when, and its value."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    value: bytes

    @property
    def ingest_date(self) -> date:
        return datetime.fromtimestamp(self.timestamp_ms / 1000, UTC).date()


@dataclass(frozen=True)
class FctRow:
    orders: int
    paid_orders: int
    revenue_local: Decimal
    revenue_usd: Decimal


@dataclass(frozen=True)
class ContractAnswer:
    raw_line_counts: dict[date, int]
    blank_line_counts: dict[date, int]
    rejects: list[Reject]
    staging: dict[str, StagedOrder]
    valid_records_per_event_date: dict[date, int]
    fct_daily_revenue: dict[tuple[date, str], FctRow]
    fx_errors: list[tuple[date, str]]
    fx_rejects: list[tuple[date, str, int, str]]
    ignored_paths: list[str]
    rates: dict[tuple[date, str], Decimal] = field(default_factory=dict)
    # Contract 1.4: messages per ingest day, and rejected ones (topic, partition, offset, reason).
    message_counts: dict[date, int] = field(default_factory=dict)
    message_rejects: list[tuple[str, int, int, str]] = field(default_factory=list)


class _Invalid(Exception):
    """A line breaks a rule; the message is the reject reason."""


class _Number(str):
    """A JSON number, kept as its literal text."""


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()
    for number, piece in enumerate(pieces, start=1):
        yield number, piece[:-1] if piece.endswith(b"\r") else piece


def _is_blank(piece: bytes) -> bool:
    return not piece.strip(b" \t")


def non_blank_lines(path: Path) -> int:
    """Lines of a landing file that count as records (contract 1.1: blank lines aside)."""
    return sum(1 for _, piece in _lines(path) if not _is_blank(piece))


def _day_folders(root: Path, prefix: str, ignored: list[str]) -> Iterator[tuple[date, Path]]:
    if not root.is_dir():
        return
    for folder in sorted(root.iterdir()):
        try:
            day = date.fromisoformat(folder.name.removeprefix(prefix))
            if not folder.name.startswith(prefix) or day.isoformat() != folder.name[len(prefix) :]:
                raise ValueError
        except ValueError:
            ignored.append(str(folder))
            continue
        yield day, folder


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise _Invalid("invalid_json")
    return dict(pairs)


def _reject_constant(_: str) -> None:
    raise _Invalid("invalid_json")


def parse_timestamp(text: str) -> datetime | None:
    """RFC 3339 with offset, calendar-checked, truncated to microseconds, in UTC."""
    match = TIMESTAMP.match(text)
    if not match:
        return None
    y, mo, d, h, mi, s, frac, zone, sign, oh, om = match.groups()
    if zone == "Z":
        offset = timedelta(0)
    else:
        if int(oh) > 18 or int(om) > 59 or (int(oh) == 18 and int(om) > 0):
            return None
        offset = timedelta(hours=int(oh), minutes=int(om)) * (1 if sign == "+" else -1)
    micros = int((frac or "0")[:6].ljust(6, "0"))
    try:
        local = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), micros)
    except ValueError:
        return None
    return (local.replace(tzinfo=timezone(offset))).astimezone(UTC)


def _amount(value: object) -> Decimal:
    """Contract 1.1 amount rules; trailing zeros after the point do not count as digits."""
    if isinstance(value, _Number):
        if "e" in value or "E" in value:
            raise _Invalid("invalid_amount")
        number = Decimal(value)
        if number < 0:
            raise _Invalid("negative_amount")
        text = str(abs(number)) if "." not in value else value.lstrip("-")
    elif isinstance(value, str):
        if NEGATIVE_TEXT.match(value) and Decimal(value) < 0:
            raise _Invalid("negative_amount")
        if not DECIMAL_TEXT.match(value):
            raise _Invalid("invalid_amount")
        text, number = value, Decimal(value)
    else:
        raise _Invalid("wrong_type:amount")
    fraction = text.partition(".")[2].rstrip("0")
    if len(fraction) > 2:
        raise _Invalid("too_many_decimals")
    if number >= MAX_AMOUNT:
        raise _Invalid("amount_out_of_range")
    return number.quantize(Decimal("0.01"))


def validate(piece: bytes) -> dict:
    """A parsed valid record, or _Invalid naming the first rule it breaks."""
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError:
        raise _Invalid("invalid_utf8") from None
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
            parse_float=_Number,
            parse_int=_Number,
        )
    except ValueError:
        raise _Invalid("invalid_json") from None
    if not isinstance(doc, dict):
        raise _Invalid("not_an_object")
    for name in REQUIRED:
        if doc.get(name) is None:
            raise _Invalid(f"missing_field:{name}")
    if not isinstance(doc["order_id"], str) or isinstance(doc["order_id"], _Number):
        raise _Invalid("wrong_type:order_id")
    customer = doc.get("customer_id")
    if customer is not None and (not isinstance(customer, str) or isinstance(customer, _Number)):
        raise _Invalid("wrong_type:customer_id")
    for name in STRING_FIELDS:
        if not isinstance(doc[name], str) or isinstance(doc[name], _Number):
            raise _Invalid(f"wrong_type:{name}")
    if not isinstance(doc["amount"], str):  # _Number is a str subclass
        raise _Invalid("wrong_type:amount")
    if doc["order_id"] == "":
        raise _Invalid("empty_order_id")
    times = {}
    for name in ("event_time", "updated_at"):
        times[name] = parse_timestamp(doc[name])
        if times[name] is None:
            raise _Invalid(f"invalid_timestamp:{name}")
    if doc["status"] not in STATUSES:
        raise _Invalid("unknown_status")
    amount = _amount(doc["amount"])
    return {**doc, **times, "amount": amount, "customer_id": customer}


def _valid_order(piece: bytes, known: set[str]) -> dict:
    """`validate`, then the currency must be one with rates (or USD)."""
    record = validate(piece)
    if record["currency"] not in known:
        raise _Invalid("unknown_currency")
    return record


def _keep_latest(winners: dict[str, tuple], entry: tuple) -> None:
    """Latest wins: `entry` = (rank, record, ...) replaces a lower-ranked one of its order."""
    current = winners.get(entry[1]["order_id"])
    if current is None or entry[0] > current[0]:
        winners[entry[1]["order_id"]] = entry


def _read_rates(
    landing: Path, ignored: list[str]
) -> tuple[dict[tuple[date, str], Decimal], list[tuple[date, str, int, str]]]:
    rates: dict[tuple[date, str], Decimal] = {}
    rejects: list[tuple[date, str, int, str]] = []
    for day, folder in _day_folders(landing / "fx_rates", "rate_date=", ignored):
        for path in sorted(p for p in folder.iterdir() if p.name.endswith(".csv")):
            lines = [(n, p) for n, p in _lines(path) if not _is_blank(p)]
            if not lines or lines[0][1].decode("utf-8", "replace") != HEADER:
                if lines:
                    raise ValueError(f"{path}: first line is not the header {HEADER!r}")
                continue
            for number, piece in lines[1:]:
                fields = piece.decode("utf-8", "replace").split(",")
                ok = (
                    len(fields) == 2
                    and CURRENCY_CODE.match(fields[0])
                    and RATE_TEXT.match(fields[1])
                    and Decimal(fields[1]) > 0
                )
                if not ok:
                    rejects.append((day, path.name, number, "invalid_rate_line"))
                    continue
                key = (day, fields[0])
                if key in rates and rates[key] != Decimal(fields[1]):
                    raise ValueError(f"two different rates for {fields[0]} on {day}")
                rates[key] = Decimal(fields[1])
    return rates, rejects


def compute_contract_answer(
    landing_dir: Path,
    *,
    first_date: date | None = None,
    last_date: date | None = None,
    messages: Iterable[StreamMessage] = (),
) -> ContractAnswer:
    """The answer over the landing files and, contract 1.4, the topic's `messages`.

    Latest wins over both sources by (updated_at, ingest_date, message over landing line,
    then timestamp, partition, offset between messages, file and line between lines).
    """
    landing = Path(landing_dir)
    ignored: list[str] = []
    rates, fx_rejects = _read_rates(landing, ignored)
    known = {"USD"} | {currency for _, currency in rates}
    raw_counts: dict[date, int] = defaultdict(int)
    blank_counts: dict[date, int] = defaultdict(int)
    rejects: list[Reject] = []
    winners: dict[str, tuple] = {}
    valid_per_day: dict[date, int] = defaultdict(int)
    for day, folder in _day_folders(landing / "orders", "ingest_date=", ignored):
        for path in sorted(folder.iterdir()):
            if not path.name.endswith(".jsonl"):
                ignored.append(str(path))
                continue
            for number, piece in _lines(path):
                if _is_blank(piece):
                    blank_counts[day] += 1
                    continue
                raw_counts[day] += 1
                try:
                    record = _valid_order(piece, known)
                except _Invalid as invalid:
                    text = piece.decode("utf-8", "replace")
                    rejects.append(Reject(day, path.name, number, str(invalid), text))
                    continue
                valid_per_day[record["event_time"].date()] += 1
                rank = (record["updated_at"], day, 0, 0, -1, -1, path.name, number)
                _keep_latest(winners, (rank, record, day, path.name, number))
    message_counts: dict[date, int] = defaultdict(int)
    message_rejects: list[tuple[str, int, int, str]] = []
    for m in messages:  # every value is a record: an empty one is invalid_json, not blank
        day = m.ingest_date
        message_counts[day] += 1
        try:
            record = _valid_order(m.value, known)
        except _Invalid as invalid:
            message_rejects.append((m.topic, m.partition, m.offset, str(invalid)))
            continue
        valid_per_day[record["event_time"].date()] += 1
        rank = (record["updated_at"], day, 1, m.timestamp_ms, m.partition, m.offset, "", 0)
        _keep_latest(winners, (rank, record, day, None, None))
    staging: dict[str, StagedOrder] = {}
    for order_id, (_, record, day, name, number) in winners.items():
        event_date = record["event_time"].date()
        if (first_date and event_date < first_date) or (last_date and event_date > last_date):
            continue
        staging[order_id] = StagedOrder(
            order_id,
            record["customer_id"],
            record["event_time"],
            event_date,
            record["updated_at"],
            record["status"],
            record["currency"],
            record["amount"],
            day,
            name,
            number,
        )
    fct, fx_errors, order_rates = _daily_revenue(staging, rates)
    return ContractAnswer(
        dict(raw_counts),
        dict(blank_counts),
        rejects,
        staging,
        dict(valid_per_day),
        fct,
        fx_errors,
        fx_rejects,
        ignored,
        order_rates,
        dict(message_counts),
        message_rejects,
    )


def point_in_time_rate(
    rates: dict[tuple[date, str], Decimal], day: date, currency: str
) -> Decimal | None:
    if currency == "USD":
        return Decimal(1)
    for back in range(REACH_DAYS + 1):
        rate = rates.get((day - timedelta(days=back), currency))
        if rate is not None:
            return rate
    return None


def _daily_revenue(staging, rates):
    fct: dict[tuple[date, str], list] = {}
    errors: set[tuple[date, str]] = set()
    used: dict[tuple[date, str], Decimal] = {}
    with localcontext() as ctx:
        ctx.prec = 60
        for order in staging.values():
            key = (order.event_date, order.currency)
            rate = point_in_time_rate(rates, order.event_date, order.currency)
            if rate is None:
                errors.add(key)
                continue
            used[key] = rate
            row = fct.setdefault(key, [0, 0, Decimal("0.00"), Decimal(0)])
            row[0] += 1
            if order.status == "paid":
                row[1] += 1
                row[2] += order.amount
                row[3] += order.amount * rate
    failed_days = {d for d, _ in errors}
    result = {k: FctRow(*v) for k, v in fct.items() if k[0] not in failed_days}
    return result, sorted(errors), used


def iter_customer_ltv(
    answer: ContractAnswer, start: date, end: date
) -> Iterator[tuple[date, dict[str, tuple[int, Decimal, date]]]]:
    """LTV snapshots oldest first, built incrementally (days x customers can be large)."""
    by_day: dict[date, list[StagedOrder]] = defaultdict(list)
    for order in answer.staging.values():
        if order.status == "paid" and order.customer_id is not None:
            by_day[order.event_date].append(order)
    state: dict[str, tuple[int, Decimal, date]] = {}
    with localcontext() as ctx:
        ctx.prec = 60
        for day in sorted(d for d in by_day if d < start):
            _add(state, by_day[day], answer.rates)
        day = start
        while day <= end:
            _add(state, by_day.get(day, []), answer.rates)
            yield day, dict(state)
            day += timedelta(days=1)


def _add(state, orders, rates) -> None:
    for order in orders:
        usd = order.amount * rates[(order.event_date, order.currency)]
        count, revenue, first = state.get(order.customer_id, (0, Decimal(0), order.event_date))
        state[order.customer_id] = (count + 1, revenue + usd, min(first, order.event_date))


def customer_ltv_rows(
    answer: ContractAnswer, start: date, end: date
) -> dict[tuple[date, str], tuple[int, Decimal, date]]:
    return {
        (day, customer): value
        for day, snapshot in iter_customer_ltv(answer, start, end)
        for customer, value in snapshot.items()
    }


def ltv_daily_totals(
    answer: ContractAnswer, start: date, end: date
) -> dict[date, tuple[int, int, Decimal]]:
    return {
        day: (
            len(snapshot),
            sum(v[0] for v in snapshot.values()),
            sum((v[1] for v in snapshot.values()), Decimal(0)),
        )
        for day, snapshot in iter_customer_ltv(answer, start, end)
    }


def segment_at(versions: list[dict], at: datetime) -> tuple[str, str | None]:
    """(segment, country) of the version in force at instant `at` (contract 1.3);
    `unknown` when none is (the customer is unknown or its first version starts later)."""
    in_force = None
    for version in versions:
        start = parse_timestamp(version["valid_from"])
        if start <= at and (in_force is None or start > in_force[0]):
            in_force = (start, version)
    if in_force is None:
        return "unknown", None
    return in_force[1]["segment"], in_force[1]["country"]


def revenue_by_segment(
    answer: ContractAnswer, histories: dict[str, list[dict]]
) -> dict[tuple[date, str, str | None], tuple[int, int, Decimal]]:
    """marts/fct_revenue_by_segment in plain Python: {(event_date, segment, country):
    (orders, paid_orders, revenue_usd)} from staging's answer and the CRM's histories (a
    customer absent from `histories` is one the CRM answers 404 for)."""
    rows: dict[tuple[date, str, str | None], list] = {}
    with localcontext() as ctx:
        ctx.prec = 60
        for order in answer.staging.values():
            rate = answer.rates.get((order.event_date, order.currency))
            if rate is None:
                continue
            if order.customer_id is None:
                segment, country = "guest", None
            else:
                segment, country = segment_at(
                    histories.get(order.customer_id, []), order.event_time
                )
            row = rows.setdefault((order.event_date, segment, country), [0, 0, Decimal(0)])
            row[0] += 1
            if order.status == "paid":
                row[1] += 1
                row[2] += order.amount * rate
    return {k: tuple(v) for k, v in rows.items()}
