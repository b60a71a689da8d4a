"""Credentials: API keys (hashed, revocable) and JWTs (HS256, RS256 by key or JWKS)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import sqlite3
import time
from pathlib import Path
from typing import Any, TypedDict

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec as ec_keys
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from runtime.backend import open_backend
from server.auth.authenticate import Authenticator
from server.auth.bootstrap import ensure_local_keys, read_local_keys
from server.auth.jwt_tokens import JwtVerifier
from server.auth.keys import create_key, hash_secret
from server.settings import Settings
from tests.api.conftest import Api, open_api
from tests.api.helpers import problem
from tests.auth import TEST_JWT_SECRET, token


def claims(**over: Any) -> dict[str, Any]:
    base = {
        "sub": "u-ops-001",
        "tenant_id": "demo-retail",
        "roles": [],
        "scope": "sales_region:east",
        "exp": int(time.time()) + 600,
    }
    return {**base, **over}


def hs256_with(key: bytes, payload: dict[str, Any]) -> str:
    """An HS256 token keyed with ``key``, built by hand: PyJWT refuses to sign with a PEM."""

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing = b64(b'{"alg":"HS256","typ":"JWT"}') + b"." + b64(json.dumps(payload).encode())
    signature = b64(hmac.new(key, signing, hashlib.sha256).digest())
    return (signing + b"." + signature).decode()


def without_exp() -> dict[str, Any]:
    return {k: v for k, v in claims().items() if k != "exp"}


async def status_with(api: Api, bearer: str) -> httpx.Response:
    return await api.client.get("/runs", headers={"Authorization": f"Bearer {bearer}"})


async def test_api_key_lifecycle(api: Api) -> None:
    store = api.engine_services.store
    key = await create_key(
        store, tenant_id="demo-retail", user_id="svc-1", roles=["approver"], scopes=["a"]
    )
    secret = key.token.removeprefix(f"ark_{key.key_id}_")  # the secret may hold "_" too
    row = await store.get_api_key(key.key_id)
    assert row is not None and row.key_hash == hash_secret(secret)
    assert secret not in row.key_hash and row.roles == ["approver"]

    assert (await status_with(api, key.token)).status_code == 200
    run = await api.client.post(
        "/runs",
        json={"input": "q", "agent_id": "typo_fixer"},
        headers={"Authorization": f"Bearer {key.token}"},
    )
    assert run.json()["context"] == {"user_id": "svc-1", "tenant_id": "demo-retail", "scope": ["a"]}

    tampered = key.token[:-1] + ("A" if key.token[-1] != "A" else "B")
    problem(await status_with(api, tampered), 401, "UNAUTHENTICATED")
    assert await store.revoke_api_key(key.key_id)
    problem(await status_with(api, key.token), 401, "UNAUTHENTICATED")
    with pytest.raises(ValueError, match="unknown role"):
        await create_key(store, tenant_id="t", user_id="u", roles=["root"])


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"tenant_id": "t\x01"}, "tenant id"),
        ({"user_id": ""}, "user id"),
        ({"scopes": [""]}, "scopes"),
        ({"scopes": ["s" * 201]}, "scopes"),
        ({"scopes": ["east", "we\nst"]}, "scopes"),
        ({"label": "l" * 201}, "label"),
        # Printed as "alice" (or as "al ice"), and not that user: four eyes compare ids.
        ({"user_id": "alice "}, "user id"),
        ({"user_id": "al\u00a0ice"}, "user id"),
    ],
)
async def test_a_key_is_refused_a_name_no_token_could_carry(
    api: Api, fields: dict[str, Any], why: str
) -> None:
    store = api.engine_services.store
    before = await store.list_api_keys()
    with pytest.raises(ValueError, match=why):
        await create_key(store, **{"tenant_id": "t", "user_id": "u", **fields})
    assert await store.list_api_keys() == before


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: jwt.encode(claims(exp=int(time.time()) - 45), TEST_JWT_SECRET), "expired"),
        (lambda: jwt.encode(claims(nbf=int(time.time()) + 45), TEST_JWT_SECRET), "not yet"),
        (lambda: jwt.encode(claims(iat=int(time.time()) + 45), TEST_JWT_SECRET), "not yet"),
        (lambda: jwt.encode(claims(), "some-other-secret-of-enough-length"), "Signature"),
        (
            lambda: jwt.encode({k: v for k, v in claims().items() if k != "exp"}, TEST_JWT_SECRET),
            "exp",
        ),
        (lambda: jwt.encode(claims(tenant_id=None), TEST_JWT_SECRET), "tenant_id"),
        (lambda: jwt.encode(claims(tenant_id="t" * 201), TEST_JWT_SECRET), "tenant_id"),
        (lambda: jwt.encode(claims(sub="u\x00"), TEST_JWT_SECRET), "sub"),
        # PyJWT's annotation of ``key`` leaves out None, the only key alg "none" accepts.
        (lambda: jwt.encode(claims(), None, algorithm="none"), "algorithm"),  # type: ignore[arg-type]
        (lambda: jwt.encode(claims(roles="approver"), TEST_JWT_SECRET), "lists"),
        # Half a surrogate pair: JSON text carries it, no store keeps it (was a 500).
        (lambda: jwt.encode(claims(sub="sur\udc80"), TEST_JWT_SECRET), "sub"),
        (lambda: jwt.encode(claims(scope="east \udc80"), TEST_JWT_SECRET), "names"),
        (lambda: jwt.encode(claims(scope="east\x00west"), TEST_JWT_SECRET), "names"),
        (lambda: jwt.encode(claims(scopes=["east", 1]), TEST_JWT_SECRET), "names"),
        (lambda: jwt.encode(claims(roles=[{"a": 1}]), TEST_JWT_SECRET), "names"),
        # Not read as str(5) or str(["a"]): a scope claim is a space-separated string.
        (lambda: jwt.encode(claims(scope=5), TEST_JWT_SECRET), "scope"),
        (lambda: jwt.encode(claims(scope=["east"]), TEST_JWT_SECRET), "scope"),
        # Written into the audit trail as who decided or erased (was a 500, after the
        # erasure it was to record).
        (lambda: jwt.encode(claims(iss="\ud800"), TEST_JWT_SECRET), "iss"),
        (lambda: jwt.encode(claims(iss="a\x00b"), TEST_JWT_SECRET), "iss"),
        # (PyJWT signs no such token: built by hand)
        (lambda: hs256_with(TEST_JWT_SECRET.encode(), claims(iss=5)), "iss"),
        (lambda: jwt.encode(claims(iss="i" * 201), TEST_JWT_SECRET), "iss"),
        # Printed as "demo-retail" by anything showing it, and not that tenant.
        (lambda: jwt.encode(claims(tenant_id="demo-retail\x01"), TEST_JWT_SECRET), "tenant_id"),
        (lambda: jwt.encode(claims(tenant_id="demo-retail\u200b"), TEST_JWT_SECRET), "tenant_id"),
        (lambda: jwt.encode(claims(sub="u-ops-001\u202e"), TEST_JWT_SECRET), "sub"),
        (lambda: jwt.encode(claims(sub="u-ops\u2028001"), TEST_JWT_SECRET), "sub"),
        (lambda: jwt.encode(claims(sub="u-ops-001 "), TEST_JWT_SECRET), "sub"),
        (lambda: jwt.encode(claims(tenant_id=" demo-retail"), TEST_JWT_SECRET), "tenant_id"),
        (lambda: jwt.encode(claims(sub="u-ops\u3000001"), TEST_JWT_SECRET), "sub"),
        # A claim given is read as given, not as one left out (nor as its text's number).
        (lambda: jwt.encode(claims(tenant_id=False, tid="t9"), TEST_JWT_SECRET), "tenant_id"),
        (lambda: jwt.encode(claims(tenant_id="", tid="t9"), TEST_JWT_SECRET), "tenant_id"),
        (lambda: jwt.encode(claims(roles=False), TEST_JWT_SECRET), "lists"),
        (lambda: jwt.encode(claims(scopes=0), TEST_JWT_SECRET), "lists"),
        (lambda: jwt.encode(claims(exp=str(int(time.time()) + 600)), TEST_JWT_SECRET), "exp"),
        (lambda: jwt.encode(claims(exp=True), TEST_JWT_SECRET), "exp"),
        (lambda: jwt.encode(claims(iat=str(int(time.time()))), TEST_JWT_SECRET), "iat"),
    ],
)
async def test_bad_jwts_are_401(api: Api, make: Any, why: str) -> None:
    resp = await status_with(api, make())
    problem(resp, 401, "UNAUTHENTICATED")
    assert why in resp.json()["detail"]


@pytest.mark.parametrize("claim", ["iat", "nbf"])
async def test_a_token_from_a_clock_a_little_ahead_is_taken(api: Api, claim: str) -> None:
    """An identity provider whose clock runs a few seconds ahead issues tokens that are
    valid "from" a moment that is still to come here (CLOCK_SKEW_S either way)."""
    ahead = jwt.encode(claims(**{claim: int(time.time()) + 5}), TEST_JWT_SECRET)
    assert (await status_with(api, ahead)).status_code == 200


async def test_a_token_just_past_its_exp_is_taken_within_the_clock_skew(api: Api) -> None:
    just = jwt.encode(claims(exp=int(time.time()) - 5), TEST_JWT_SECRET)
    assert (await status_with(api, just)).status_code == 200


async def test_two_authorization_headers_are_refused(api: Api) -> None:
    """A proxy that checks the last of them would see another caller than the app."""
    mine, theirs = token(user="u-ops-001"), token(user="u-mgr-002")
    resp = await api.client.get(
        "/runs",
        headers=[("Authorization", f"Bearer {mine}"), ("Authorization", f"Bearer {theirs}")],
    )
    problem(resp, 401, "UNAUTHENTICATED")
    assert "one Authorization header" in resp.json()["detail"]


def test_hs256_token_helper_round_trips() -> None:
    decoded = jwt.decode(token(user="x"), TEST_JWT_SECRET, algorithms=["HS256"])
    assert decoded["sub"] == "x" and decoded["tenant_id"] == "demo-retail"


@pytest.fixture
def rsa_keys(tmp_path: Path) -> tuple[Any, Path, Path]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "public.pem"
    pem.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    return private, pem, jwks


class KeySource(TypedDict, total=False):
    """Where Settings reads the RS256 verification key from: one of the two."""

    jwt_public_key_file: Path
    jwt_jwks_file: Path


@pytest.mark.parametrize("source", ["public_key", "jwks"])
async def test_rs256_with_a_public_key_or_jwks(
    database_url: str, data_dir: Path, rsa_keys: tuple[Any, Path, Path], source: str
) -> None:
    private, pem, jwks = rsa_keys
    key_source: KeySource = (
        {"jwt_public_key_file": pem} if source == "public_key" else {"jwt_jwks_file": jwks}
    )
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        bootstrap_local_keys=False,
        jwt_issuer="https://idp.example",
        jwt_audience="agent-runtime",
        **key_source,
    )
    good = claims(iss="https://idp.example", aud="agent-runtime")
    signed = jwt.encode(good, private, algorithm="RS256", headers={"kid": "k1"})
    async with open_api(settings, headers={}) as api:
        client = api.client
        resp = await client.get("/runs", headers={"Authorization": f"Bearer {signed}"})
        assert resp.status_code == 200, resp.text
        for bad in (
            jwt.encode({**good, "iss": "https://evil"}, private, algorithm="RS256"),
            jwt.encode({**good, "aud": "other"}, private, algorithm="RS256"),
            # HS256 keyed with the public key's PEM: the classic algorithm confusion.
            hs256_with(pem.read_bytes() if source == "public_key" else jwks.read_bytes(), good),
        ):
            resp = await client.get("/runs", headers={"Authorization": f"Bearer {bad}"})
            problem(resp, 401, "UNAUTHENTICATED")


async def test_a_jwks_key_of_another_kind_refuses_the_token_naming_it(
    tmp_path: Path, data_dir: Path, rsa_keys: tuple[Any, Path, Path]
) -> None:
    """An identity provider's JWKS may hold EC, OKP, symmetric or encryption keys beside
    its RSA signing keys: a token naming one of them is a 401, not a 500."""
    private, _, jwks = rsa_keys
    ec = ec_keys.generate_private_key(ec_keys.SECP256R1())
    ed = ed25519.Ed25519PrivateKey.generate()
    others = [
        {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec.public_key())), "kid": "ec1"},
        {**json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(ed.public_key())), "kid": "ed1"},
        {"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTEyMzQ", "kid": "oct1"},
        {**json.loads(jwks.read_text())["keys"][0], "kid": "enc1", "use": "enc"},
    ]
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({"keys": [*json.loads(jwks.read_text())["keys"], *others]}))
    settings = Settings(
        data_dir=data_dir,
        database_url=f"sqlite:///{tmp_path / 'runtime.db'}",
        bootstrap_local_keys=False,
        jwt_jwks_file=mixed,
        jwt_issuer="https://idp.example",
        jwt_audience="agent-runtime",
    )
    good = claims(iss="https://idp.example", aud="agent-runtime")
    async with open_api(settings, headers={}) as api:
        for kid in ("ec1", "ed1", "oct1", "enc1"):
            signed = jwt.encode(good, private, algorithm="RS256", headers={"kid": kid})
            problem(await status_with(api, signed), 401, "UNAUTHENTICATED")
        signed = jwt.encode(good, private, algorithm="RS256", headers={"kid": "k1"})
        assert (await status_with(api, signed)).status_code == 200
    only_others = tmp_path / "others.json"
    only_others.write_text(json.dumps({"keys": others}))
    with pytest.raises(ValueError, match="no RS256 signing key"):
        JwtVerifier(settings.model_copy(update={"jwt_jwks_file": only_others}))


def test_via_names_the_local_secret_whatever_iss_its_tokens_carry(
    rsa_keys: tuple[Any, Path, Path],
) -> None:
    """With both kinds configured, the local HS256 secret's holder can write the
    identity provider's iss: the audit names the secret, not the provider."""
    private, pem, _ = rsa_keys
    verifier = JwtVerifier(
        Settings(
            jwt_hs256_secret=TEST_JWT_SECRET,
            jwt_public_key_file=pem,
            jwt_issuer="https://idp.example",
            jwt_audience="agent-runtime",
        )
    )
    good = claims(iss="https://idp.example", aud="agent-runtime")
    assert verifier.verify(jwt.encode(good, TEST_JWT_SECRET)).via == "jwt:HS256"
    signed = jwt.encode(good, private, algorithm="RS256")
    assert verifier.verify(signed).via == "jwt:https://idp.example"


