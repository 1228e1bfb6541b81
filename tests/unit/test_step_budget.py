"""`StepBudget` (engine/stages/policy.py) and `PlaybackClock` (engine/stages/playback.py), each alone.

The budget: `max_step_tokens` unless a listener holds less than `playback_slack_s`; then the largest measured
size whose time beyond the cheapest step fits in half that listener's buffer (never under `tight_step_s`),
one unmeasured size past the measured ones, never under `MIN_PIECE_TOKENS` nor over `max_step_tokens`.
The clock: what each listener holds, from the audio emitted and the time since its first packet less its stalls.
"""

from __future__ import annotations

import threading

import pytest

from engine.profile import ThinkerConfig
from engine.stages.playback import PlaybackClock
from engine.stages.policy import MIN_PIECE_TOKENS, StepBudget, size_class


def budget(max_step_tokens: int = 4096, **times: float) -> StepBudget:
    """`times`: s64=0.01 measures the size class 64 at 10 ms."""
    b = StepBudget(ThinkerConfig(max_step_tokens=max_step_tokens, playback_slack_s=1.0, tight_step_s=0.025))
    for name, seconds in times.items():
        b.observe(int(name[1:]), seconds)
    return b


def test_size_classes_are_powers_of_two() -> None:
    assert [size_class(n) for n in (1, 2, 3, 64, 65, 128, 129, 4096)] == [1, 2, 4, 64, 128, 128, 256, 4096]


def test_the_whole_budget_while_nobody_speaks_or_every_listener_holds_the_slack() -> None:
    b = budget(s64=0.5, s128=0.9)  # however slow the steps
    assert b.tokens(None) == 4096
    assert b.tokens(1.0) == b.tokens(30.0) == 4096
    assert b.tokens(0.99) < 4096


def test_unmeasured_sizes_are_explored_one_at_a_time() -> None:
    """From nothing measured the budget starts at the floor and grows one size class per measured step while
    steps fit; an unmeasured size is tried once, whatever the bound."""
    b = budget()
    sizes = []
    for _ in range(8):
        sizes.append(b.tokens(0.1))
        b.observe(sizes[-1], 0.010)  # every size as cheap as the next
    assert sizes == [64, 128, 256, 512, 1024, 2048, 4096, 4096]
    # one size past what fits is tried while unmeasured, even with a listener about to run dry
    assert budget(s64=0.010).tokens(0.0) == 128


def test_the_bound_is_half_the_least_buffer_beyond_the_cheapest_step() -> None:
    b = budget(s1=0.010, s64=0.015, s128=0.020, s256=0.040, s512=0.080, s1024=0.160)
    # 0.2 s held: 0.1 s for the step; 512 costs 0.07 beyond the cheapest, 1024 0.15
    assert b.tokens(0.2) == 512
    # 0.1 s held: 0.05 s; 256 costs 0.03 beyond, 512 0.07
    assert b.tokens(0.1) == 256
    # 0.02 s held: 0.01 s, less than tight_step_s: 0.025 s still; 128 costs 0.01, 256 0.03
    assert b.tokens(0.02) == b.tokens(0.0) == b.tokens(-3.0) == 128
    # classes are tried from the floor up: a slow 128 caps the budget below it, however cheap 256 is
    assert budget(s1=0.010, s64=0.011, s128=0.200, s256=0.012).tokens(0.2) == 64


def test_a_steps_time_counts_beyond_the_cheapest_measured() -> None:
    """Every step pays the weight read: 30 ms for the cheapest, so a 45 ms step of 128 costs 15 ms of the
    listener's buffer, within 25 ms; counted whole, not even the 64 would fit."""
    b = budget(s64=0.030, s128=0.045, s256=0.060)
    assert b.tokens(0.04) == 128  # 256 costs 30 ms beyond
    # 256 at 24 ms beyond fits, and the unmeasured 512 is tried
    assert budget(s64=0.030, s128=0.045, s256=0.054).tokens(0.04) == 512


