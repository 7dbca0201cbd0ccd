"""The demo generator writes a landing zone to the contract, with the mess it promises."""

import itertools
import json
import shutil
from collections import Counter
from datetime import date, timedelta
from pathlib import Path

import pytest

from backfill_platform.reference import compute_contract_answer, parse_timestamp
from backfill_platform.sources.generate import (
    MANIFEST,
    CannotDeliver,
    Params,
    deliver_next_day,
    generate_landing,
    read_params,
)

START, END = date(2024, 1, 1), date(2024, 1, 20)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def landing(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("landing")
    generate_landing(out, START, END, 40, seed=3, malformed_rate=0.01, progress=False)
    return out


def test_deterministic_for_a_seed(landing, tmp_path):
    generate_landing(tmp_path / "a", START, END, 40, seed=3, malformed_rate=0.01, progress=False)
    generate_landing(tmp_path / "b", START, END, 40, seed=4, malformed_rate=0.01, progress=False)
    assert _files(tmp_path / "a") == _files(landing)
    assert _files(tmp_path / "b") != _files(landing)


def test_layout_and_days_within_the_range(landing):
    for kind, prefix in (("orders", "ingest_date="), ("fx_rates", "rate_date=")):
        days = [date.fromisoformat(p.name.removeprefix(prefix)) for p in (landing / kind).iterdir()]
        assert days and min(days) >= START and max(days) <= END
    assert all(p.suffix == ".jsonl" for p in (landing / "orders").rglob("*") if p.is_file())
    for csv in (landing / "fx_rates").rglob("*.csv"):
        assert csv.read_text().splitlines()[0] == "currency,usd_per_unit"


def test_the_mess_is_there(landing):
    answer = compute_contract_answer(landing)
    lines = []
    for path in sorted((landing / "orders").rglob("*.jsonl")):
        day = date.fromisoformat(path.parent.name.removeprefix("ingest_date="))
        lines += [(day, line) for line in path.read_bytes().decode().splitlines() if line.strip()]
    valid = [
        (day, json.loads(text))
        for day, text in lines
        if not any((r.text == text and r.ingest_date == day) for r in answer.rejects)
    ]
    lateness = Counter((day - parse_timestamp(rec["event_time"]).date()).days for day, rec in valid)
    assert lateness[0] > sum(lateness.values()) / 2  # most arrive the same day
    assert any(lateness[d] for d in (1, 2, 3)) and max(lateness) <= 10 + 5  # refunds: + days
    texts = Counter(text for _, text in lines)
    assert any(n > 1 for n in texts.values())  # at-least-once duplicates
    customers = Counter(rec.get("customer_id", "<absent>") for _, rec in valid)
    assert customers["<absent>"] > 0 and customers[None] > 0
    assert 0.10 < customers["c-hot"] / sum(customers.values()) < 0.35
    reasons = Counter(r.reason for r in answer.rejects)
    assert len(reasons) >= 3
    assert {o.currency for o in answer.staging.values()} >= {"USD", "EUR", "GBP", "JPY"}
    assert not answer.fx_errors
    # versions delivered out of order: a later ingest day holds an older version
    seen: dict[str, tuple] = {}
    out_of_order = 0
    for _day, rec in sorted(valid, key=lambda x: x[0]):
        updated = parse_timestamp(rec["updated_at"])
        if rec["order_id"] in seen and updated < seen[rec["order_id"]]:
            out_of_order += 1
        seen[rec["order_id"]] = max(updated, seen.get(rec["order_id"], updated))
    assert out_of_order > 0


def test_fx_never_leaves_a_currency_without_a_rate_for_a_week(landing):
    days = sorted(
        date.fromisoformat(p.name.removeprefix("rate_date="))
        for p in (landing / "fx_rates").iterdir()
    )
    assert days[0] == START
    gaps = [(b - a).days for a, b in itertools.pairwise(days)]
    assert max(gaps) <= 7 and len(days) < (END - START).days + 1  # some days are skipped
    assert END - days[-1] < timedelta(days=7)


def test_refuses_to_write_into_a_non_empty_landing_zone(landing):
    with pytest.raises(FileExistsError):
        generate_landing(landing, START, END, 5, seed=1, progress=False)


def _order_lines(root: Path, day: date | None = None) -> list[str]:
    pattern = f"ingest_date={day.isoformat()}/*.jsonl" if day else "ingest_date=*/*.jsonl"
    return [
        line
        for path in sorted((root / "orders").glob(pattern))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _ids(lines: list[str]) -> set[str]:
    ids = set()
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("order_id"), str):
            ids.add(record["order_id"])
    return ids


def test_records_its_parameters_beside_the_landing_zone(landing):
    assert read_params(landing) == Params(START, END, 40, 3, 0.01)
    assert not (landing / "orders" / MANIFEST).exists()


def test_deliver_next_day_continues_the_landing_zone_like_the_generator(landing, tmp_path):
    """The day after the newest: new files in one new day folder only, fresh order ids, lines
    of earlier orders due that day, duplicates; the same bytes every time for the same day."""
    zone, twin = tmp_path / "zone", tmp_path / "twin"
    shutil.copytree(landing, zone)
    shutil.copytree(landing, twin)
    before = _files(zone)
    history = _order_lines(zone)
    day = END + timedelta(days=1)

    delivery = deliver_next_day(zone)
    assert delivery.day == day
    after = _files(zone)
    assert {k: v for k, v in after.items() if k in before} == before  # history untouched
    new = sorted(set(after) - set(before))
    assert new == delivery.files and new
    assert all(f"={day.isoformat()}/" in name for name in new)
    lines = _order_lines(zone, day)
    assert len(lines) == delivery.lines > 0
    fresh = {i for i in _ids(lines) if i.startswith("o-3-2024")}
    assert fresh and fresh == set(delivery.order_ids)
    assert not fresh & _ids(history)  # no order id of history is reused
    earlier = [
        line
        for line in lines
        if "event_time" in line and parse_timestamp(json.loads(line)["event_time"]).date() < day
    ]
    assert len(earlier) == delivery.late_lines > 0  # late arrivals of earlier orders
    # orders the generated range placed (some of them seen here for the first time)
    assert all(len(i) == len("o-3-00000001") for i in _ids(earlier))
    counted = Counter(lines)
    duplicated = sum(n - 1 for n in counted.values()) + len(set(lines) & set(history))
    assert duplicated == delivery.duplicate_lines > 0

    second = deliver_next_day(zone)
    assert second.day == day + timedelta(days=1)
    deliver_next_day(twin)
    deliver_next_day(twin)
    assert _files(twin) == _files(zone)  # deterministic for the parameters and the day

    answer = compute_contract_answer(zone)
    assert not answer.fx_errors
    assert fresh <= set(answer.staging)  # valid orders the contract's answer takes in


def test_deliver_next_day_refuses_what_it_cannot_continue(landing, tmp_path):
    zone = tmp_path / "zone"
    shutil.copytree(landing, zone)
    before = _files(zone)
    with pytest.raises(CannotDeliver, match="not over yet"):
        deliver_next_day(zone, today=END + timedelta(days=1))
    (zone / MANIFEST).unlink()
    with pytest.raises(CannotDeliver, match=r"no _generator\.json"):
        deliver_next_day(zone)
    wrong = Params(START, END, 40, seed=4, malformed_rate=0.01)
    with pytest.raises(CannotDeliver, match="is not what"):
        deliver_next_day(zone, wrong)
    assert _files(zone) == {k: v for k, v in before.items() if k != MANIFEST}
    right = Params(START, END, 40, seed=3, malformed_rate=0.01)
    assert deliver_next_day(zone, right).day == END + timedelta(days=1)