async def test_a_recheck_ends_a_stream_whose_key_is_revoked_or_cannot_be_checked(
    tmp_path: Path, data_dir: Path
) -> None:
    """What an open stream asks every keepalive: a revoked key ends it, and so does a
    database that cannot answer (the stream's own reads would fail on it: it ends
    cleanly, and the reconnect is checked afresh). Anything else is a bug, and raised."""
    url = f"sqlite:///{tmp_path / 'runtime.db'}"
    backend = await open_backend(url)
    store = backend.store
    auth = Authenticator(Settings(data_dir=data_dir, database_url=url), store)
    try:
        revoked = await create_key(store, tenant_id="t", user_id="a")
        kept = await create_key(store, tenant_id="t", user_id="b")
        ends, goes_on = (
            auth.recheck(f"Bearer {revoked.token}"),
            auth.recheck(f"Bearer {kept.token}"),
        )
        assert await ends() and await goes_on()
        assert await store.revoke_api_key(revoked.key_id)
        assert not await ends() and await goes_on()
        assert not await auth.recheck("Bearer not-a-key")()
        async with store.tx() as tx:  # a real database error on the key's lookup
            await tx.execute("ALTER TABLE api_keys RENAME TO api_keys_away")
        assert not await goes_on()
    finally:
        await backend.close()
    with pytest.raises(sqlite3.ProgrammingError):  # a closed store: not a blip, a bug
        await goes_on()


