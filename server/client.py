"""A small synchronous HTTP client for the agent-runtime API, used by the CLI.

It speaks plain JSON (``dict``s as the API sends them, so a newer server's extra
fields pass through untouched) and follows a run's SSE stream, reconnecting with
``Last-Event-ID`` when the connection drops.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from runtime import lifecycle

JSON = dict[str, Any]

# The public states come from the one lifecycle table; the client only reads them.
TERMINAL = frozenset(state.value for state in lifecycle.TERMINAL)
WAITING_HUMAN = lifecycle.State.WAITING_HUMAN.value

#: How long :meth:`Client.events` keeps trying to reconnect before giving up.
RECONNECT_WINDOW_S = 60.0
#: The server sends a keepalive comment every 15 s by default; silence longer than
#: this means the connection is dead even if no error surfaced.
STREAM_READ_TIMEOUT_S = 45.0
NOT_SENDABLE = (httpx.LocalProtocolError, httpx.UnsupportedProtocol)
"""What httpx raises for a request it cannot send anywhere (a header that is not one line
of ASCII, a URL that is not http or https): the caller's mistake, not the server away."""


class ApiError(Exception):
    """An HTTP error answer (its problem+json body) or an unreachable server."""

    def __init__(self, status: int | None, problem: JSON) -> None:
        self.status = status
        self.problem = problem
        super().__init__(f"{self.code}: {self.detail}")

    @property
    def code(self) -> str:
        return str(self.problem.get("code") or f"HTTP_{self.status}")

    @property
    def detail(self) -> str:
        return str(self.problem.get("detail") or self.problem.get("title") or "")

    @classmethod
    def from_response(cls, resp: httpx.Response) -> ApiError:
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            # Not ours (a --url reaching another server, a proxy's page): one line of it.
            first = next((line.strip() for line in resp.text.splitlines() if line.strip()), "")
            body = {"title": resp.reason_phrase, "detail": first[:200]}
        body.setdefault("status", resp.status_code)
        return cls(resp.status_code, body)

    @classmethod
    def unreachable(cls, url: str, exc: Exception) -> ApiError:
        return cls(
            None,
            {
                "title": "Server unreachable",
                "detail": f"{url}: {exc.__class__.__name__}: {exc}".rstrip(": "),
                "code": "SERVER_UNREACHABLE",
            },
        )


RUN_KEYS = ("run_id", "state")
"""What every answer that is a run has, and the CLI reads without looking."""


def is_run(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(value.get(k), str) for k in RUN_KEYS)


def _expect(shaped: bool, status: int, detail: str) -> None:
    """An answer not of the shape ours have (a --url reaching another server that
    speaks JSON) is a bad response, not a KeyError further on."""
    if not shaped:
        raise ApiError(status, {"code": "BAD_RESPONSE", "detail": detail})


def segment(what: str, value: str) -> str:
    """An id as one path segment, percent-encoded. One holding "/" or a dot segment is
    refused: the server decodes "%2F" before routing, the client resolves "..", and
    either would address another resource ("RUN/checkpoint", "x/../RUN")."""
    if not value or "/" in value or value in (".", ".."):
        raise ApiError(None, {"code": "VALIDATION_ERROR", "detail": f"not a {what}: {value!r}"})
    return quote(value, safe="")


@dataclass
class SseParser:
    """Incremental ``text/event-stream`` parsing (the parts the server uses)."""

    retry_ms: int | None = None
    _data: list[str] = field(default_factory=list)

    def feed(self, lines: Iterable[str]) -> Iterator[JSON]:
        for raw in lines:
            line = raw.rstrip("\r")
            if not line:
                if self._data:
                    payload, self._data = "\n".join(self._data), []
                    parsed = json.loads(payload)
                    if isinstance(parsed, dict):
                        yield parsed
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                self._data.append(value)
            elif name == "retry" and value.isdigit():
                self.retry_ms = int(value)
            # "id" and "event" repeat what the data carries (seq and type).


