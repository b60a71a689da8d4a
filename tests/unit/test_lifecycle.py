"""The lifecycle table: every legal move, every illegal one, and the store honouring it."""

from __future__ import annotations

import itertools

import pytest

from runtime.events import EventType
from runtime.lifecycle import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    State,
    Trigger,
    forward_trigger,
    transition,
)
from tests.unit.conftest import MakeRun

ALL_PAIRS = list(itertools.product(State, Trigger))
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in TRANSITIONS]
NON_TERMINAL = [s for s in State if s not in TERMINAL]


def test_the_table_partitions_every_pair() -> None:
    assert len(ILLEGAL) + len(TRANSITIONS) == len(State) * len(Trigger)


@pytest.mark.parametrize(("state", "trigger"), ILLEGAL, ids=lambda v: v.value)
def test_illegal_pair_raises(state: State, trigger: Trigger) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(state, trigger)
    assert (info.value.state, info.value.trigger) == (state, trigger)
    assert trigger.value in str(info.value) and state.value in str(info.value)


@pytest.mark.parametrize(
    ("state", "trigger", "targets"),
    [(s, t, dsts) for (s, t), dsts in TRANSITIONS.items()],
    ids=lambda v: v.value if isinstance(v, State | Trigger) else "-".join(v),
)
def test_legal_pair_returns_the_tables_first_target_or_the_one_named(
    state: State, trigger: Trigger, targets: tuple[State, ...]
) -> None:
    assert transition(state, trigger) is targets[0]
    for target in targets:
        assert transition(state, trigger, target) is target
    for other in set(State) - set(targets):
        with pytest.raises(IllegalTransition) as info:
            transition(state, trigger, other)
        assert info.value.to is other and other.value in str(info.value)


def test_a_rejection_fails_the_run_or_replans() -> None:
    """DESIGN §3: rejected → failed (or → planning where the tool's policy says replan)."""
    assert TRANSITIONS[(State.WAITING_HUMAN, Trigger.REJECTED)] == (State.FAILED, State.PLANNING)
    assert transition(State.WAITING_HUMAN, Trigger.REJECTED) is State.FAILED


@pytest.mark.parametrize("state", sorted(TERMINAL), ids=lambda v: v.value)
def test_terminal_states_have_no_way_out(state: State) -> None:
    assert not [t for (s, t) in TRANSITIONS if s is state]
    for trigger in Trigger:
        with pytest.raises(IllegalTransition):
            transition(state, trigger)


@pytest.mark.parametrize("state", NON_TERMINAL, ids=lambda v: v.value)
@pytest.mark.parametrize("trigger", [Trigger.CANCEL, Trigger.BUDGET_EXCEEDED])
def test_cancel_and_budget_fail_any_live_run(state: State, trigger: Trigger) -> None:
    assert TRANSITIONS[(state, trigger)] == (State.FAILED,)


@pytest.mark.parametrize(
    ("state", "target", "trigger"),
    [
        (State.PENDING, State.PLANNING, Trigger.START),
        (State.PLANNING, State.EXECUTING, Trigger.PLAN_READY),
        (State.EXECUTING, State.PLANNING, Trigger.NEXT_STEP),
        (State.EXECUTING, State.SUCCEEDED, Trigger.DONE),
        (State.EXECUTING, State.WAITING_HUMAN, Trigger.NEED_APPROVAL),
        (State.WAITING_HUMAN, State.EXECUTING, Trigger.APPROVED),
        (State.WAITING_HUMAN, State.PLANNING, Trigger.REJECTED),
        # Failures always name their trigger; the table is never asked for them.
        (State.EXECUTING, State.FAILED, None),
        (State.PLANNING, State.FAILED, None),
        # No single move exists.
        (State.PENDING, State.SUCCEEDED, None),
        (State.PLANNING, State.PLANNING, None),
        (State.SUCCEEDED, State.PLANNING, None),
    ],
)
def test_forward_trigger(state: State, target: State, trigger: Trigger | None) -> None:
    assert forward_trigger(state, target) is trigger


# -- through a real store -------------------------------------------------------


async def test_store_refuses_an_illegal_trigger_and_changes_nothing(
    backend: object, make_run: MakeRun
) -> None:
    store = backend.store  # type: ignore[attr-defined]
    run = await make_run(store)
    before_run = await store.get_run(run.run_id)
    before_events = await store.list_events(run.run_id)

    with pytest.raises(IllegalTransition):
        await store.transition(
            run.run_id,
            Trigger.DONE,
            events=[(EventType.ERROR, {"code": "X", "message": "must not be written"})],
            result={"answer": "nope"},
        )

    assert await store.get_run(run.run_id) == before_run
    assert await store.list_events(run.run_id) == before_events
    # The sequence counter did not move either: the next event is seq 2.
    assert await store.append_event(run.run_id, EventType.ERROR, {}) == 2


async def test_store_applies_a_legal_trigger_with_its_state_event(
    backend: object, make_run: MakeRun
) -> None:
    store = backend.store  # type: ignore[attr-defined]
    run = await make_run(store)

    moved = await store.transition(run.run_id, Trigger.START, expect=State.PENDING)

    assert moved.state is State.PLANNING
    events = await store.list_events(run.run_id)
    assert [(e.seq, e.type) for e in events] == [(1, "state"), (2, "state")]
    assert events[-1].data == {"from": "pending", "to": "planning", "trigger": "start"}
