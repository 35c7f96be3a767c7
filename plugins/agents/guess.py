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
"""

from __future__ import annotations

from typing import Annotated, Any

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast
from rlax.plugins.environments.guess import parse_guess

__all__ = ["guess"]


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


@hookimpl
def rlax_register_agents():
    return {"guess": guess}
