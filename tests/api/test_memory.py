"""Long-term memory (DESIGN §6): kept in LangGraph's store in the run database, under
the run's own tenant and user, from one run to the next."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest
from langgraph.store.memory import InMemoryStore

from runtime.backend import open_backend
from runtime.ids import content_hash
from runtime.lifecycle import State
from runtime.memory import MAX_ADDRESS_BYTES, MAX_VALUE_BYTES, MAX_VALUE_DEPTH, Memory
from runtime.model import RunContext, RunCreate
from tests.api.conftest import Api
from tests.api.helpers import problem
from tests.auth import OPS_TENANT, OPS_USER, bearer


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


async def test_a_user_sees_and_forgets_what_agents_keep_about_them(api: Api) -> None:
    await answer(api, "remember color teal", user=OPS_USER, tenant=OPS_TENANT)
    assert api.engine.memory is not None
    mine = Memory(api.engine.memory, OPS_TENANT, OPS_USER)
    await mine.put("p1", {"v": 1}, "projects")
    await mine.put("size", {"value": "L"})

    listed = (await api.client.get("/memory")).json()
    assert listed == {"color": {"value": "teal"}, "size": {"value": "L"}}
    assert (await api.client.get("/memory", params={"sub": "projects"})).json() == {"p1": {"v": 1}}
    assert (await api.client.delete("/memory/size")).status_code == 204
    assert (await api.client.delete("/memory/never-kept")).status_code == 204  # not audited
    assert set((await api.client.get("/memory")).json()) == {"color"}

    forgotten = await api.client.delete("/memory")
    assert forgotten.json() == {"forgotten": 2}  # color, and p1 below projects
    assert (await api.client.get("/memory")).json() == {}
    assert await answer(api, "recall color", user=OPS_USER, tenant=OPS_TENANT) == "None"
    trail, _ = await api.engine_services.store.page_audit(OPS_TENANT, limit=10, cursor=None)
    assert [(e.action, e.subject, e.detail) for e in trail] == [
        ("memory.delete", OPS_USER, {"item": content_hash({"sub": [], "key": "size"}), "items": 1}),
        ("memory.forget", OPS_USER, {"forgotten": 2}),
    ]


async def test_only_a_tenant_admin_reaches_another_users_memory(api: Api) -> None:
    await answer(api, "remember color teal", user="u-other", tenant=OPS_TENANT)
    await answer(api, "remember color red", user="u-other", tenant="other-co")

    problem(await api.client.get("/memory", params={"user_id": "u-other"}), 403, "ROLE_REQUIRED")
    admin = bearer(user="u-adm", roles=["admin"])
    seen = await api.client.get("/memory", params={"user_id": "u-other"}, headers=admin)
    assert seen.json() == {"color": {"value": "teal"}}  # this tenant's u-other only
    gone = await api.client.delete("/memory", params={"user_id": "u-other"}, headers=admin)
    assert gone.json() == {"forgotten": 1}
    assert await answer(api, "recall color", user="u-other", tenant="other-co") == "red"

    # The erasure is on the tenant's audit trail: who, for whom, how much; its admins
    # read it, nobody else (another tenant's admin sees its own, empty, trail).
    trail = (await api.client.get("/audit", headers=admin)).json()
    assert [(e["action"], e["subject"], e["detail"]) for e in trail] == [
        ("memory.forget", "u-other", {"forgotten": 1})
    ]
    assert trail[0]["actor"].startswith("u-adm via ") and trail[0]["tenant_id"] == OPS_TENANT
    problem(await api.client.get("/audit"), 403, "ROLE_REQUIRED")
    elsewhere = bearer(user="u-adm", tenant="other-co", roles=["admin"])
    assert (await api.client.get("/audit", headers=elsewhere)).json() == []


@pytest.mark.parametrize("user_id", ["ann\u200b", "a\nb", "\u202eann", "x" * 201])
async def test_an_admin_names_a_user_as_a_principal_could_be_named(api: Api, user_id: str) -> None:
    """No principal has such a name: an erasure under it would go on the trail as one
    of someone else's memory (an invisible character prints as nothing)."""
    admin = bearer(roles=["admin"])
    for method in ("GET", "DELETE"):
        resp = await api.client.request(
            method, "/memory", params={"user_id": user_id}, headers=admin
        )
        problem(resp, 422, "VALIDATION_ERROR")
    trail, _ = await api.engine_services.store.page_audit(OPS_TENANT, limit=10, cursor=None)
    assert trail == []


