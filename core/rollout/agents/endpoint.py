"""An OpenAI-compatible endpoint for agent code, backed by the policy's sampler, token exact.

``POST /v1/chat/completions`` (messages, ``tools`` and ``tool_calls`` read by
a :class:`~rlax.core.contracts.ToolParser`, ``stream=true`` as server-sent
events, ``logprobs``), ``POST /v1/completions``, ``POST /v1/responses``
(the Responses API) and ``POST /v1/messages`` (the Anthropic Messages API,
key in ``x-api-key``; both :mod:`.formats`: the same chat turn on the same
recording) and ``GET /v1/models``, served by FastAPI on uvicorn. It binds to 127.0.0.1 (port 0: any free one)
unless told otherwise. Every episode gets its own API key
(:meth:`AgentEndpoint.open_episode`); the key is how a request finds its
episode's :class:`~rlax.core.rollout.agents.turns.AgentSession`, so an agent
needs nothing but ``OpenAI(base_url=endpoint.url, api_key=key)``. A request
with any other key is refused (401). Requests are checked by
:mod:`.requests` and refused in the API's error shape. Each turn's
ids are recorded by the episode's
:class:`~rlax.core.rollout.agents.transcript.Transcript` (sampled ids never encoded
again); :meth:`AgentEndpoint.close_episode` hands it back, its segments as
the :class:`~rlax.core.types.Completion` s environments make.

How an agent episode runs (``samplers.agents``, :mod:`rlax.plugins.agents.runner`): a worker owns one endpoint over its sampler; for each sample of a
leased prompt it opens an episode (a key), runs the agent function with an
``openai`` client (sync or async) pointed at the endpoint, under the
episode's limits (turns, tokens, wall time: the worker cancels the agent and
closes the key, so a late request gets 401), then closes the episode and
turns its transcript into the group's completions (its reward from the
agent's answer and the reward plugin, or from the agent). Preemption: agent
code holds state no worker can hand on, so an episode in flight is replayed
from its recorded ids: its transcript goes back with the lease as partial
work, and the next worker runs the agent again with the endpoint answering
each request whose ids match a recorded turn with the recorded reply (same
ids, logprobs, versions; ``AgentSession.replay``) and sampling only past them; an agent that then
asks something else starts a counted new segment. The requests of
concurrent episodes are sampled together, one ``generate`` call per batch
(:class:`~rlax.core.rollout.agents.batch.Batcher`), so they share the
engine's slots.

``max_tokens`` (or ``max_completion_tokens``) above the sampler's
``max_new_tokens`` is not refused: it is clamped to it, and a reply the
budget cut has ``finish_reason`` "length", as the API does. A value that is
not a positive integer is refused (400).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
import uuid
import weakref
import zlib
from typing import Any, Self

import anyio
import anyio.from_thread
import anyio.to_thread

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException
except ImportError as err:  # pragma: no cover -- the agents extra is not installed
    raise ImportError(
        f"the agent endpoint needs the 'agents' extra (pip install 'rlax-llm[agents]'): {err}"
    ) from err

from rlax.core.contracts import Sampler, ToolParser
from rlax.core.rollout.agents.batch import Batcher
from rlax.core.rollout.agents.format_replies import (
    anthropic_error,
    message_body,
    message_events,
    response_body,
    response_events,
)
from rlax.core.rollout.agents.formats import messages_request, responses_request
from rlax.core.rollout.agents.in_process import (
    CLIENT_GONE,
    DEADLINE,
    INLINE,
    past_deadline,
    transports,
)
from rlax.core.rollout.agents.requests import (
    ApiError,
    EndpointLimits,
    Policy,
    chat_request,
    parse_body,
    text_request,
    too_large,
)
from rlax.core.rollout.agents.responses import chat_body, chat_chunks, text_body, text_chunks
from rlax.core.rollout.agents.transcript import Transcript
from rlax.core.rollout.agents.turns import (
    AgentSession,
    Backend,
    ClientGone,
    Turn,
    chat_turn,
    text_turn,
)

__all__ = ["AgentEndpoint"]

log = logging.getLogger("rlax.agents")
LOOPBACK = ("127.0.0.1", "::1", "localhost")
KEEP_ALIVE_S = 60


class AgentEndpoint:
    """The endpoint (see the module docstring).

    Args:
      sampler: the policy's sampler, set up (``setup`` called) and loaded.
      tokenizer: its tokenizer (a chat template for the chat API).
      tool_parser: reads tool calls in the model's text (``@tool_parsers.hermes()``);
        None: ``tools`` are shown to the model but no call is parsed.
      model: the model name the API serves (``GET /v1/models``).
      limits: what one request may hold (None: the defaults).
      host / port: where it listens (127.0.0.1; port 0: a free one).
      batch_window_s: how long a request waits for other episodes' requests to be
        sampled with it (:class:`~rlax.core.rollout.agents.batch.Batcher`).
    """

    def __init__(
        self,
        *,
        sampler: Sampler,
        tokenizer: Any,
        tool_parser: ToolParser | None = None,
        model: str = "rlax-policy",
        limits: EndpointLimits | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        batch_window_s: float = 0.01,
    ):
        self.sessions: dict[str, AgentSession] = {}
        batcher = Batcher(sampler, window_s=batch_window_s, live=lambda: len(self.sessions))
        self.backend = Backend(sampler, tokenizer, tool_parser, batcher)
        self.model, self.host, self.port = model, host, port
        self.limits = limits or EndpointLimits()
        # Turns sampled at once, per event loop (uvicorn's; an async agents' own), grown to
        # the episodes.
        self._limiters: weakref.WeakKeyDictionary[Any, anyio.CapacityLimiter] = (
            weakref.WeakKeyDictionary()
        )
        self.app = _build_app(self)
        self.gone = 0  # replies sampled for a client that had gone: not recorded
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL an ``openai`` client takes (``.../v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    def open_episode(self, name: str, *, max_turns: int = 0, max_tokens: int = 0) -> str:
        """A new episode's API key; its requests are recorded in its own transcript.

        ``max_turns`` replies and ``max_tokens`` ids after its prompt (0: no
        limit); a request past them is refused (400 ``episode_limit_reached``)
        and the session's ``stopped`` says which.
        """
        key = "rlax-" + secrets.token_urlsafe(24)
        self.sessions[key] = AgentSession(name, max_turns=max_turns, max_tokens=max_tokens)
        return key

    def transcript(self, key: str) -> Transcript:
        return self.sessions[key].transcript

    def close_episode(self, key: str) -> Transcript:
        """Ends an episode: its key is refused from now on; its transcript (a turn in
        flight is recorded first)."""
        session = self.sessions.pop(key)
        with session.lock:
            session.closed = True
            return session.transcript

    def limiter(self) -> anyio.CapacityLimiter:
        """The running event loop's limit on turns in worker threads."""
        loop = asyncio.get_running_loop()
        if loop not in self._limiters:
            self._limiters[loop] = anyio.CapacityLimiter(40)
        return self._limiters[loop]

    def transports(self, http: Any) -> tuple[Any, Any]:
        """(sync, async) transports of the ``httpx``-like package ``http`` that call this
        endpoint in-process (:mod:`.in_process`): a client built on them skips the socket."""
        return transports(self.app, http)

    def policy(self) -> Policy:
        """What requests are checked against: the served name and the sampler's settings."""
        sampler = self.backend.sampler
        return Policy(
            model=self.model,
            max_new_tokens=sampler.max_new_tokens,
            temperature=float(sampler.temperature),
            top_p=float(getattr(sampler, "top_p", 1.0) or 1.0),
            top_k=int(getattr(sampler, "top_k", 0) or 0),
        )

    def session(self, request: Request) -> AgentSession:
        """The episode of a request's bearer key (401 for any other)."""
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":  # the Messages API's clients send x-api-key
            key = request.headers.get("x-api-key", "")
        found = self.sessions.get(key.strip())
        if found is None:
            raise ApiError(
                401, "incorrect API key: each episode has its own", code="invalid_api_key"
            )
        return found

    def start(self) -> str:
        """Serves in a thread of this process; the base URL once it listens."""
        if self.host not in LOOPBACK:
            log.warning(
                "agent endpoint: listening on %s, not loopback: any host that can reach it "
                "may try keys",
                self.host,
            )
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            # None: uvicorn's default dictConfig would disable every logger already made
            # and replace the host's handlers; only uvicorn's own loggers' levels are set.
            log_config=None,
            log_level="warning",
            lifespan="off",
            access_log=False,
            # Longer than an episode's client keeps its idle connection (httpx: 5 s), so a
            # client never sends on a connection the server has just closed.
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="agent-endpoint", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"agent endpoint: could not listen on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self.url

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _body(request: Request, limits: EndpointLimits) -> dict[str, Any]:
    """The request's JSON object, refused (413) as soon as it is over the size limit."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limits.max_body_bytes:
        raise too_large(limits)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise too_large(limits)
        chunks.append(chunk)
    return parse_body(b"".join(chunks), limits)


async def _turn(endpoint: AgentEndpoint, session: AgentSession, run, request, http) -> Turn:
    """The turn ``run`` makes of ``request``, sampled in a thread of its own.

    ``http`` is the HTTP request: once the reply is sampled, the turn asks whether its
    client is still connected, under the episode's lock, before recording the reply; a
    client that gave up (a timeout, a disconnect) gets nothing recorded, so its retry,
    which waits for that lock, continues from what it did receive.
    """
    seed = request.seed
    if seed is None:
        seed = zlib.crc32(f"{session.name}/{session.transcript.requests}".encode())
    seed %= 2**32  # the API's seeds are 64-bit; a sampler's PRNG takes 32

    deadline = DEADLINE.get()  # an in-process client's read timeout (in_process.py)

    def gone() -> bool:
        return past_deadline(deadline) or bool(anyio.from_thread.run(http.is_disconnected))

    try:
        if INLINE.get():  # in-process, on the agent's own thread: no hop, no socket to lose
            return run(endpoint.backend, session, request, seed, lambda: past_deadline(deadline))
        # A turn waits in the batcher for the others: every open episode gets a thread
        # (anyio's default 40 would cap a batch at 40 requests).
        limiter = endpoint.limiter()
        limiter.total_tokens = max(40, len(endpoint.sessions))
        return await anyio.to_thread.run_sync(
            run, endpoint.backend, session, request, seed, gone, limiter=limiter
        )
    except (ApiError, ClientGone):
        raise
    except Exception as err:  # the sampler's failure is this request's, not the server's
        raise ApiError(
            500, f"sampling failed: {type(err).__name__}: {err}", kind="server_error"
        ) from err


def _events(chunks: list[dict[str, Any]]):
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def _build_app(endpoint: AgentEndpoint) -> FastAPI:
    app = FastAPI(title="rlax agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def refused(request: Request, err: ApiError) -> JSONResponse:
        if request.url.path == "/v1/messages":
            return JSONResponse(anthropic_error(err), status_code=err.status)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(ClientGone)
    async def gone(request: Request, err: ClientGone) -> Response:
        endpoint.gone += 1
        return Response(status_code=CLIENT_GONE)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {err.detail}"
        return JSONResponse(ApiError(err.status_code, message).body(), status_code=err.status_code)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        endpoint.session(request)
        model = {"id": endpoint.model, "object": "model", "created": 0, "owned_by": "rlax"}
        return {"object": "list", "data": [model]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        session = endpoint.session(request)
        body = await _body(request, endpoint.limits)
        req = chat_request(body, policy=endpoint.policy(), limits=endpoint.limits)
        turn = await _turn(endpoint, session, chat_turn, req, request)
        ident = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            chunks = chat_chunks(
                ident, endpoint.model, turn, logprobs=req.logprobs, usage=req.include_usage
            )
            return StreamingResponse(_events(chunks), media_type="text/event-stream")
        return chat_body(ident, endpoint.model, turn, logprobs=req.logprobs)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        session = endpoint.session(request)
        body = await _body(request, endpoint.limits)
        req = text_request(body, policy=endpoint.policy(), limits=endpoint.limits)
        turn = await _turn(endpoint, session, text_turn, req, request)
        ident = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:
            chunks = text_chunks(
                ident, endpoint.model, turn, logprobs=req.logprobs, usage=req.include_usage
            )
            return StreamingResponse(_events(chunks), media_type="text/event-stream")
        return text_body(ident, endpoint.model, turn, logprobs=req.logprobs)

    _format_routes(app, endpoint)
    return app


def _format_routes(app: FastAPI, endpoint: AgentEndpoint) -> None:
    """The Responses and Messages APIs: each request read as its chat request (:mod:`.formats`)."""

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        session = endpoint.session(request)
        body = await _body(request, endpoint.limits)
        req = responses_request(body, policy=endpoint.policy(), limits=endpoint.limits)
        turn = await _turn(endpoint, session, chat_turn, req, request)
        ident = f"resp_{uuid.uuid4().hex}"
        if req.stream:
            events = response_events(ident, endpoint.model, turn, body)
            return StreamingResponse(events, media_type="text/event-stream")
        return response_body(ident, endpoint.model, turn, body)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        session = endpoint.session(request)
        body = await _body(request, endpoint.limits)
        req = messages_request(body, policy=endpoint.policy(), limits=endpoint.limits)
        turn = await _turn(endpoint, session, chat_turn, req, request)
        ident = f"msg_{uuid.uuid4().hex}"
        if req.stream:
            events = message_events(ident, endpoint.model, turn)
            return StreamingResponse(events, media_type="text/event-stream")
        return message_body(ident, endpoint.model, turn)
