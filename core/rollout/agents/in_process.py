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

Client timeouts are the socket's: in-process there is no connection to give
up on, so a request always gets its reply (and it is recorded).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
from typing import Any

__all__ = ["INLINE", "call_app", "http_package", "transports"]

# True while a request runs on its caller's own thread: the turn is sampled inline.
INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("rlax_agents_inline", default=False)


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
            token = INLINE.set(True)
            loop = asyncio.new_event_loop()
            try:
                status, headers, content = loop.run_until_complete(
                    call_app(self.app, request, body)
                )
            finally:
                loop.close()
                INLINE.reset(token)
            return http.Response(status, headers=headers, content=content, request=request)

    return InlineTransport


def transports(app: Any, http: Any) -> tuple[Any, Any]:
    """(sync, async) transports of the ``httpx``-like package ``http`` that call the ASGI
    ``app`` in-process (see the module docstring)."""
    return _inline_class(http)(app), http.ASGITransport(app=app, client=("127.0.0.1", 0))