def test_never_below_the_floor_nor_above_the_maximum() -> None:
    slow = budget(s64=0.010, s128=5.0, s256=5.0)
    assert slow.tokens(0.0) == MIN_PIECE_TOKENS
    assert budget(s1=0.001, s64=9.0).tokens(0.0) == MIN_PIECE_TOKENS  # even the floor's own size does not fit
    for max_tokens in (72, 100, 1000):  # the least a profile allows is max_batch + 64
        cheap = budget(max_tokens, s64=0.01, s128=0.01, s256=0.01, s512=0.01, s1024=0.01)
        assert MIN_PIECE_TOKENS <= cheap.tokens(0.5) <= max_tokens
        assert cheap.tokens(None) == max_tokens
    # with every size cheap, a tight budget reaches the largest class that the maximum holds
    assert budget(1000, s64=0.01, s128=0.01, s256=0.01, s512=0.01).tokens(0.5) == 512


def test_a_size_class_keeps_a_running_mean() -> None:
    b = budget()
    b.observe(100, 0.010)
    b.observe(128, 0.020)  # one class: 0.010 + 0.2 * 0.010
    assert b.times == {128: pytest.approx(0.012)}


# -- the playback clock


def test_a_listener_holds_what_was_emitted_less_what_it_played() -> None:
    clock = PlaybackClock()
    assert clock.buffered_s("a", now=10.0) is None
    clock.emitted("a", 0.5, now=10.0)
    assert clock.buffered_s("a", now=10.2) == pytest.approx(0.3)
    clock.emitted("a", 1.0, now=10.4)  # before it ran dry: no stall
    assert clock.buffered_s("a", now=10.4) == pytest.approx(0.6)
    assert clock.buffered_s("a", now=11.0) == pytest.approx(0.0)


def test_a_stall_moves_the_listener_on() -> None:
    """It ran dry at 10.5 and waited until 12.0: it plays the next packet from then, so it holds what that
    packet brought, not a negative amount."""
    clock = PlaybackClock()
    clock.emitted("a", 0.5, now=10.0)
    assert clock.buffered_s("a", now=12.0) == pytest.approx(-1.5)  # ran dry: owed audio until a packet comes
    clock.emitted("a", 0.8, now=12.0)
    assert clock.buffered_s("a", now=12.0) == pytest.approx(0.3)
    clock.emitted("a", 1.0, now=12.1)
    assert clock.buffered_s("a", now=12.1) == pytest.approx(0.4)
    for now in (13.0, 20.0):  # every later packet leaves a non-negative buffer
        clock.emitted("a", 1.0 + now - 12.0, now=now)
        assert clock.buffered_s("a", now=now) >= 0.0


def test_the_least_buffered_listener_and_finished_replies() -> None:
    clock = PlaybackClock()
    assert clock.least_buffered_s(now=0.0) is None  # nobody speaks
    clock.emitted("a", 2.0, now=0.0)
    clock.emitted("b", 0.5, now=0.2)
    assert clock.least_buffered_s(now=0.3) == pytest.approx(0.4)
    clock.finished("b")
    assert clock.buffered_s("b", now=0.3) is None
    assert clock.least_buffered_s(now=0.3) == pytest.approx(1.7)
    clock.finished("b")  # twice, or never known: nothing
    clock.finished("a")
    assert clock.least_buffered_s(now=0.3) is None
    clock.emitted("a", 0.1, now=5.0)  # a new first packet starts afresh
    assert clock.buffered_s("a", now=5.0) == pytest.approx(0.1)


def test_threads_share_the_clock() -> None:
    clock = PlaybackClock()
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def emit(k: int) -> None:
        try:
            start.wait()
            for i in range(2000):
                rid = f"{k}-{i % 10}"
                clock.emitted(rid, 0.01 * i, now=float(i))
                clock.least_buffered_s(now=float(i))
                if i % 7 == 0:
                    clock.finished(rid)
        except BaseException as e:
            errors.append(e)

    def read() -> None:
        try:
            start.wait()
            for i in range(4000):
                clock.least_buffered_s(now=float(i))
                clock.buffered_s(f"0-{i % 10}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=emit, args=(k,)) for k in range(3)] + [threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads)
    for k in range(3):
        for i in range(10):
            clock.finished(f"{k}-{i}")
    assert clock.least_buffered_s() is None
