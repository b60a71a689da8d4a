"""Long-term memory (DESIGN §6): kept in LangGraph's store in the run database, under
the run's own tenant and user, from one run to the next."""

from __future__ import annotations

from langgraph.store.memory import InMemoryStore

from runtime.backend import open_backend
from runtime.lifecycle import State
from runtime.memory import Memory
from runtime.model import RunContext, RunCreate
from tests.api.conftest import Api


async def answer(api: Api, text: str, user: str = "ann", tenant: str = "acme.com") -> str:
    """Run the rememberer as ``user`` of ``tenant`` (past the API: any caller) and
    return its answer."""
    request = RunCreate(
        agent_id="rememberer", input=text, context=RunContext(user_id=user, tenant_id=tenant)
    )
    run, _ = await api.engine.create_run(request)
    final = await api.engine.wait_settled(run.run_id)
    assert final.state is State.SUCCEEDED, final.outcome
    assert final.result is not None
    return str(final.result["answer"])


async def test_a_later_run_of_the_same_user_recalls_it(api: Api) -> None:
    assert await answer(api, "recall color") == "None"
    await answer(api, "remember color teal blue")

    assert await answer(api, "recall color") == "teal blue"


async def test_another_user_or_tenant_cannot_reach_it(api: Api) -> None:
    await answer(api, "remember color teal")

    assert await answer(api, "recall color", user="bob") == "None"
    assert await answer(api, "recall color", tenant="acme.org") == "None"
    assert await answer(api, "recall color") == "teal"


async def test_it_is_kept_in_the_run_database(api: Api) -> None:
    await answer(api, "remember color teal")

    backend = await open_backend(api.settings.resolved_database_url)
    try:
        kept = Memory(backend.memory, "acme.com", "ann")
        assert await kept.get("color") == {"value": "teal"}
        assert await kept.items() == {"color": {"value": "teal"}}
    finally:
        await backend.close()


async def test_namespaces_cannot_be_confused_by_dots_or_escapes() -> None:
    store = InMemoryStore()
    await Memory(store, "a.b", "u").put("k", {"v": 1})
    await Memory(store, "a", "b.u").put("k", {"v": 2})
    await Memory(store, "a%2Eb", "u").put("k", {"v": 3})
    await Memory(store, "a.b", "u").put("k", {"v": 4}, "inner")

    assert await Memory(store, "a.b", "u").get("k") == {"v": 1}
    assert await Memory(store, "a", "b.u").get("k") == {"v": 2}
    assert await Memory(store, "a%2Eb", "u").get("k") == {"v": 3}
    assert await Memory(store, "a.b", "u").items() == {"k": {"v": 1}}
    assert await Memory(store, "a.b", "u").items("inner") == {"k": {"v": 4}}
    await Memory(store, "a.b", "u").delete("k")
    assert await Memory(store, "a.b", "u").get("k") is None


async def test_a_namespace_lists_its_own_items_not_those_below_it(api: Api) -> None:
    backend = await open_backend(api.settings.resolved_database_url)
    try:
        mine = Memory(backend.memory, "acme.com", "ann")
        await mine.put("color", {"value": "teal"})
        for i in range(5):  # newer, and the stores list the newest first
            await mine.put(f"deep-{i}", {"i": i}, "projects", "p1")

        # The five below do not use up the limit of the namespace above them.
        assert await mine.items(limit=1) == {"color": {"value": "teal"}}
        assert len(await mine.items("projects", "p1")) == 5
        assert await mine.items("projects") == {}
    finally:
        await backend.close()