async def test_a_users_memory_is_theirs_alone_whatever_the_ids(api: Api) -> None:
    backend = await open_backend(api.settings.resolved_database_url)
    try:
        store = backend.memory
        # Ids one of which is a prefix of the other, or that differ only where a LIKE
        # or GLOB pattern would not look.
        neighbours = [("acme.com", "anna"), ("acme-x.com", "ann"), ("acme%com", "a_n")]
        for tenant, user in [("acme.com", "ann"), *neighbours]:
            await Memory(store, tenant, user).put("k", {"who": f"{user}@{tenant}"})
        ann = Memory(store, "acme.com", "ann")
        assert await ann.items() == {"k": {"who": "ann@acme.com"}}

        assert await ann.forget() == 1
        for tenant, user in neighbours:
            assert await Memory(store, tenant, user).get("k") == {"who": f"{user}@{tenant}"}
    finally:
        await backend.close()


async def test_a_sub_namespace_label_is_bounded(api: Api) -> None:
    too_long = await api.client.get("/memory", params={"sub": "x" * 201})
    problem(too_long, 422, "VALIDATION_ERROR")
    problem(await api.client.get("/memory", params={"sub": ""}), 422, "VALIDATION_ERROR")


async def test_a_slash_after_memory_erases_nothing(api: Api) -> None:
    # Starlette's default answered /memory/ with a 307 to /memory, which a client that
    # follows redirects (DELETE included) then sent: every memory of the user erased.
    assert api.engine.memory is not None
    mine = Memory(api.engine.memory, OPS_TENANT, OPS_USER)
    await mine.put("size", {"value": "L"})

    resp = await api.client.delete("/memory/", follow_redirects=True)
    problem(resp, 422, "VALIDATION_ERROR")
    assert resp.history == []
    problem(await api.client.get("/runs/", follow_redirects=True), 404, "NOT_FOUND")
    assert await mine.items() == {"size": {"value": "L"}}


@pytest.mark.parametrize("query", ["sub=prefs", "user=ann", "user_id=" + OPS_USER + "&key=size"])
async def test_an_erase_all_with_a_parameter_it_does_not_take_erases_nothing(
    api: Api, query: str
) -> None:
    """Ignored, ``?sub=prefs`` (meant for one entry's route) erased everything the
    user has (a fuzzing helper found)."""
    assert api.engine.memory is not None
    mine = Memory(api.engine.memory, OPS_TENANT, OPS_USER)
    await mine.put("size", {"value": "L"})

    detail = problem(await api.client.delete(f"/memory?{query}"), 422, "VALIDATION_ERROR")
    assert "takes only ?user_id=" in detail["detail"]
    assert await mine.items() == {"size": {"value": "L"}}
    assert (await api.client.delete(f"/memory?user_id={OPS_USER}")).json() == {"forgotten": 1}


async def test_every_key_listed_can_be_forgotten_on_its_own(api: Api) -> None:
    assert api.engine.memory is not None
    mine = Memory(api.engine.memory, OPS_TENANT, OPS_USER)
    long_key = "k" * 1000
    odd = ["line\nbreak", "ends\n", "cr\rtab\t", "\u2028sep"]  # `.` of a route stops at \n
    for key in ("a/b", long_key, "keep", *odd):
        await mine.put(key, {"v": key[:3]})
    assert set((await api.client.get("/memory")).json()) == {"a/b", long_key, "keep", *odd}

    assert (await api.client.delete("/memory/a%2Fb")).status_code == 204
    assert (await api.client.delete(f"/memory/{long_key}")).status_code == 204
    for key in odd:
        assert (await api.client.delete(f"/memory/{quote(key)}")).status_code == 204, key
    assert set((await api.client.get("/memory")).json()) == {"keep"}


