"""What an agent is and how its episodes run: many at once, each under a deadline.

An agent (the ``agents`` plugin kind) is a function, or an object with
``__call__``, taking ``(client, prompt)``: an ``openai`` client pointed at
the endpoint with the episode's own key (``openai.OpenAI``; an ``async def``
agent gets ``openai.AsyncOpenAI``) and the task's
:class:`~rlax.core.types.Prompt` (its ``text`` and ``answer``). It returns
a reward (a number), an answer (a string the reward plugin scores) or an
:class:`AgentResult`.

:func:`run_agents` runs many such calls at once: sync agents each in a
thread of their own, async ones as tasks of one event loop (in one thread).
Each call has a deadline; a call that raises or is still running at its
deadline is that episode's failure, with a reason. A sync call cannot be
stopped from outside: it is left running, and ``on_deadline`` (the sampler
closes the episode's key there) makes its next request fail (401), which
ends it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import math
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rlax.core.rollout.agents.in_process import http_package
from rlax.core.types import Prompt

__all__ = [
    "AgentOutcome",
    "AgentResult",
    "Job",
    "client_api",
    "client_factory",
    "is_async",
    "outcome_of",
    "run_agents",
    "speaks",
]


@dataclasses.dataclass(frozen=True)
class AgentResult:
    """What an agent may return besides a bare reward or answer.

    Attributes:
      reward: the episode's reward (None: the reward plugin scores ``answer``).
      answer: the agent's final answer, for the reward plugin and the logs.
      info: counts for the episode report (numbers).
    """

    reward: float | None = None
    answer: str | None = None
    info: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Job:
    """One episode to run: the prompt and a factory of the client it gets (given ``async``)."""

    prompt: Prompt
    client: Callable[[bool], Any]


@dataclasses.dataclass
class AgentOutcome:
    """How one episode's agent call ended: its value, or why it failed."""

    value: Any = None
    failure: str = ""
    seconds: float = 0.0


def is_async(agent: Any) -> bool:
    """Whether the agent is an ``async def`` function or has an ``async def __call__``."""
    call = type(agent).__dict__.get("__call__")  # a class agent's method
    for fn in (agent, inspect.unwrap(agent), call):
        if fn is not None and inspect.iscoroutinefunction(fn):
            return True
    return False


