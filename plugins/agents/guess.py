"""``agents.guess``: the agent quickstart, higher/lower written as plain ``openai`` client code.

The multi-turn quickstart's game (:mod:`rlax.plugins.environments.guess`)
played by an agent instead of an environment: it asks the model for a
guess, reads the number in the reply, answers with the same hint the
environment sends (``>``: the secret is higher, ``<``: lower) as the next
user message, and returns the reward itself: 1 for finding the secret
within ``max_guesses``, 0 otherwise (a reply that is not a number, or one
the token budget cut, ends the game with 0, as in the environment).

With the quickstart's chat template (configs/experiments/agents_quickstart.gin)
the endpoint records exactly the ids the ``guess`` environment makes for the
same game, so the policy learns the same thing either way.

The same game written against the two other APIs harnesses speak:
``agents.guess_responses`` (the ``openai`` client's Responses API, as
Codex-style harnesses) and ``agents.guess_messages`` (the ``anthropic``
client's Messages API, as claude-code-style ones). Each sends the same
conversation, so the endpoint records the same ids as for ``agents.guess``.
"""

from __future__ import annotations

from typing import Annotated, Any

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast
from rlax.core.rollout.agents.episodes import speaks
from rlax.plugins.environments.guess import parse_guess

__all__ = ["guess", "guess_messages", "guess_responses"]


def guess(client: Any, prompt: Any, *, max_guesses: Annotated[int, AtLeast(1)] = 5) -> float:
    """Plays one game against ``prompt.answer`` (the secret); the reward, 1 or 0."""
    secret = int(prompt.answer)
    messages = [{"role": "user", "content": prompt.text}]
    for _ in range(max_guesses):
        reply = client.chat.completions.create(model="rlax-policy", messages=messages)
        choice = reply.choices[0]
        number = parse_guess(choice.message.content or "")
        if choice.finish_reason != "stop" or number is None:
            return 0.0  # cut by the token budget, or not a number
        if number == secret:
            return 1.0
        hint = ">" if secret > number else "<"
        messages += [
            {"role": "assistant", "content": choice.message.content},
            {"role": "user", "content": hint},
        ]
    return 0.0


def _hint(text: str, done: bool, secret: int) -> float | str:
    """The game's answer to a reply: a reward (1 found, 0 lost) or the next hint."""
    number = parse_guess(text)
    if not done or number is None:
        return 0.0  # cut by the token budget, or not a number
    if number == secret:
        return 1.0
    return ">" if secret > number else "<"


def guess_responses(
    client: Any, prompt: Any, *, max_guesses: Annotated[int, AtLeast(1)] = 5
) -> float:
    """:func:`guess` through the Responses API (``client.responses``)."""
    secret = int(prompt.answer)
    items: list[dict[str, Any]] = [{"role": "user", "content": prompt.text}]
    for _ in range(max_guesses):
        reply = client.responses.create(model="rlax-policy", input=items, store=False)
        text = reply.output_text
        hint = _hint(text, reply.status == "completed", secret)
        if not isinstance(hint, str):
            return hint
        items += [{"role": "assistant", "content": text}, {"role": "user", "content": hint}]
    return 0.0


@speaks("anthropic")
def guess_messages(
    client: Any,
    prompt: Any,
    *,
    max_guesses: Annotated[int, AtLeast(1)] = 5,
    max_tokens: Annotated[int, AtLeast(1)] = 64,
) -> float:
    """:func:`guess` through the Messages API (an ``anthropic`` client's ``messages``)."""
    secret = int(prompt.answer)
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt.text}]
    for _ in range(max_guesses):
        reply = client.messages.create(
            model="rlax-policy", max_tokens=max_tokens, messages=messages
        )
        text = "".join(b.text for b in reply.content if b.type == "text")
        hint = _hint(text, reply.stop_reason == "end_turn", secret)
        if not isinstance(hint, str):
            return hint
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": hint}]
    return 0.0


@hookimpl
def rlax_register_agents():
    return {"guess": guess, "guess_responses": guess_responses, "guess_messages": guess_messages}
