"""The endpoint without a socket: HTTP clients whose transport calls its ASGI app in-process.

Agents that run in the worker's own process (``samplers.agents``) need no
TCP connection, no HTTP parsing and no hop to the server's thread: their
``openai`` client gets an ``httpx`` client whose transport hands each
request to the endpoint's FastAPI app directly, so a request takes the same
code path (the same app, checks, turns, recording) as one over the socket.

- the sync transport (a sync client, an agent in a thread of its own):
  the app runs in the agent's thread, on an event loop of the request's own,
  and the turn is sampled right there (:data:`INLINE`: no worker thread;
  the thread is the agent's and blocks in the batcher as a socket client
  would).
- An async client (``async def`` agents): ``httpx.ASGITransport`` runs the
  app on the agents' own event loop; turns go to worker threads as over the
  socket (the loop serves every episode).

Client timeouts hold as over the socket: a request carries its client's read
timeout as a deadline (:data:`DEADLINE`); a reply sampled after it is not
recorded (the turn's ``gone``, as for a client that disconnected) and the
client gets its HTTP package's ``ReadTimeout``, so its retry continues from
what it did receive. The difference: a turn being sampled is not interrupted,
so the client learns of its timeout when the turn is done, not at the deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import time
from typing import Any

__all__ = ["DEADLINE", "INLINE", "call_app", "http_package", "past_deadline", "transports"]

# True while a request runs on its caller's own thread: the turn is sampled inline.
INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("rlax_agents_inline", default=False)
# The monotonic time after which an in-process request's client has given up (None: never).
DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "rlax_agents_deadline", default=None
)
CLIENT_GONE = 499  # the endpoint's status for a reply nobody got


def past_deadline(deadline: float | None) -> bool:
    """Whether an in-process request's client gave up by now."""
    return deadline is not None and time.monotonic() > deadline


def _deadline(request: Any) -> float | None:
    """The client's read timeout of ``request`` as a monotonic deadline."""
    read = (request.extensions.get("timeout") or {}).get("read")
    return None if read is None else time.monotonic() + float(read)


def _timed_out(http: Any, request: Any, status: int, deadline: float | None) -> None:
    if status == CLIENT_GONE and past_deadline(deadline):
        raise http.ReadTimeout(
            "the in-process endpoint replied after the read timeout", request=request
        )


async def call_app(app: Any, request: Any, body: bytes) -> tuple[int, list, bytes]:
    """(status, headers, body) of the ASGI ``app``'s answer to ``request``."""
    url = request.url
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "scheme": url.scheme,
        "path": url.path,
        "raw_path": url.raw_path.split(b"?")[0],
        "query_string": url.query,
        "server": (url.host, url.port),
        "client": ("127.0.0.1", 0),
        "root_path": "",
    }
    sent = False
    done = asyncio.Event()
    status, headers, parts = 500, [], []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # the client is there until the answer is whole
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    await app(scope, receive, send)
    done.set()
    return status, headers, b"".join(parts)


def http_package(client_class: type) -> Any:
    """The ``httpx``-like package a client class is built on (``openai`` and ``anthropic``
    now ship ``httpx2``; older releases ``httpx``): its transports are that package's."""
    for base in client_class.__mro__:
        root = base.__module__.split(".")[0]
        if root.startswith("httpx"):
            return importlib.import_module(root)
    raise TypeError(f"{client_class.__name__} is not an httpx client")


@functools.cache
def _inline_class(http: Any) -> type:
    class InlineTransport(http.BaseTransport):
        """A sync transport that answers each request by calling ``app`` in the caller's
        thread (see the module docstring)."""

        def __init__(self, app: Any):
            self.app = app

        def handle_request(self, request: Any) -> Any:
            body = request.read()
            deadline = _deadline(request)
            token, until = INLINE.set(True), DEADLINE.set(deadline)
            loop = asyncio.new_event_loop()
            try:
                status, headers, content = loop.run_until_complete(
                    call_app(self.app, request, body)
                )
            finally:
                loop.close()
                INLINE.reset(token)
                DEADLINE.reset(until)
            _timed_out(http, request, status, deadline)
            return http.Response(status, headers=headers, content=content, request=request)

    return InlineTransport


@functools.cache
def _async_class(http: Any) -> type:
    class InProcessTransport(http.ASGITransport):
        """``ASGITransport`` that gives the app its client's read timeout as a deadline."""

        async def handle_async_request(self, request: Any) -> Any:
            deadline = _deadline(request)
            until = DEADLINE.set(deadline)
            try:
                response = await super().handle_async_request(request)
            finally:
                DEADLINE.reset(until)
            _timed_out(http, request, response.status_code, deadline)
            return response

    return InProcessTransport


def transports(app: Any, http: Any) -> tuple[Any, Any]:
    """(sync, async) transports of the ``httpx``-like package ``http`` that call the ASGI
    ``app`` in-process (see the module docstring)."""
    return _inline_class(http)(app), _async_class(http)(app=app, client=("127.0.0.1", 0))