def outcome_of(value: Any) -> AgentResult:
    """An agent's return value as an :class:`AgentResult` (TypeError for anything else;
    ValueError for a reward that is not finite)."""
    if isinstance(value, AgentResult):
        result = value
    elif isinstance(value, str):
        result = AgentResult(answer=value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = AgentResult(reward=float(value))
    else:
        raise TypeError(f"an agent returns a number, a string or an AgentResult, not {value!r}")
    if result.reward is not None and not math.isfinite(result.reward):
        raise ValueError(f"the agent's reward is not finite: {result.reward}")
    return result


def run_agents(
    agent: Any,
    jobs: Sequence[Job],
    *,
    wall_s: float,
    on_deadline: Callable[[int], None],
    on_done: Callable[[int], None] | None = None,
) -> list[AgentOutcome]:
    """Runs ``agent`` once per job, all at once, each for at most ``wall_s`` seconds.

    ``on_deadline(k)`` is called (from this thread) for each job still running
    at its deadline; it is then failed with that reason. ``on_done(k)`` is
    called as soon as job ``k``'s call returns or raises (from its thread).
    """
    outcomes = [AgentOutcome() for _ in jobs]
    done = on_done or (lambda k: None)
    if is_async(agent):
        _run_async(agent, jobs, wall_s, outcomes, on_deadline, done)
    else:
        _run_threads(agent, jobs, wall_s, outcomes, on_deadline, done)
    return outcomes


def _failure(err: BaseException) -> str:
    return f"agent raised {type(err).__name__}: {err}"


def _run_threads(agent, jobs, wall_s, outcomes, on_deadline, on_done) -> None:
    done = [threading.Event() for _ in jobs]

    def one(k: int) -> None:
        start = time.monotonic()
        try:
            value = agent(jobs[k].client(False), jobs[k].prompt)
            if not done[k].is_set():
                outcomes[k].value = value
        except Exception as err:  # noqa: BLE001 -- a broken agent costs its episode
            if not done[k].is_set():
                outcomes[k].failure = _failure(err)
        finally:
            outcomes[k].seconds = time.monotonic() - start
            done[k].set()
            on_done(k)

    threads = [
        threading.Thread(target=one, args=(k,), name=f"agent-{k}", daemon=True)
        for k in range(len(jobs))
    ]
    deadline = time.monotonic() + wall_s
    for t in threads:
        t.start()
    for k, t in enumerate(threads):
        t.join(max(0.0, deadline - time.monotonic()))
        if not done[k].is_set():
            outcomes[k].failure = f"agent still running after its {wall_s:g} s"
            outcomes[k].seconds = wall_s
            done[k].set()  # whatever it returns later is ignored
            on_deadline(k)


def _run_async(agent, jobs, wall_s, outcomes, on_deadline, on_done) -> None:
    async def one(k: int) -> None:
        start = time.monotonic()
        client = jobs[k].client(True)
        try:
            outcomes[k].value = await asyncio.wait_for(agent(client, jobs[k].prompt), wall_s)
        except TimeoutError:
            outcomes[k].failure = f"agent still running after its {wall_s:g} s"
            on_deadline(k)
        except Exception as err:  # noqa: BLE001 -- a broken agent costs its episode
            outcomes[k].failure = _failure(err)
        finally:
            outcomes[k].seconds = time.monotonic() - start
            on_done(k)
            close = getattr(client, "close", None)
            if close is not None:
                await close()

    async def every() -> None:
        await asyncio.gather(*(one(k) for k in range(len(jobs))))

    # In a thread of its own: the caller may be inside an event loop already.
    thread = threading.Thread(target=asyncio.run, args=(every(),), name="agents-async")
    thread.start()
    thread.join()


API_ATTR = "rlax_client_api"
APIS = ("openai", "anthropic")


def speaks(api: str) -> Callable[[Any], Any]:
    """Marks an agent as written against ``api``'s client: "openai" (the default:
    ``openai.OpenAI``, chat, completions and responses) or "anthropic" (``anthropic.Anthropic``,
    the Messages API)."""
    if api not in APIS:
        raise ValueError(f"speaks: api must be one of {list(APIS)}, got {api!r}")

    def mark(agent: Any) -> Any:
        setattr(agent, API_ATTR, api)
        return agent

    return mark


def client_api(agent: Any) -> str:
    """The API an agent's client speaks (:func:`speaks`; "openai" when unmarked)."""
    call = type(agent).__dict__.get("__call__")
    for fn in (agent, inspect.unwrap(agent), call):
        api = getattr(fn, API_ATTR, None)
        if api is not None:
            return api
    return "openai"


def client_factory(
    url: str, key: str, made: dict[str, Any], api: str = "openai", endpoint: Any = None
):
    """A :class:`Job`'s client factory for the episode of ``key`` at ``url``.

    Each client has its own HTTP client (one connection: a pool shared by hundreds
    of threads serialises them on its lock), built without reading the
    environment's proxy settings and with one TLS context for all (one of its own
    costs an episode ~30 ms). A sync client's HTTP client is kept in ``made`` by
    key, for the caller to close once its agent returns. ``api`` "anthropic": an
    ``anthropic`` client of the endpoint's Messages API (its base URL without ``/v1``).
    ``endpoint`` (the :class:`~rlax.core.rollout.agents.endpoint.AgentEndpoint` in this
    process): the client's requests call it in-process, no socket (:mod:`.in_process`).
    """

    def client(use_async: bool):
        if api == "anthropic":
            import anthropic

            return _client(anthropic, anthropic.Anthropic, anthropic.AsyncAnthropic, use_async)
        import openai  # the 'agents' extra

        return _client(openai, openai.OpenAI, openai.AsyncOpenAI, use_async)

    def _client(sdk: Any, sync_kind: Any, async_kind: Any, use_async: bool) -> Any:
        # Each client on its SDK's own HTTP package (httpx, or httpx2 in newer releases).
        http_client = sdk.DefaultAsyncHttpxClient if use_async else sdk.DefaultHttpxClient
        local = None
        if endpoint is not None:
            local = endpoint.transports(http_package(http_client))[1 if use_async else 0]
        http = http_client(verify=_tls(), trust_env=False, transport=local)
        base = url.removesuffix("/v1") if api == "anthropic" else url
        if use_async:  # the episode closes it, and its HTTP client with it
            return async_kind(base_url=base, api_key=key, max_retries=0, http_client=http)
        made[key] = http
        return sync_kind(base_url=base, api_key=key, max_retries=0, http_client=http)

    return client


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()
