"""The engine's kept outcomes (:class:`runtime.recording.Unrecorded`): bounded by count
and by size, the oldest let go first, one of a call run again since never handed out."""

from __future__ import annotations

from typing import Any

from runtime.recording import Finished, Unrecorded


def outcome(output: Any, attempts: int = 1, run_id: str = "run-a") -> Finished:
    return Finished(run_id, attempts, "succeeded", output, None)


def test_past_the_count_the_oldest_is_let_go() -> None:
    kept = Unrecorded(most=2)
    for name in ("a", "b", "c"):
        kept.keep(name, outcome({"n": name}))

    assert len(kept) == 2
    assert kept.find("a", 1) is None
    assert kept.find("c", 1) == outcome({"n": "c"})


def test_past_the_size_the_oldest_are_let_go_and_the_newest_is_kept() -> None:
    kept = Unrecorded(most_bytes=3000)
    kept.keep("a", outcome("x" * 1000))
    kept.keep("b", outcome("x" * 1000))
    kept.keep("c", outcome("x" * 1500))  # a and b together with it are past the bound

    assert [kept.find(name, 1) is not None for name in "abc"] == [False, True, True]

    kept.keep("d", outcome("x" * 10_000))  # alone past the bound: still kept
    assert len(kept) == 1 and kept.find("d", 1) is not None


def test_a_call_kept_again_counts_once() -> None:
    kept = Unrecorded(most_bytes=2500)
    kept.keep("a", outcome("x" * 1000))
    kept.keep("b", outcome("x" * 1000))
    kept.keep("b", outcome("x" * 1000))

    assert kept.find("a", 1) is not None and len(kept) == 2


def test_one_of_another_attempt_is_stale_and_forgotten() -> None:
    kept = Unrecorded()
    kept.keep("a", outcome({"n": 1}, attempts=1))

    assert kept.find("a", 2) is None  # the call was claimed again since
    assert len(kept) == 0


def test_of_run_lists_that_run_s_outcomes_alone() -> None:
    kept = Unrecorded()
    kept.keep("a", outcome(1, run_id="run-a"))
    kept.keep("b", outcome(2, run_id="run-b"))

    assert kept.of_run("run-b") == [("b", outcome(2, run_id="run-b"))]
    assert kept.of_run("run-c") == []
