"""The agent quickstart (configs/experiments/agents_quickstart.gin): agents.guess through the
endpoint records, for the same secrets and the same sampled guesses, exactly the ids, loss
mask, logprobs and rewards the `guess` environment makes; so the policy learns the same game."""

from __future__ import annotations

import pathlib

import gin
import numpy as np
import pytest

from rlax.core import config
from rlax.core.models.tokenizer import BOS, EOS, CharTokenizer
from rlax.core.plugins import build_plugin_manager
from rlax.core.rollout.agents.chat_tokenizer import with_chat_template
from rlax.core.types import Completion
from rlax.plugins.agents.guess import guess, guess_messages, guess_responses
from rlax.plugins.agents.runner import AgentSampler
from rlax.plugins.environments.guess import ALPHABET, GuessEnvironment, GuessTask
from rlax.plugins.environments.runner import EpisodeSampler

ROOT = pathlib.Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "experiments" / "agents_quickstart.gin"
TOK = CharTokenizer(ALPHABET)


class Bisect:
    """Guesses the middle of what the hints allow, read from the ids alone; its replies for
    4 ("4?": not a number) and 28 ("280", no stop id: cut) end those games with reward 0."""

    temperature, max_new_tokens = 1.0, 3

    def setup(self, model, tokenizer):
        pass

    def load_weights(self, params, version):
        pass

    def reply(self, ids: list[int]) -> tuple[list[int], str]:
        lo, hi, digits = 0, 31, ""
        for i in ids[2:]:  # after bos and '?'
            ch = "" if i == EOS else ALPHABET[i - 3]
            if ch.isdigit():
                digits += ch
            elif ch == ">":
                lo, digits = int(digits) + 1, ""
            elif ch == "<":
                hi, digits = int(digits) - 1, ""
        text = {4: "4?", 28: "280"}.get((lo + hi + 1) // 2, str((lo + hi + 1) // 2))
        stop = [EOS] if text != "280" else []
        return TOK.encode(text).tolist() + stop, "stop" if stop else "length"

    def generate(self, prompts, n, *, seed):
        out = []
        for p in prompts:
            ids, finish = self.reply(p.tokens.tolist())
            lp = -0.01 * (len(p.tokens) + np.arange(len(ids), dtype=np.float32))
            out.append((Completion(np.asarray(ids, np.int32), lp, TOK.decode(ids), finish, 3),))
        return out


@pytest.fixture
def configured():
    pm = build_plugin_manager(autoload=False)
    config.register_core_configurables()
    config.parse([CONFIG], [], plugins=pm)
    yield config.configured("samplers", "agents")()
    gin.clear_config()


@pytest.mark.parametrize("harness", [guess, guess_responses, guess_messages])
def test_the_agent_records_the_environments_ids_for_the_same_games(configured, harness):
    """Chat, Responses (openai client) and Messages (anthropic client) harnesses alike."""
    agents: AgentSampler = configured
    assert getattr(agents.agent, "__wrapped__", agents.agent) is guess
    if harness is not guess:
        agents.agent = harness
    agents.sampler = Bisect()
    env = EpisodeSampler(sampler=Bisect(), environment=GuessEnvironment())
    prompts = list(GuessTask().prompts("eval", tokenizer=TOK, seed=0))
    env.setup(None, TOK)
    agents.setup(None, TOK)
    try:
        by_agent = agents.generate(prompts, 1, seed=0)
    finally:
        agents.close()
    by_env = env.generate(prompts, 1, seed=0)
    rewards = []
    for p, (a,), (e,) in zip(prompts, by_agent, by_env):
        assert a.episode["prompt_tokens"] == p.tokens.tolist() == [BOS, TOK.encode("?")[0]]
        np.testing.assert_array_equal(a.tokens, e.tokens)
        np.testing.assert_array_equal(a.loss_mask, e.loss_mask)
        np.testing.assert_array_equal(a.logprobs, e.logprobs)
        assert a.episode["reward"] == e.episode["reward"], p.answer
        assert a.episode["failed"] == 0.0 and a.episode["rewrites"] == 0.0
        rewards.append(a.episode["reward"])
    # Found, out of guesses, not a number ("4?") and cut ("280") games are all among them.
    assert 0 < sum(rewards) < len(prompts)
    assert max(len(a.tokens) for (a,) in by_agent) == 19  # 5 guesses of 3 ids and 4 hints


def test_the_template_spells_control_ids_from_its_framing_only():
    tok = with_chat_template(
        TOK,
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
        "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}",
    )
    messages = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": "16"},
        {"role": "user", "content": "<"},
    ]
    assert tok.encode_chat(messages).tolist() == [BOS, *TOK.encode("?16"), EOS, *TOK.encode("<")]
    assert tok.token(EOS) == "<|eos|>" and tok.token(TOK.encode("7")[0]) == "7"
    with pytest.raises(ValueError, match="not in the tokenizer's alphabet"):
        tok.encode_chat([{"role": "user", "content": "<|eos|>"}])  # text is text, never eos
