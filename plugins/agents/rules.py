"""What an agent run can be told to be wrong before it starts (:meth:`AgentSampler.check_run`).

Agent code is opaque to rlax, so two things that would make every episode fail -- and a
run of reward-0 episodes end "successfully" -- are checked on what can be seen:

- the model the agent asks for: every ``model="..."`` string the agent's source passes
  to a call (its ``client.chat.completions.create(model=...)``) must be the name the
  endpoint serves; an agent whose source cannot be read, or that passes a variable, is
  not judged;
- the chat template: the endpoint renders every request with the policy's tokenizer
  (and ``chat_template`` if set), so a sample conversation -- a system message, a user
  message, an assistant reply and the generation prompt -- must render.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from rlax.core.errors import ConfigError

__all__ = ["SAMPLE_CHAT", "check_chat_template", "check_served_model", "models_asked_for"]

SELECTOR = "samplers.agents"

SAMPLE_CHAT = (
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And 4 + 4?"},
)


def models_asked_for(agent: Any) -> list[tuple[str, int]]:
    """``(name, line)`` of every ``model="..."`` string the agent's source passes to a call."""
    target = inspect.unwrap(agent if inspect.isroutine(agent) else type(agent))
    try:
        lines, first = inspect.getsourcelines(target)
    except (OSError, TypeError):
        return []
    tree = ast.parse(textwrap.dedent("".join(lines)))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg != "model" or not isinstance(value, ast.Constant):
                continue
            if isinstance(value.value, str):
                found.append((value.value, first + node.lineno - 1))
    return found


def check_served_model(agent: Any, served: str) -> None:
    """ConfigError if the agent asks only for models the endpoint does not serve."""
    asked = models_asked_for(agent)
    if asked and all(name != served for name, _ in asked):
        name, line = asked[0]
        where = inspect.getsourcefile(inspect.unwrap(agent)) or "its source"
        raise ConfigError(
            f"{SELECTOR}.model: the endpoint serves {served!r} but the agent asks for "
            f"{name!r} ({where}:{line}); every request would be refused: set "
            f"{SELECTOR}.model = {name!r}"
        )


def check_chat_template(tokenizer: Any, setting: str) -> None:
    """ConfigError if ``tokenizer`` cannot render :data:`SAMPLE_CHAT` (for ``setting``)."""
    try:
        text = tokenizer.apply_chat_template(list(SAMPLE_CHAT))
    except Exception as err:  # any failure of the template is the setting's
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(
            f"{setting}: cannot render a conversation with the policy's tokenizer: {first}"
        ) from err
    if "And 4 + 4?" not in text:
        raise ConfigError(
            f"{setting}: the chat template drops the messages' content (a sample conversation "
            "rendered without its last user message)"
        )
