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
TRANSITIONS: dict[tuple[State, Trigger], tuple[State, ...]] = {
    # The states a trigger may lead to from a state: the first, unless the one who
    # fires it names another of them.
    (_S.PENDING, _T.START): (_S.PLANNING,),
    (_S.PLANNING, _T.PLAN_READY): (_S.EXECUTING,),
    (_S.PLANNING, _T.PLAN_ERROR): (_S.FAILED,),
    (_S.EXECUTING, _T.NEXT_STEP): (_S.PLANNING,),
    (_S.EXECUTING, _T.DONE): (_S.SUCCEEDED,),
    (_S.EXECUTING, _T.NEED_APPROVAL): (_S.WAITING_HUMAN,),
    (_S.EXECUTING, _T.EXEC_ERROR): (_S.FAILED,),
    (_S.WAITING_HUMAN, _T.APPROVED): (_S.EXECUTING,),
    # A rejection fails the run, or hands control back to the planner where the
    # tool's policy says "replan" (DESIGN §3).
    (_S.WAITING_HUMAN, _T.REJECTED): (_S.FAILED, _S.PLANNING),
    # The graph can fail while resuming from a decision (e.g. the store vanished).
    (_S.WAITING_HUMAN, _T.EXEC_ERROR): (_S.FAILED,),
    **{(s, _T.CANCEL): (_S.FAILED,) for s in _S if s not in TERMINAL},
    **{(s, _T.BUDGET_EXCEEDED): (_S.FAILED,) for s in _S if s not in TERMINAL},
}


class IllegalTransition(Exception):
    def __init__(self, state: State, trigger: Trigger, to: State | None = None) -> None:
        towards = "" if to is None else f" to {to.value}"
        super().__init__(f"illegal transition: {trigger.value} from {state.value}{towards}")
        self.state = state
        self.trigger = trigger
        self.to = to


def transition(state: State, trigger: Trigger, to: State | None = None) -> State:
    """The state reached from ``state`` by ``trigger`` (``to``, where the table lets the
    trigger lead there); raises if the move is illegal."""
    targets = TRANSITIONS.get((state, trigger), ())
    if not targets or (to is not None and to not in targets):
        raise IllegalTransition(state, trigger, to)
    return targets[0] if to is None else to


def forward_trigger(state: State, target: State) -> Trigger | None:
    """The one trigger that moves ``state`` to ``target``, a state other than failed.

    Used by the adapter, which sees *where* the graph went and asks the table
    *how* it got there; failures always name their trigger explicitly.
    """
    if target is State.FAILED:
        return None
    found = [trig for (src, trig), dsts in TRANSITIONS.items() if src == state and target in dsts]
    return found[0] if len(found) == 1 else None
