"""The six public run states and the one table of legal transitions.

Every state change in the system goes through :func:`transition`; an illegal
move raises :class:`IllegalTransition` and changes nothing.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING = "pending"
    PLANNING = "planning"
    EXECUTING = "executing"
    WAITING_HUMAN = "waiting_human"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Trigger(StrEnum):
    CREATE = "create"
    """A run's first state event, from nothing to pending: no transition of the table."""
    START = "start"
    PLAN_READY = "plan_ready"
    PLAN_ERROR = "plan_error"
    NEXT_STEP = "next_step"
    DONE = "done"
    NEED_APPROVAL = "need_approval"
    EXEC_ERROR = "exec_error"
    APPROVED = "approved"
    REJECTED = "rejected"
    CANCEL = "cancel"
    BUDGET_EXCEEDED = "budget_exceeded"


TERMINAL: frozenset[State] = frozenset({State.SUCCEEDED, State.FAILED})

_S, _T = State, Trigger
TRANSITIONS: dict[tuple[State, Trigger], State] = {
    (_S.PENDING, _T.START): _S.PLANNING,
    (_S.PLANNING, _T.PLAN_READY): _S.EXECUTING,
    (_S.PLANNING, _T.PLAN_ERROR): _S.FAILED,
    (_S.EXECUTING, _T.NEXT_STEP): _S.PLANNING,
    (_S.EXECUTING, _T.DONE): _S.SUCCEEDED,
    (_S.EXECUTING, _T.NEED_APPROVAL): _S.WAITING_HUMAN,
    (_S.EXECUTING, _T.EXEC_ERROR): _S.FAILED,
    (_S.WAITING_HUMAN, _T.APPROVED): _S.EXECUTING,
    (_S.WAITING_HUMAN, _T.REJECTED): _S.FAILED,
    # The graph can fail while resuming from a decision (e.g. the store vanished).
    (_S.WAITING_HUMAN, _T.EXEC_ERROR): _S.FAILED,
    # A rejection whose tool policy says "replan" hands control back to the planner.
    (_S.WAITING_HUMAN, _T.NEXT_STEP): _S.PLANNING,
    **{(s, _T.CANCEL): _S.FAILED for s in _S if s not in TERMINAL},
    **{(s, _T.BUDGET_EXCEEDED): _S.FAILED for s in _S if s not in TERMINAL},
}


class IllegalTransition(Exception):
    def __init__(self, state: State, trigger: Trigger) -> None:
        super().__init__(f"illegal transition: {trigger.value} from {state.value}")
        self.state = state
        self.trigger = trigger


def transition(state: State, trigger: Trigger) -> State:
    """The state reached from ``state`` by ``trigger``; raises if the move is illegal."""
    try:
        return TRANSITIONS[(state, trigger)]
    except KeyError:
        raise IllegalTransition(state, trigger) from None


def forward_trigger(state: State, target: State) -> Trigger | None:
    """The one non-failure trigger that moves ``state`` to ``target``, if any.

    Used by the adapter, which sees *where* the graph went and asks the table
    *how* it got there; failures always name their trigger explicitly.
    """
    found = [
        trig
        for (src, trig), dst in TRANSITIONS.items()
        if src == state and dst == target and dst is not State.FAILED
    ]
    return found[0] if len(found) == 1 else None
