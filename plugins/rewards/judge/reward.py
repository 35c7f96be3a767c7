"""The ``judge`` reward: a model grades the completion against a rubric (LLM as a judge).

.. math::

   R(y) = \\frac{s - lo}{hi - lo} \\in [0, 1]

where ``s`` is the number on the grader's final ``SCORE: <number>`` line,
``lo <= s <= hi`` (:mod:`.verdict` states the format). The grader is
any OpenAI-compatible chat endpoint (rlax's own
:class:`~rlax.core.rollout.agents.endpoint.AgentEndpoint`, a local server, a
hosted API), asked with the ``openai`` client (the ``agents`` extra); its
API key is read from the environment variable ``api_key_env`` names, never
from the configuration. Each call has a deadline, transport failures are
retried with backoff (:mod:`.client`), and a judgement is asked once
(:mod:`.cache`). A judgement that does not happen -- an answer out of
format or range, a timeout, a refusal -- raises
:class:`~rlax.plugins.rewards.judge.verdict.JudgeError`: the reward pool
scores the call 0 *as a failed call* (``reward_errors``; ``reward_timeouts`` for a
:class:`~rlax.plugins.rewards.judge.verdict.JudgeTimeout`; the reason in the traces),
never as a judged 0; :meth:`JudgeReward.metrics` counts each kind.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import re
from typing import Annotated, Any

from rlax.core import hookimpl
from rlax.core.constraints import (
    AtLeast,
    NonNegative,
    Positive,
    check_arguments,
    check_rules,
    checked_by,
)
from rlax.core.errors import BadSetting
from rlax.core.types import Prompt, RewardResult
from rlax.plugins.rewards.judge.cache import JudgeCache, judgement_key
from rlax.plugins.rewards.judge.client import GraderClient, GraderSettings
from rlax.plugins.rewards.judge.verdict import (
    DEFAULT_RUBRIC,
    JudgeError,
    normalised,
    parse_score,
    render,
    rubric_problem,
)

__all__ = ["JudgeReward"]

_COUNTED = (
    *("requests", "retries", "cache_hits", "judged", "errors"),
    *("verdict_errors", "timeout_errors", "refused_errors", "transport_errors"),
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _settings(
    *,
    base_url: Any = "",
    model: Any = "",
    api_key_env: Any = "OPENAI_API_KEY",
    rubric: Any = DEFAULT_RUBRIC,
    lo: Any = 0.0,
    hi: Any = 10.0,
    **_: object,
) -> None:
    """BadSetting for a grader that cannot be asked or a rubric that cannot be filled in."""
    if isinstance(base_url, str) and not re.match(r"https?://[^/\s]+", base_url):
        raise BadSetting("base_url", f"an http:// or https:// URL, got {base_url!r}")
    if isinstance(model, str) and not model.strip():
        raise BadSetting("model", "the grader's model name is required (got '')")
    if isinstance(api_key_env, str) and api_key_env:
        if not _ENV_NAME.fullmatch(api_key_env):
            raise BadSetting(
                "api_key_env", f"the name of an environment variable, got {api_key_env!r}"
            )
        if not os.environ.get(api_key_env):
            raise BadSetting(
                "api_key_env",
                f"the environment variable {api_key_env} (the grader's API key) is not set; "
                "set it, or api_key_env='' for a server without keys",
            )
    if isinstance(rubric, str) and (why := rubric_problem(rubric)):
        raise BadSetting("rubric", why)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi))
    if numbers and not lo < hi:
        raise BadSetting("hi", f"must be > lo ({lo!r}), got {hi!r}")


@checked_by(_settings)
class JudgeReward:
    """A grader model's score of the completion, normalised to [0, 1] (module docstring).

    Args:
      base_url: the grader's OpenAI-compatible base URL (``http://127.0.0.1:8000/v1``).
      model: the grader's model name.
      api_key_env: the environment variable that holds the API key; "" sends none
        (a local server without keys). Read at construction: unset is refused.
      rubric: the user message, a template with ``{prompt}``, ``{completion}``,
        ``{answer}``, ``{lo}``, ``{hi}`` (:mod:`.verdict`; braces doubled).
      system: a system message before it ("" for none).
      lo / hi: the range the grader scores in; ``lo`` maps to 0 and ``hi`` to 1.
      request_timeout_s: the limit of one HTTP request.
      deadline_s: the limit of one ``score`` call, retries and backoff included;
        keep it under the worker's ``reward_timeout_s`` so the judge says why.
      retries: further attempts after a connection error, request timeout, 5xx or 429.
      backoff_s: the pause before the first retry, doubled before each next one.
      max_concurrent: requests in flight at once from one process.
      temperature: sent with each request (None: the server's default).
      max_tokens: the longest answer asked for (None: the server's default).
      cache_file: a JSON-lines file that keeps judgements across processes and
        restarts, e.g. in the run directory ("" : in memory only).
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        rubric: str = DEFAULT_RUBRIC,
        system: str = "",
        lo: float = 0.0,
        hi: float = 10.0,
        request_timeout_s: Annotated[float, Positive] = 4.0,
        deadline_s: Annotated[float, Positive] = 8.0,
        retries: Annotated[int, AtLeast(0)] = 2,
        backoff_s: Annotated[float, NonNegative] = 0.5,
        max_concurrent: Annotated[int, AtLeast(1)] = 4,
        temperature: Annotated[float, NonNegative] | None = 0.0,
        max_tokens: Annotated[int, AtLeast(1)] | None = None,
        cache_file: str = "",
    ) -> None:
        arguments = dict(locals())
        del arguments["self"]
        check_arguments(JudgeReward.__init__, arguments, owner="rewards.judge")
        check_rules(JudgeReward, "rewards.judge", **arguments)
        if importlib.util.find_spec("openai") is None:
            raise BadSetting(
                "base_url", "rewards.judge needs the openai client: pip install 'rlax-llm[agents]'"
            )
        self.model, self.rubric, self.system = model, rubric, system
        self.lo, self.hi = float(lo), float(hi)
        self.counts: collections.Counter[str] = collections.Counter()
        self.cache = JudgeCache(cache_file)
        key = os.environ[api_key_env] if api_key_env else ""
        grader = GraderSettings(
            base_url=base_url.rstrip("/"),
            model=model,
            api_key=key,
            request_timeout_s=request_timeout_s,
            deadline_s=deadline_s,
            retries=retries,
            backoff_s=backoff_s,
            max_concurrent=max_concurrent,
            temperature=temperature,
            max_tokens=max_tokens,
        )
        self.grader = GraderClient(grader, self.counts)

    def __repr__(self) -> str:  # never the key
        return f"JudgeReward(base_url={self.grader.settings.base_url!r}, model={self.model!r})"

    def messages(self, prompt: Prompt, completion_text: str) -> list[dict[str, str]]:
        """The chat the grader is asked: the system text (if any), then the rubric filled in."""
        user = render(
            self.rubric,
            prompt=prompt.text,
            completion=completion_text,
            answer=prompt.answer,
            lo=self.lo,
            hi=self.hi,
        )
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": user}]

    def score(self, prompt: Prompt, completion_text: str) -> RewardResult:
        """The grader's score in [0, 1], asked once per judgement.

        Raises:
          JudgeError: no judgement (its ``kind`` says why); counted, never a 0.
        """
        rubric = f"{self.system}\n\n{self.rubric}"
        key = judgement_key(self.model, rubric, prompt.text, completion_text, prompt.answer)
        try:
            answer = self.cache.get(key)
            if answer is None:
                answer = self.grader.ask(self.messages(prompt, completion_text))
                self.cache.put(key, answer)
            else:
                self.counts["cache_hits"] += 1
            value = parse_score(answer, self.lo, self.hi)
        except JudgeError as err:
            self.counts["errors"] += 1
            self.counts[f"{err.kind}_errors"] += 1
            raise
        self.counts["judged"] += 1
        reason = f"judge: {value:g} in [{self.lo:g}, {self.hi:g}]"
        return RewardResult(normalised(value, self.lo, self.hi), reason)

    def metrics(self) -> dict[str, float]:
        """This process's counts: ``judge/requests``, ``judge/retries``, ``judge/cache_hits``,
        ``judge/judged``, ``judge/errors`` and per kind ``judge/verdict_errors``,
        ``judge/timeout_errors``, ``judge/refused_errors``, ``judge/transport_errors``."""
        return {f"judge/{k}": float(self.counts[k]) for k in _COUNTED}


@hookimpl
def rlax_register_rewards():
    return {"judge": JudgeReward}
