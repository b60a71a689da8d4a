"""The services a run's nodes are handed through LangGraph's ``Runtime[Context]``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from runtime.store.base import RunStore


@dataclass
class Context:
    run_id: str
    """The run (and LangGraph thread) being driven."""
    store: RunStore
    """Ledger, steps, approvals, artifacts and events."""
    active_base_s: float = 0.0
    """Active seconds the run had used before this drive started."""
    drive_started: float = field(default_factory=time.monotonic)

    def active_s(self) -> float:
        """Active time so far; time spent parked waiting for a human is not counted."""
        return self.active_base_s + (time.monotonic() - self.drive_started)
