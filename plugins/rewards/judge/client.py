"""How ``rewards.judge`` asks its grader: one chat request, bounded, retried with backoff.

The ``openai`` client (the ``agents`` extra) talks to any OpenAI-compatible
server: rlax's own endpoint, a local server, a hosted API. Its own retries
are off; this module retries what is worth retrying -- connection errors,
request timeouts, 5xx and 429 -- with exponential backoff (``backoff_s``,
doubled each time, or longer if a ``Retry-After`` header asks), and never a 4xx, which the same request would get
again. Every attempt's timeout is the smaller of ``request_timeout_s`` and
what is left of the call's deadline; a call that runs out of deadline is a
:class:`~rlax.plugins.rewards.judge.verdict.JudgeTimeout`. At most
``max_concurrent`` requests of one process are in flight at once.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from typing import Any

from rlax.plugins.rewards.judge.verdict import JudgeError, JudgeTimeout

__all__ = ["GraderClient", "GraderSettings"]


@dataclasses.dataclass(frozen=True)
class GraderSettings:
    """Where the grader is and how long it may take (see ``JudgeReward`` for each)."""

    base_url: str
    model: str
    api_key: str
    request_timeout_s: float
    deadline_s: float
    retries: int
    backoff_s: float
    max_concurrent: int
    temperature: float | None
    max_tokens: int | None


class GraderClient:
    """Asks the grader one prompt at a time; counts into ``counts`` (a shared Counter).

    Picklable: the ``openai`` client and the semaphore are made again where it lands.
    """

    def __init__(self, settings: GraderSettings, counts: Counter[str]) -> None:
        self.settings = settings
        self.counts = counts
        self._client: Any = None
        self._slots = threading.BoundedSemaphore(settings.max_concurrent)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "counts": self.counts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"], state["counts"])  # type: ignore[misc]

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import openai

                s = self.settings
                self._client = openai.OpenAI(
                    base_url=s.base_url, api_key=s.api_key or "none", max_retries=0
                )
            return self._client

    def ask(self, messages: list[dict[str, str]]) -> str:
        """The grader's answer text to ``messages``.

        Raises:
          JudgeTimeout: no answer within ``deadline_s`` (waiting for a slot included).
          JudgeError: ``"refused"`` (4xx), ``"transport"`` (past the retries),
            ``"verdict"`` (an answer with no text).
        """
        s = self.settings
        deadline = time.monotonic() + s.deadline_s
        if not self._slots.acquire(timeout=s.deadline_s):
            raise JudgeTimeout(f"no free request slot in {s.deadline_s:g}s")
        try:
            return self._attempts(messages, deadline)
        finally:
            self._slots.release()

    def _attempts(self, messages: list[dict[str, str]], deadline: float) -> str:
        import openai

        s = self.settings
        last, timed_out, asked = "", False, 0.0
        for attempt in range(s.retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise JudgeTimeout(f"no judgement in {s.deadline_s:g}s (last: {last})")
            if attempt:
                self.counts["retries"] += 1
            self.counts["requests"] += 1
            try:
                return self._request(messages, min(s.request_timeout_s, left))
            except openai.APIStatusError as err:
                if err.status_code != 429 and err.status_code < 500:
                    raise JudgeError("refused", f"the grader refused: {_said(err)}") from None
                last, timed_out, asked = _said(err), False, _retry_after(err)
            except openai.APIConnectionError as err:  # APITimeoutError is one
                last = f"{type(err).__name__}: {err}"
                timed_out, asked = isinstance(err, openai.APITimeoutError), 0.0
            if attempt == s.retries:
                break
            pause = max(s.backoff_s * 2**attempt, asked)  # a 429's Retry-After, if longer
            if time.monotonic() + pause >= deadline:  # the retry could not finish in time
                raise JudgeTimeout(f"no judgement in {s.deadline_s:g}s (last: {last})")
            time.sleep(pause)
        if timed_out:
            raise JudgeTimeout(f"no judgement in {s.deadline_s:g}s (last: {last})")
        raise JudgeError("transport", f"the grader failed {s.retries + 1} times; last: {last}")

    def _request(self, messages: list[dict[str, str]], timeout_s: float) -> str:
        s = self.settings
        extra: dict[str, Any] = {}
        if s.temperature is not None:
            extra["temperature"] = s.temperature
        if s.max_tokens is not None:
            extra["max_tokens"] = s.max_tokens
        reply = self.client().chat.completions.create(
            model=s.model, messages=messages, timeout=timeout_s, **extra
        )
        content = reply.choices[0].message.content if reply.choices else None
        if not content:
            raise JudgeError("verdict", "the grader's answer has no text")
        return str(content)


def _retry_after(err: Any) -> float:
    """The seconds a response's ``Retry-After`` header asks for (0: none, or an HTTP date)."""
    try:
        return max(0.0, float(err.response.headers.get("retry-after", "")))
    except (AttributeError, TypeError, ValueError):
        return 0.0


def _said(err: Any) -> str:
    """A status error in one line: the status and the server's message."""
    return f"HTTP {err.status_code}: {str(getattr(err, 'message', err))[:200]}"
