"""The soak's verdicts (`make soak-stream`) on figures made up to sit on either side of each
bound: a verdict that cannot fail would make the soak's "met" mean nothing, and one judged on
a run too short (CI's 14 batches) fails on noise."""

from benchmarks.soak_stream import _batch_time_verdict, _heap_verdict


def _day(n: int, heap: float | None, batches: int = 40) -> dict:
    return {"day": f"2024-03-{n:02d}", "batches": batches, "heap_mb_after_full_gc": heap}


def test_the_batch_time_is_judged_on_ten_batches_a_tenth_or_more():
    assert _batch_time_verdict([2.0] * 100)["met"] is True
    slower = [2.0] * 90 + [2.5] * 10  # the last tenth 25 % slower
    assert _batch_time_verdict(slower)["met"] is False
    within = [2.0] * 90 + [2.4] * 10  # 20 %: the margin itself
    assert _batch_time_verdict(within)["met"] is True
    # CI's small soak: one batch a tenth, its first warming the JIT, its last beside a run
    short = _batch_time_verdict([6.6] + [3.8] * 11 + [10.3, 11.8])
    assert short["met"] is None and short["batches"] == 14


def test_the_heap_is_judged_from_the_first_warm_day_to_the_last():
    days = [_day(1, 100.0, batches=10), _day(2, 110.0, batches=10)] + [
        _day(n, 112.0) for n in range(3, 30)
    ]
    grown = _heap_verdict([*days, _day(30, 122.0)], warm_up_batches=20)
    assert grown["warm_day"] == "2024-03-02" and grown["met"] is False  # 10.9 % over 110
    flat = _heap_verdict([*days, _day(30, 120.0)], warm_up_batches=20)
    assert flat["met"] is True
    assert flat["first_fifth_median_mb"] == 112.0 and flat["last_fifth_median_mb"] == 112.0


def test_a_run_with_no_warm_day_before_its_last_leaves_the_heap_unjudged():
    days = [_day(n, 100.0 + n, batches=3) for n in range(1, 5)]
    verdict = _heap_verdict(days, warm_up_batches=20)
    assert verdict["met"] is None and verdict["last_mb"] == 104.0
    # a day whose heap could not be read still counts its batches toward the warm-up
    unread = [_day(1, None, batches=25), _day(2, 105.0), _day(3, 130.0)]
    assert _heap_verdict(unread, warm_up_batches=20)["warm_day"] == "2024-03-02"
