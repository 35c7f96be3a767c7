"""One agent episode's turns: a request's ids, the sampler's reply, both recorded, token exact.

:class:`AgentSession` is what the endpoint keeps per episode (per API key):
its :class:`~rlax.core.rollout.agents.transcript.Transcript`, the replies it gave
(:class:`~rlax.core.rollout.agents.chat_ids.ReplyBook`) and, for the completions
API, the text and ids its prompts so far stood for. :func:`chat_turn` and
:func:`text_turn` turn a validated request into prompt ids, sample one reply
through the :class:`~rlax.core.contracts.Sampler` contract, record both and
return the :class:`Turn` the endpoint answers with. No HTTP here.

Tools: the request's tool list is shown to the model as a system message
(:func:`tools_text`, always rendered the same, so later requests still extend
the recorded ids); the model's text is read by the endpoint's
:class:`~rlax.core.contracts.ToolParser` and calls come back as the API's
``tool_calls`` (content None). A malformed call is text: the model's answer.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from rlax.core.contracts import Sampler, ToolParser
from rlax.core.rollout.agents.batch import Batcher
from rlax.core.rollout.agents.chat_ids import Reply, ReplyBook, conversation_ids, reply_key
from rlax.core.rollout.agents.reply_text import cut_at_stop, token_pieces
from rlax.core.rollout.agents.requests import ApiError, ChatRequest, TextRequest
from rlax.core.rollout.agents.transcript import Transcript
from rlax.core.types import Completion, Prompt

__all__ = [
    "AgentSession",
    "ClientGone",
    "Turn",
    "chat_turn",
    "text_turn",
    "tools_text",
    "with_tools",
]


@dataclasses.dataclass
class AgentSession:
    """What the endpoint keeps for one episode (one API key)."""

    name: str
    transcript: Transcript = dataclasses.field(init=False)
    book: ReplyBook = dataclasses.field(default_factory=ReplyBook)
    text: str = ""  # completions API: the text the ids below stand for
    text_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    max_turns: int = 0  # replies the episode may get (0: no limit)
    max_tokens: int = 0  # ids after its segment's prompt (0: no limit)
    stopped: str = ""  # why a limit refused a request
    closed: bool = False  # the episode ended: nothing more is recorded
    # A resumed episode's recorded turns (Transcript.turns of its first attempt): a request
    # with the next one's ids is answered with its reply, not sampled.
    replay: list[tuple[np.ndarray, Completion]] = dataclasses.field(default_factory=list)
    replayed: int = 0

    def __post_init__(self) -> None:
        self.transcript = Transcript(self.name)


@dataclasses.dataclass(frozen=True)
class Turn:
    """A reply as the endpoint answers it.

    Attributes:
      text: the model's text the client gets (stop token and stop string excluded).
      content: the message's content (None when it calls tools).
      tool_calls: the API's ``tool_calls`` (empty: none).
      finish_reason: "stop", "length" or "tool_calls".
      ids / logprobs: the sampled ids and the sampler's logprobs, as recorded.
      tokens: each id's (text, bytes), for the API's logprobs (empty: not asked for).
      prompt_tokens: the request's prompt length in ids.
      stop: the stop string that ended the reply (None: none did).
    """

    text: str
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    ids: np.ndarray
    logprobs: np.ndarray
    tokens: list[tuple[str, list[int]]]
    prompt_tokens: int
    stop: str | None = None


class ClientGone(Exception):
    """The client went away before its reply was sent: the reply is not recorded."""


@dataclasses.dataclass(frozen=True)
class Backend:
    """What a turn samples with: the sampler, its tokenizer, the batcher every episode shares."""

    sampler: Sampler
    tokenizer: Any
    tool_parser: ToolParser | None
    batcher: Batcher


def tools_text(tools: list[dict[str, Any]]) -> str:
    """The system text that shows ``tools`` to the model (JSON, keys sorted: stable)."""
    lines = [json.dumps(t["function"], sort_keys=True) for t in tools]
    return (
        "You may call these tools. To call one, write\n"
        '<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>\n'
        "<tools>\n" + "\n".join(lines) + "\n</tools>"
    )


def with_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as the model sees them with ``tools`` offered: :func:`tools_text` after
    the first system (or developer) message's content, or as a system message before all.
    An environment that plays an agent's game in process opens its episodes the same way
    (``environments.calculator``)."""
    if not tools:
        return messages
    text = tools_text(tools)
    first = messages[0]
    if first["role"] in ("system", "developer"):
        return [{**first, "content": f"{first['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _with_tools(request: ChatRequest) -> list[dict[str, Any]]:
    if request.tool_choice == "none":
        return request.messages
    return with_tools(request.messages, request.tools or [])


def _fits(backend: Backend, ids: np.ndarray, param: str) -> np.ndarray:
    """``ids``, or 400 before anything is recorded: longer than the sampler takes."""
    limit = getattr(backend.sampler, "max_prompt_tokens", None)
    if isinstance(limit, int) and len(ids) > limit:
        raise ApiError(
            400,
            f"the prompt is {len(ids)} tokens; this model takes at most {limit}",
            param=param,
            code="context_length_exceeded",
        )
    return ids


def _check_open(session: AgentSession) -> None:
    if session.closed:
        raise ApiError(401, "this episode has ended: its key is closed", code="invalid_api_key")


def _room(session: AgentSession, max_tokens: int) -> int:
    """``max_tokens`` within the episode's limits; 400 (and ``stopped`` set) when they are used up."""
    reason = ""
    if session.max_turns and session.transcript.requests >= session.max_turns:
        reason = f"the episode used its {session.max_turns} turns"
    elif session.max_tokens:
        segment = session.transcript.segments[-1]
        room = session.max_tokens - (len(segment.ids) - len(segment.prompt))
        if room > 0:
            return min(max_tokens, room)
        reason = f"the episode used its {session.max_tokens} tokens"
    if not reason:
        return max_tokens
    session.stopped = session.stopped or reason
    raise ApiError(400, reason, code="episode_limit_reached")


def _replayed(session: AgentSession, ids: np.ndarray, max_tokens: int) -> Completion | None:
    """The recorded reply to these ids when the episode is replayed and they match; else
    None, and the rest of the replay is dropped (the agent asked something else)."""
    if not session.replay:
        return None
    before, recorded = session.replay[0]
    if np.array_equal(before, ids) and len(recorded.tokens) <= max_tokens:
        session.replay.pop(0)
        session.replayed += 1
        return recorded
    session.replay.clear()
    return None


def _sample(backend: Backend, session: AgentSession, ids, max_tokens, seed) -> Completion:
    max_tokens = _room(session, max_tokens)
    recorded = _replayed(session, np.asarray(ids, np.int32), max_tokens)
    if recorded is not None:
        return recorded
    prompt = Prompt(id=session.name, text="", tokens=np.asarray(ids, np.int32), answer=None)
    c = backend.batcher.sample(prompt, seed)
    if len(c.tokens) <= max_tokens:
        return c
    ids = c.tokens[:max_tokens]
    versions = None if c.versions is None else c.versions[:max_tokens]
    text = backend.tokenizer.decode(ids)
    return dataclasses.replace(
        c,
        tokens=ids,
        logprobs=c.logprobs[:max_tokens],
        text=text,
        finish_reason="length",
        versions=versions,
        kept_floor=None if c.kept_floor is None else c.kept_floor[:max_tokens],
    )


def _calls(backend: Backend, request: ChatRequest, text: str, turn: int) -> list[dict[str, Any]]:
    if backend.tool_parser is None or not request.tools or request.tool_choice == "none":
        return []
    try:
        found = backend.tool_parser.parse(text)
    except ValueError:
        return []  # a malformed call is the model's answer, as text
    return [
        {
            "id": f"call_{turn}_{k}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for k, call in enumerate(found)
    ]


def _never_gone() -> bool:
    return False


def chat_turn(
    backend: Backend,
    session: AgentSession,
    request: ChatRequest,
    seed: int,
    gone: Callable[[], bool] = _never_gone,
) -> Turn:
    """One chat request: ids rendered (sampled ids put back), one reply sampled, both
    recorded -- the reply only when the client is still there to get it (``gone``)."""
    if not getattr(backend.tokenizer, "chat_template", None):
        raise ApiError(400, "this model has no chat template: use /v1/completions")
    with session.lock:
        _check_open(session)
        try:
            ids = conversation_ids(backend.tokenizer, _with_tools(request), session.book)
        except ValueError as err:
            raise ApiError(400, f"the chat template cannot render the messages: {err}") from None
        ids = session.transcript.request(_fits(backend, ids, "messages"))
        c = _sample(backend, session, ids, request.max_tokens, seed)
        c, text, stop = cut_at_stop(backend.tokenizer, c, request.stop)
        if gone():  # nobody gets this reply: the agent's retry continues without it
            raise ClientGone(session.name)
        calls = _calls(backend, request, text, session.transcript.requests)
        content = None if calls else text
        session.transcript.reply(c)
        parsed = [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in calls]
        stopped = c.finish_reason == "stop" and stop is None  # the ids end with the stop id
        session.book.add(reply_key(content, parsed), Reply(c.text, c.tokens, stopped))
    finish = "tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason
    return Turn(
        text=text,
        content=content,
        tool_calls=calls,
        finish_reason=finish,
        ids=c.tokens,
        logprobs=c.logprobs,
        tokens=token_pieces(backend.tokenizer, c.tokens) if request.logprobs else [],
        prompt_tokens=len(ids),
        stop=stop,
    )


def text_turn(
    backend: Backend,
    session: AgentSession,
    request: TextRequest,
    seed: int,
    gone: Callable[[], bool] = _never_gone,
) -> Turn:
    """One completions request: a prompt that starts with the text so far reuses its ids.

    With a stop string, the recorded ids stand for the reply through the stop string:
    a next prompt that continues the text the client got (without it) is a rewrite.
    """
    tok = backend.tokenizer
    with session.lock:
        _check_open(session)
        if session.text and request.prompt.startswith(session.text):
            rest = request.prompt[len(session.text) :]
            ids = np.concatenate([session.text_ids, tok.encode(rest) if rest else []])
        else:
            ids = np.asarray(tok.encode(request.prompt), np.int32)
        ids = session.transcript.request(_fits(backend, ids.astype(np.int32), "prompt"))
        c = _sample(backend, session, ids, request.max_tokens, seed)
        c, text, stop = cut_at_stop(tok, c, request.stop)
        if gone():
            raise ClientGone(session.name)
        session.transcript.reply(c)
        # The stop id stays where it was sampled: the next prompt's ids follow it.
        session.text, session.text_ids = request.prompt + c.text, np.r_[ids, c.tokens]
    return Turn(
        text=text,
        content=text,
        tool_calls=[],
        finish_reason=c.finish_reason,
        ids=c.tokens,
        logprobs=c.logprobs,
        tokens=token_pieces(tok, c.tokens) if request.logprobs else [],
        prompt_tokens=len(ids),
        stop=stop,
    )
