"""A supervisor's clock of an engine's silence: what counts against the engine, and what was the
supervisor's own process not running."""

from __future__ import annotations

import pytest

from engine.remote import silence as silence_module
from engine.remote.messages import STATE_PERIOD_S
from engine.remote.silence import OVERSLEPT_S, Silence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(silence_module.time, "monotonic", clock)
    return clock


def _look_for(silence: Silence, clock: Clock, seconds: float) -> float:
    """Look every period for `seconds`, as a supervisor that runs does; the last look's answer."""
    silent_s = 0.0
    for _ in range(round(seconds / STATE_PERIOD_S)):
        clock.now += STATE_PERIOD_S
        silent_s = silence.look()
    return silent_s


def test_silence_counts_while_the_supervisor_looks_on_time(clock: Clock) -> None:
    silence = Silence()
    assert _look_for(silence, clock, 5.0) == pytest.approx(5.0)
    assert silence.seconds == pytest.approx(5.0)


def test_a_word_from_the_engine_starts_it_again(clock: Clock) -> None:
    silence = Silence()
    _look_for(silence, clock, 3.0)
    silence.heard()
    assert _look_for(silence, clock, 1.0) == pytest.approx(1.0)


def test_a_gap_in_the_supervisors_own_looks_is_not_the_engines_silence(clock: Clock) -> None:
    silence = Silence()
    _look_for(silence, clock, 1.0)
    clock.now += 60.0  # the supervisor's process was stopped too: the engine's words wait unread
    assert silence.look() == 0.0
    assert _look_for(silence, clock, 2.0) == pytest.approx(2.0)  # a real stall is still caught after


def test_a_look_just_late_still_counts(clock: Clock) -> None:
    silence = Silence()
    clock.now += STATE_PERIOD_S + OVERSLEPT_S * 0.9  # a busy loop, not a stopped process
    assert silence.look() == pytest.approx(STATE_PERIOD_S + OVERSLEPT_S * 0.9)
