"""Calls of a step that will not run: another call of it was refused (by the guard) or
rejected (by a human), and the whole step went back to the planner, or the run ended;
the budget ended the run; or the step's own decision was to finish or hand off.

Each is put on the record (an error event, ``CALL_NOT_RUN``) and told to the planner
(an observation), so that nothing a planner proposed, or a human approved, disappears
unexplained. The events are deduplicated: a node that replays writes them once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from runtime.context import Context
from runtime.errors import CODES, Code, Recovery, call_error, call_error_key
from runtime.events import EventType


async def not_run(
    ctx: Context,
    step_index: int,
    calls: Iterable[Mapping[str, Any]],
    because: str,
    *,
    ended: bool = False,
    instead: str = "",
) -> list[dict[str, Any]]:
    """``calls``: each with its tool_call_id, call_index and tool; ``because``: what
    sent the step back ("the rejection of …"), or, ``ended``, ended the run; or, with
    ``instead``, what the step did instead ("the step's decision" … "was to finish").
    Returns their observations."""
    went = "ended the run" if ended else "sent its step back to the planner"
    back = "its step went back to the planner"
    message = f"not run: {because} {instead or went}"
    recovery = Recovery.NONE if ended or instead else CODES[Code.CALL_NOT_RUN].recovery
    summary = message if instead else f"not run: {'the run ended' if ended else back}"
    observations = []
    for call in calls:
        tc_id = call["tool_call_id"]
        await ctx.store.append_event(
            ctx.run_id,
            EventType.ERROR,
            call_error(Code.CALL_NOT_RUN, call, step_index, message, recovery),
            dedupe_key=call_error_key(tc_id),
        )
        observations.append(
            {
                "step_index": step_index,
                "tool_call_id": tc_id,
                "tool": call["tool"],
                "status": Code.CALL_NOT_RUN.value,
                "error": message,
                "summary": summary,
            }
        )
    return observations


def in_call_order(
    observations: list[dict[str, Any]], calls: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The observations of one step in the order its decision proposed the calls."""
    order = {c["tool_call_id"]: c["call_index"] for c in calls}
    return sorted(observations, key=lambda o: order.get(o["tool_call_id"], len(order)))
