from __future__ import annotations

from runtime.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_and_fails_fast() -> None:
    breaker = Breaker(threshold=3, cooldown_s=10, clock=Clock())
    for _ in range(2):
        assert breaker.allow()
        breaker.record(unavailable=True)
    assert breaker.state == "closed"
    breaker.record(unavailable=True)
    assert breaker.state == "open" and not breaker.allow()


def test_a_success_resets_the_count() -> None:
    breaker = Breaker(threshold=2, cooldown_s=10, clock=Clock())
    breaker.record(unavailable=True)
    breaker.record(unavailable=False)
    breaker.record(unavailable=True)
    assert breaker.state == "closed"


def test_half_open_lets_one_trial_through_then_closes_or_reopens() -> None:
    clock = Clock()
    breaker = Breaker(threshold=1, cooldown_s=10, clock=clock)
    breaker.record(unavailable=True)
    clock.now = 10
    assert breaker.state == "half_open"
    assert breaker.allow() and not breaker.allow()  # one trial only
    breaker.record(unavailable=True)
    assert breaker.state == "open"
    clock.now = 20
    assert breaker.allow()
    breaker.record(unavailable=False)
    assert breaker.state == "closed" and breaker.allow() and breaker.allow()
