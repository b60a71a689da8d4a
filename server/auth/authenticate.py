"""The bearer token of a request → its principal, or 401."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request

from runtime.dberrors import TRANSIENT_DB_ERRORS
from runtime.errors import Code, RuntimeProblem
from runtime.store.base import RunStore
from server.auth.jwt_tokens import JwtError, JwtVerifier
from server.auth.keys import PREFIX, principal_for_key
from server.auth.principal import Principal
from server.settings import Settings

log = logging.getLogger(__name__)


class Authenticator:
    def __init__(self, settings: Settings, store: RunStore) -> None:
        self.store = store
        self.jwt = JwtVerifier(settings)

    async def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise unauthenticated("this endpoint needs a bearer token")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthenticated("use 'Authorization: Bearer <token>'")
        if token.startswith(PREFIX):
            principal = await principal_for_key(self.store, token)
            if principal is None:
                raise unauthenticated("unknown or revoked API key")
            return principal
        if not self.jwt.enabled:
            raise unauthenticated("not an API key, and this server accepts no JWTs")
        try:
            return self.jwt.verify(token)
        except JwtError as exc:
            raise unauthenticated(f"invalid token: {exc}") from exc

    def recheck(self, authorization: str | None) -> Callable[[], Awaitable[bool]]:
        """Whether ``authorization`` still holds, asked again later (by a long-lived
        stream): False once the key is revoked or the token expired, and where the
        database cannot answer now: the stream then ends cleanly (its own reads would
        fail on the same blip), and the client's reconnect is checked afresh."""

        async def still_holds() -> bool:
            try:
                await self.authenticate(authorization)
            except RuntimeProblem:
                return False
            except TRANSIENT_DB_ERRORS as exc:
                log.warning("could not check a stream's credential again: %r", exc)
                return False
            return True

        return still_holds


def unauthenticated(detail: str) -> RuntimeProblem:
    return RuntimeProblem(Code.UNAUTHENTICATED, detail, www_authenticate="Bearer")


def one_authorization(request: Request) -> str | None:
    """The request's Authorization header, the raw one (a wrong scheme gets its own 401
    detail); several are a 401: a proxy that reads the last one would see another
    caller than we would."""
    sent = request.headers.getlist("authorization")
    if len(sent) > 1:
        raise unauthenticated("send one Authorization header, not several")
    return sent[0] if sent else None
