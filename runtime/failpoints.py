"""Named crash points, for fault-injection tests of real processes.

``AGENT_RUNTIME_FAILPOINTS=tool.after:publish_report,ledger.after`` makes the
process SIGKILL itself when it reaches one of the named points (for the named
tool only, when one is given). A ``freeze.`` point SIGSTOPs it instead, the first
time only: the process stops as it is, its sockets open, until it gets a SIGCONT.
Unset, every point is a no-op.
"""

from __future__ import annotations

import os
import signal

ENV = "AGENT_RUNTIME_FAILPOINTS"

POINTS = {
    "tool.before": "the attempt is counted in the ledger; the handler has not started",
    "tool.during": "(publish_report) the outbox row is committed; the handler has not returned",
    "tool.after": "the handler returned; its outcome is not yet in the ledger",
    "ledger.after": "the outcome is in the ledger; the checkpoint is not yet written",
    "reconcile": "a tool's reconcile is about to ask the real system what a call did",
    "freeze.pipeline": "a drive's deferred state change is sent (the run row locked), "
    "the statement it goes with not yet",
}

_frozen: set[str] = set()


def hit(point: str, tool: str | None = None) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    for item in spec.split(","):
        name, _, target = item.strip().partition(":")
        if name == point and (not target or target == tool):
            if not point.startswith("freeze."):
                os.kill(os.getpid(), signal.SIGKILL)
            elif point not in _frozen:
                _frozen.add(point)
                os.kill(os.getpid(), signal.SIGSTOP)
