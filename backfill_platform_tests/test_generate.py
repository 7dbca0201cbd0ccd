"""The demo generator writes a landing zone to the contract, with the mess it promises."""

import itertools
import json
from collections import Counter
from datetime import date, timedelta
from pathlib import Path

import pytest

from backfill_platform.reference import compute_contract_answer, parse_timestamp
from backfill_platform.sources.generate import generate_landing

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