def test_local_keys_are_made_only_on_the_embedded_default_unless_asked() -> None:
    assert Settings(database_url=None).bootstraps_local_keys
    assert not Settings(database_url="postgresql://db/agents").bootstraps_local_keys
    asked = Settings(database_url="postgresql://db/a", bootstrap_local_keys=True)
    assert asked.bootstraps_local_keys
    assert not Settings(bootstrap_local_keys=False).bootstraps_local_keys


async def test_first_start_creates_local_keys_once(database_url: str, data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir, database_url=database_url, bootstrap_local_keys=True)
    async with open_api(settings, headers={}) as api:
        client = api.client
        keys = read_local_keys(data_dir)
        assert set(keys) == {"admin", "approver"}
        assert (data_dir / "local-keys.json").stat().st_mode & 0o777 == 0o600
        admin = {"Authorization": f"Bearer {keys['admin']}"}
        assert (await client.get("/runs", headers=admin)).status_code == 200
        run = await client.post(
            "/runs", json={"input": "q", "agent_id": "retail_analyst"}, headers=admin
        )
        assert run.json()["context"]["tenant_id"] == "local"
        store = api.engine_services.store
        assert await ensure_local_keys(store, data_dir) is not None
        assert read_local_keys(data_dir) == keys  # not replaced on the next start
        made = await store.list_api_keys()
        assert len(made) == 2
        # On the audit trail once, as keys made with the CLI are.
        entries = (await client.get("/audit", headers=admin)).json()
        assert sorted((e["action"], e["actor"], e["subject"]) for e in entries) == sorted(
            ("key.create", "bootstrap", k.key_id) for k in made
        )