async def test_an_erasure_sent_many_times_at_once_is_on_the_trail_once(api: Api) -> None:
    assert api.engine.memory is not None
    mine = Memory(api.engine.memory, OPS_TENANT, OPS_USER)
    await mine.put("size", {"value": "L"})
    await mine.put("color", {"value": "teal"})

    sent = [api.client.delete("/memory/size") for _ in range(6)]
    sent += [api.client.delete("/memory") for _ in range(3)]
    answers = await asyncio.gather(*sent)

    assert all(a.status_code in (200, 204) for a in answers), [a.text for a in answers]
    trail, _ = await api.engine_services.store.page_audit(OPS_TENANT, limit=20, cursor=None)
    erased = [e.detail for e in trail]
    # Each item's erasure once, whichever request erased it; the rest erased nothing.
    assert sum(d.get("items", 0) + d.get("forgotten", 0) for d in erased) == 2, erased
    # And what each whole erasure answered is what the trail says it erased.
    answered = sum(a.json()["forgotten"] for a in answers if a.status_code == 200)
    assert answered == sum(d.get("forgotten", 0) for d in erased)


async def test_an_erasure_whose_client_hangs_up_is_still_on_the_trail(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client goes between the erasure and its audit entry: the entry is written
    all the same (an erasure off the trail is one nobody can show was asked for)."""
    assert api.engine.memory is not None
    await Memory(api.engine.memory, OPS_TENANT, OPS_USER).put("size", {"value": "L"})
    store = api.engine_services.store
    record, recording, go_on = store.record_audit, asyncio.Event(), asyncio.Event()

    async def held(*args: Any, **kwargs: Any) -> Any:
        recording.set()
        await go_on.wait()
        return await record(*args, **kwargs)

    monkeypatch.setattr(store, "record_audit", held)
    request = asyncio.create_task(api.client.delete("/memory/size"))
    await asyncio.wait_for(recording.wait(), 30)  # a bound on a hang, not a speed
    request.cancel()  # in-process, the client's task is the request's: it hangs up
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await request

    trail, _ = await store.page_audit(OPS_TENANT, limit=10, cursor=None)
    assert [(e.action, e.detail) for e in trail] == [
        ("memory.delete", {"item": content_hash({"sub": [], "key": "size"}), "items": 1})
    ]
    assert (await api.client.get("/memory")).json() == {}


async def test_a_memory_the_api_could_not_name_is_not_written() -> None:
    mine = Memory(InMemoryStore(), "t", "u")
    dot_segments = [".", "..", "a/..", "a/b/..", "./a", "a/./b", "a/."]
    for key, sub in [
        ("", ()),
        ("k" * 1001, ()),
        ("k", ("x" * 201,)),
        ("k", ("s",) * 9),
        *((key, ()) for key in dot_segments),  # a URL client would send another path
    ]:
        try:
            await mine.put(key, {"v": 1}, *sub)
        except ValueError:
            continue
        raise AssertionError(f"kept key {key[:10]!r} under {len(sub)} labels")
    await mine.put("k" * 1000, {"v": 1}, *(["x" * 200] * 8))
    for key in ["...", ".a", "a.", "a/.b", "a/..b/c", ". ", "a%2F.."]:
        await mine.put(key, {"v": 1})


async def test_a_dot_key_an_older_version_wrote_is_erased_on_its_own(api: Api) -> None:
    assert api.engine.memory is not None
    mine = Memory(api.engine.memory, OPS_TENANT, OPS_USER)
    await mine.put("keep", {"v": 1})
    await api.engine.memory.aput(mine._namespace(()), ".", {"v": 2})  # before the refusal

    assert (await api.client.delete("/memory/%2E")).status_code == 204
    assert await mine.items() == {"keep": {"v": 1}}


async def test_what_the_first_versions_wrote_is_erased_with_the_users_memory(
    backend: Any,
) -> None:
    """Their labels escaped with "%" (and had no "=" leaf): no migration moved what
    they wrote, and an erasure left it in the store, counted as nothing."""
    store = backend.memory
    first = ("memory", "%acme%2Ecom", "%ann")
    await store.aput((*first, "="), "region", {"v": "east"})
    await store.aput((*first, "%reports", "="), "pref", {"v": 1})
    await store.aput(first, "no-leaf", {"v": 2})
    others = [("memory", "%acme%2Ecom", "%anna"), ("memory", "%acme%2Ecom", "%ann%25")]
    for other in others:
        await store.aput((*other, "="), "region", {"v": "theirs"})
    mine = Memory(store, "acme.com", "ann")
    await mine.put("now", {"v": 3})

    assert await mine.forget() == 4

    assert await store.asearch(first) == [] and await mine.items() == {}
    for other in others:
        assert (await store.aget((*other, "="), "region")) is not None, other


def nested(levels: int) -> dict[str, Any]:
    """A value nesting ``levels`` + 1 levels deep: an object around ``levels`` lists."""
    inner: Any = 1
    for _ in range(levels):
        inner = [inner]
    return {"a": inner}


def varied(n: int, start: int) -> str:
    """``n`` characters that do not repeat: PostgreSQL cannot compress them under its
    index limit."""
    return "".join(chr(start + i * 7919 % 0x300) for i in range(n))


async def test_what_one_store_keeps_the_other_keeps_too(backend: Any) -> None:
    """Memory.put refuses up front what PostgreSQL would (a NUL, NaN, an index entry
    too large), so an agent's write fails with the same message on both stores."""
    mine = Memory(backend.memory, "t" * 64, "u" * 64)
    # As long as it may be: 4-byte characters filling the address to its bound.
    longest = varied(1000, 0x1F300)
    fits = MAX_ADDRESS_BYTES - len(".".join(mine._namespace(("s" * 100,))).encode())
    await mine.put(longest[: fits // 4], {"v": 1}, "s" * 100)
    await mine.put(varied(fits // 3, 0x4E00) + "a" * (fits % 3), {"v": 1}, "s" * 100)
    # As deep and as large as a value may be.
    await mine.put("deep", nested(MAX_VALUE_DEPTH - 1), "s" * 100)
    await mine.put("large", {"v": "é" * ((MAX_VALUE_BYTES - len('{"v": ""}')) // 2)}, "s" * 100)
    assert len(await mine.items("s" * 100)) == 4

    refused: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
        (longest, {"v": 1}, ()),
        (longest[: fits // 4] + "a" * (fits % 4 + 1), {"v": 1}, ("s" * 100,)),
        ("k\x00", {"v": 1}, ()),
        ("k", {"v": "\x00"}, ()),
        ("k", {"\x00": 1}, ()),
        ("k", {"v": float("nan")}, ()),
        ("k", {"v": 2**64}, ()),
        ("k\ud800", {"v": 1}, ()),
        # Nested past the bound: PostgreSQL kept it and every listing of the user's
        # memories failed (500); SQLite refused it. As deep as the stack allows, too.
        ("k", nested(MAX_VALUE_DEPTH), ()),
        ("k", nested(5000), ()),
        ("k", {"v": "x" * MAX_VALUE_BYTES}, ()),
        # Not JSON: SQLite's store took it (orjson), PostgreSQL's raised a TypeError.
        ("k", {"at": datetime(2026, 12, 7, tzinfo=UTC)}, ()),
    ]
    for key, value, sub in refused:
        with pytest.raises(ValueError):
            await mine.put(key, value, *sub)
    assert len(await mine.items("s" * 100)) == 4 and await mine.items() == {}
