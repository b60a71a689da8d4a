"""A circuit breaker per tool, shared by every drive in one process.

After ``threshold`` consecutive TOOL_UNAVAILABLE outcomes a tool's circuit
opens: calls fail fast, without touching the tool, for ``cooldown_s``; then one
trial call is let through (half-open), and its outcome closes or reopens it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Breaker:
    threshold: int = 5
    cooldown_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    failures: int = 0
    opened_at: float | None = None
    trial_in_flight: bool = False

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half_open" if self.clock() - self.opened_at >= self.cooldown_s else "open"

    def allow(self) -> bool:
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self.trial_in_flight:
            self.trial_in_flight = True
            return True
        return False

    def record(self, unavailable: bool) -> None:
        self.trial_in_flight = False
        if not unavailable:
            self.failures, self.opened_at = 0, None
            return
        self.failures += 1
        if self.failures >= self.threshold or self.opened_at is not None:
            self.opened_at = self.clock()


@dataclass
class Breakers:
    threshold: int = 5
    cooldown_s: float = 30.0
    _by_tool: dict[str, Breaker] = field(default_factory=dict)

    def reset(self) -> None:
        self._by_tool.clear()

    def for_tool(self, ref: str) -> Breaker:
        breaker = self._by_tool.get(ref)
        if breaker is None:
            breaker = self._by_tool[ref] = Breaker(self.threshold, self.cooldown_s)
        return breaker


BREAKERS = Breakers()
"""The process's breakers: per tool, shared by the workers of this process."""