async def test_servers_starting_at_once_make_one_set_of_local_keys(
    database_url: str, tmp_path: Path
) -> None:
    """Two processes starting on one fresh database (each its own connection and data
    dir) both find no key: one makes the pair, the other makes none and writes no file."""
    first, second = await open_backend(database_url), await open_backend(database_url)
    try:
        dirs = [tmp_path / "a", tmp_path / "b"]
        written = await asyncio.gather(
            ensure_local_keys(first.store, dirs[0]), ensure_local_keys(second.store, dirs[1])
        )
        made = await first.store.list_api_keys()
        assert sorted(k.user_id for k in made) == ["admin", "approver"]
        (winner,) = [d for d in dirs if (d / "local-keys.json").exists()]
        assert list(written) == [winner / "local-keys.json" if d == winner else None for d in dirs]
        tokens = read_local_keys(winner)
        for key in made:  # the file holds the tokens of the keys that were stored
            assert any(t.startswith(f"ark_{key.key_id}_") for t in tokens.values())
    finally:
        await first.close()
        await second.close()


def test_risky_jwt_settings_refuse_to_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        JwtVerifier(Settings(jwt_hs256_secret="short"))
    pem = tmp_path / "k.pem"
    pem.write_text("unused")
    with pytest.raises(ValueError, match="AUDIENCE"):
        JwtVerifier(Settings(jwt_public_key_file=pem, jwt_issuer="https://idp"))


