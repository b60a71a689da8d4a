"""What a process has done since it started, for ``GET /metrics`` (Prometheus' text format).

Counters live in the process (each ``serve`` and ``worker`` has its own, as Prometheus
expects of its targets); how many runs are in each live state is read from the
database when scraped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

PREFIX = "agent_runtime_"

HELP: dict[str, tuple[str, str]] = {
    "drives_started_total": ("counter", "Drives this process started (a run leased and run)."),
    "drives_ended_total": (
        "counter",
        "Drives this process ended, by how: stopped (parked, or the run ended), "
        "cancelled, handed_back (shutdown), lease_lost, db_error (retried later), "
        "crash_loop (taken over too often in a row: the run failed), failed, no_agent "
        "(a run of an agent this process does not have, handed back).",
    ),
    "drives_in_flight": ("gauge", "Drives this process is running now."),
    "frozen_sessions_ended_total": (
        "counter",
        "Database sessions this worker ended: frozen mid-transaction on our tables for "
        "two leases (their process paused or gone), holding rows others wait for.",
    ),
    "runs": ("gauge", "Runs in each live state, in the whole database."),
    "database_up": (
        "gauge",
        "1 if the database answered this scrape's count of runs in time, else 0 (and "
        "no runs samples: the process's own counters are still served).",
    ),
}


DRIVE_ENDS = (
    "stopped",
    "cancelled",
    "handed_back",
    "lease_lost",
    "db_error",
    "crash_loop",
    "failed",
    "no_agent",
)


class Metrics:
    def __init__(self) -> None:
        self.counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
        # Every series from 0, so that a rate sees the first increment of each.
        for how in DRIVE_ENDS:
            self.counts[("drives_ended_total", (("how", how),))] = 0

    def inc(self, name: str, **labels: str) -> None:
        self.counts[(name, tuple(sorted(labels.items())))] += 1

    def value(self, name: str, **labels: str) -> int:
        return self.counts[(name, tuple(sorted(labels.items())))]

    def render(self, gauges: Mapping[str, Iterable[tuple[dict[str, str], float]]]) -> str:
        """The exposition: this process's counters, then ``gauges`` (name → samples)."""
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for (name, pairs), count in sorted(self.counts.items()):
            samples.setdefault(name, []).append((dict(pairs), count))
        for name, points in gauges.items():
            samples.setdefault(name, []).extend(points)
        lines: list[str] = []
        for name in HELP:
            kind, text = HELP[name]
            lines += [f"# HELP {PREFIX}{name} {text}", f"# TYPE {PREFIX}{name} {kind}"]
            points = samples.get(name) or ([({}, 0.0)] if kind == "counter" else [])
            for labels, value in points:
                lines.append(f"{PREFIX}{name}{_labels(labels)} {_number(value)}")
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    # Exact, not "{:g}": a counter past a million must not print as 1.23457e+06.
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