class Client:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        parsed = httpx.URL(base_url)
        if parsed.query or parsed.fragment or base_url.rstrip("/").endswith(("?", "#")):
            # Every path is put before it: each request went to ".../?x=1/runs", a 404.
            raise httpx.InvalidURL("a server URL has no query string or fragment")
        self.base_url = base_url.rstrip("/")
        headers = {"Accept": "application/json", "User-Agent": "agent-runtime-cli"}
        if token:
            if not all(" " <= c <= "~" for c in token):
                # Refused here, not when sent: a line break reached no further than a
                # refused connection, which said "server unreachable".
                raise httpx.LocalProtocolError("a token is one line of printable ASCII")
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=10.0),
            transport=transport,
            headers=headers,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # -- plain requests ---------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self.http.request(method, path, **kwargs)
        except NOT_SENDABLE:
            raise
        except httpx.TransportError as exc:
            raise ApiError.unreachable(self.base_url + path, exc) from exc
        if resp.status_code >= 400:
            raise ApiError.from_response(resp)
        return resp

    def _json(self, method: str, path: str, **kwargs: Any) -> tuple[Any, int]:
        resp = self._request(method, path, **kwargs)
        try:
            return resp.json(), resp.status_code
        except ValueError as exc:
            raise ApiError(
                resp.status_code,
                {"code": "BAD_RESPONSE", "detail": f"{path} did not answer JSON: {exc}"},
            ) from exc

    def _run(self, method: str, path: str, **kwargs: Any) -> tuple[JSON, int]:
        """A request answered with a run."""
        run, status = self._json(method, path, **kwargs)
        _expect(is_run(run), status, f"{path} did not answer a run")
        return run, status

    def create_run(self, body: JSON, idempotency_key: str | None = None) -> tuple[JSON, bool]:
        """POST /runs; returns (run, whether it was created now rather than found)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        run, status = self._run("POST", "/runs", json=body, headers=headers)
        return run, status == 201

    def get_run(self, run_id: str) -> JSON:
        run, _ = self._run("GET", f"/runs/{segment('run id', run_id)}")
        return run

    def list_runs(
        self,
        *,
        state: list[str] | None = None,
        agent_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JSON:
        params = {"state": state, "agent_id": agent_id, "limit": limit, "cursor": cursor}
        page, status = self._json(
            "GET", "/runs", params={k: v for k, v in params.items() if v is not None}
        )
        items = page.get("items") if isinstance(page, dict) else None
        shaped = isinstance(items, list) and all(is_run(item) for item in items)
        _expect(shaped, status, "/runs did not answer a page of runs")
        result: JSON = page
        return result

    def decide(
        self,
        run_id: str,
        approval_id: str,
        decision: str,
        *,
        comment: str | None = None,
        decided_by: str | None = None,
    ) -> tuple[JSON, bool]:
        """Returns (approval, whether this call decided it rather than repeated a decision)."""
        body: JSON = {"decision": decision}
        if comment is not None:
            body["comment"] = comment
        if decided_by is not None:
            body["decided_by"] = decided_by
        path = f"/runs/{segment('run id', run_id)}/approvals/{segment('approval id', approval_id)}"
        approval, status = self._json("POST", path, json=body)
        shaped = isinstance(approval, dict) and isinstance(approval.get("approval_id"), str)
        _expect(shaped, status, f"{path} did not answer an approval")
        return approval, status == 202

    def cancel(self, run_id: str, reason: str | None, compensate: bool) -> JSON:
        body: JSON = {"compensate": compensate}
        if reason is not None:
            body["reason"] = reason
        run, _ = self._run("POST", f"/runs/{segment('run id', run_id)}/cancel", json=body)
        return run

    def trace(self, run_id: str) -> JSON:
        path = f"/runs/{segment('run id', run_id)}/trace"
        trace, status = self._json("GET", path)
        shaped = isinstance(trace, dict) and is_run(trace.get("run"))
        _expect(shaped, status, f"{path} did not answer a trace")
        result: JSON = trace
        return result

    # -- the event stream -------------------------------------------------------

    def events(
        self,
        run_id: str,
        after: int = 0,
        *,
        on_reconnect: Callable[[int, str], None] | None = None,
        reconnect_window_s: float = RECONNECT_WINDOW_S,
    ) -> Iterator[JSON]:
        """Every event of the run after seq ``after``, live, until the server ends the
        stream after the terminal state event (or the caller stops iterating).

        A dropped connection is reopened with ``Last-Event-ID`` (the last seq seen),
        so nothing is missed or repeated; ``on_reconnect(last_seq, why)`` is told.
        It gives up with :class:`ApiError` after ``reconnect_window_s`` without
        getting through; 4xx answers are raised at once.
        """
        path = f"/runs/{segment('run id', run_id)}/events"
        last = after
        failing_since: float | None = None
        delay_s = 1.0
        while True:
            answered: ApiError | None = None  # the server's answer, where it gave one
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            timeout = httpx.Timeout(30.0, read=STREAM_READ_TIMEOUT_S)
            why: str
            try:
                with self.http.stream("GET", path, headers=headers, timeout=timeout) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        error = ApiError.from_response(resp)
                        if resp.status_code < 500 and resp.status_code != 429:
                            raise error
                        # (429: the caller's streams are all open for now. A follow
                        # that stopped here would have the action it follows, already
                        # done, tried again by a script reading the exit code.)
                        raise _Retry(error, _retry_after(resp))
                    parser = SseParser()
                    got_any = False
                    for event in parser.feed(resp.iter_lines()):
                        seq = event.get("seq")
                        if isinstance(seq, int):
                            if seq <= last:
                                continue  # never show an event twice
                            last = seq
                        got_any = True
                        failing_since, delay_s = None, 1.0
                        yield event
                    if parser.retry_ms is not None:
                        delay_s = max(0.1, parser.retry_ms / 1000)
                # The server ends the stream once the run is terminal; an end without
                # that (a restarting server) is a drop like any other.
                if not got_any and self.get_run(run_id)["state"] in TERMINAL:
                    return
                why = "stream ended"
            except _Retry as exc:
                answered, why = exc.error, str(exc)
                delay_s = max(delay_s, exc.after_s)
            except NOT_SENDABLE:
                raise
            except httpx.TransportError as exc:
                why = f"{exc.__class__.__name__}: {exc}".rstrip(": ")
            except ApiError as exc:
                if exc.status is not None and exc.status < 500:
                    raise
                answered, why = (exc if exc.status is not None else None), str(exc)
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > reconnect_window_s:
                if answered is not None:  # busy, or failing: not out of reach
                    gave_up = f"{answered.detail} (still so after {reconnect_window_s:g} s)"
                    raise ApiError(answered.status, {**answered.problem, "detail": gave_up})
                raise ApiError.unreachable(
                    f"{self.base_url}/runs/{run_id}/events", ConnectionError(why)
                )
            if on_reconnect is not None:
                on_reconnect(last, why)
            time.sleep(delay_s)
            delay_s = min(delay_s * 1.5, 5.0)


class _Retry(Exception):
    """A 5xx or 429 answer on the stream: worth another try, ``after_s`` from now at
    the soonest."""

    def __init__(self, error: ApiError, after_s: float) -> None:
        super().__init__(str(error))
        self.error = error
        self.after_s = after_s


def _retry_after(resp: httpx.Response) -> float:
    """The answer's ``Retry-After`` in seconds (a date is not used), within reason."""
    text = resp.headers.get("retry-after", "")
    return float(min(int(text), 30)) if text.isdigit() else 0.0