async def test_a_caller_holding_more_scopes_than_a_run_carries_names_the_runs(api: Api) -> None:
    """Taking every scope held, such a run could be written and never read back: the
    tenant's run list failed with it, and workers retried it for ever."""
    many = " ".join(f"s{i}" for i in range(201))
    bearer = {"Authorization": f"Bearer {jwt.encode(claims(scope=many), TEST_JWT_SECRET)}"}
    resp = await api.client.post("/runs", json={"input": "q"}, headers=bearer)
    problem(resp, 422, "VALIDATION_ERROR")
    assert "context.scope" in resp.json()["detail"]
    listed = await api.client.get("/runs", headers=bearer)
    assert listed.status_code == 200 and listed.json()["items"] == []

    named = {"input": "q", "context": {"scope": ["s7", "s9"]}}
    resp = await api.client.post("/runs", json=named, headers=bearer)
    assert resp.status_code == 201, resp.text
    assert resp.json()["context"]["scope"] == ["s7", "s9"]


@pytest.mark.parametrize(
    "given",
    [
        {"tenant_id": None, "tid": "demo-retail"},
        {"roles": None},
        {"scopes": None},
        {"scope": None},
    ],
)
async def test_a_null_claim_is_one_left_out(api: Api, given: dict[str, Any]) -> None:
    """What an identity provider's claim mapper writes for "not set"."""
    resp = await status_with(api, jwt.encode(claims(**given), TEST_JWT_SECRET))
    assert resp.status_code == 200, resp.text
