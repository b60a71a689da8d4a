"""HEAD is GET without the body (RFC 9110 §9.3.2), on every route that serves GET.

FastAPI routes answer only the methods they name, so ``curl -I`` and a load
balancer's HEAD health check got 405. Here a HEAD request is run as the GET it
stands for, its status and headers (Content-Length included) sent as they are, its
body dropped. A streaming answer (a run's events) ends after its headers: once the
response is complete the server's ``receive`` says the client has gone (the ASGI
spec's ``http.disconnect``; uvicorn does), which stops the stream, so it neither runs
on unseen nor keeps the caller's stream slot.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEAD_KEY = "agent_runtime.head"
"""Set in the GET's scope where it stands for a HEAD."""


def is_head(request: Request) -> bool:
    """Whether this GET stands for a HEAD: a route whose body is costly to read (an
    artifact's bytes) may answer with its headers alone, Content-Length included."""
    return bool(request.scope.get(HEAD_KEY))


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        answered = False

        async def send_head(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                await send(message)
            elif message["type"] == "http.response.body" and not answered:
                answered = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        # A copy: the server's own scope still says HEAD, so it sends no body either.
        await self.app({**scope, "method": "GET", HEAD_KEY: True}, receive, send_head)
