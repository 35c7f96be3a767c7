"""``samplers.agents``: agent code runs many episodes at once over the endpoint, each becomes
one Completion with exactly the sampler's ids, and a broken agent costs only its episode."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import threading
import time

import numpy as np
import openai
import pytest
from chatml_case import chatml_tokenizer

from rlax.core.param_server.codec import msgs_to_partial, partial_to_msg
from rlax.core.rollout.agents.episodes import AgentResult
from rlax.core.rollout.groups import episode_prompt
from rlax.core.types import Completion, PartialGroup, Prompt
from rlax.plugins.agents.calculator import calculate, calculator
from rlax.plugins.agents.runner import AgentSampler
from rlax.plugins.environments.tool_calls import HermesToolParser
from rlax.plugins.rewards.arithmetic import ArithmeticReward

TOK = chatml_tokenizer()


class Rules:
    """Calls the calculator on the question, then answers the tool's result; records rows."""

    temperature, max_new_tokens, max_prompt_tokens = 1.0, 128, 4096

    def __init__(self):
        self.rows: list[tuple[list[int], Completion]] = []
        self.calls = 0
        self._lock = threading.Lock()

    def setup(self, model, tokenizer):
        pass

    def load_weights(self, params, version):
        pass

    def reply(self, text: str) -> str:
        tool = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", text)
        if tool:
            return tool[-1]
        (question,) = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", text)[-1:]
        call = json.dumps({"name": "calculate", "arguments": {"expression": question}})
        return f"<tool_call>\n{call}\n</tool_call>"

    def generate(self, prompts, n, *, seed):
        out = []
        for p in prompts:
            text = self.reply(TOK.tokenizer.decode(p.tokens.tolist(), skip_special_tokens=False))
            ids = np.append(TOK.encode(text), TOK.eos_id).astype(np.int32)
            lp = -np.linspace(0.1, 0.5, len(ids)).astype(np.float32)
            c = Completion(ids, lp, text, "stop", 5)
            with self._lock:
                self.rows.append((p.tokens.tolist(), c))
            out.append((c,))
        with self._lock:
            self.calls += 1
        return out


def prompt(k: int, a: int, b: int, name: str = "") -> Prompt:
    text = f"{a}+{b}"
    return Prompt(name or f"q{k}", text, TOK.encode(text), str(a + b))


def sampler(agent, **kw) -> AgentSampler:
    s = AgentSampler(
        sampler=Rules(),
        agent=agent,
        reward=ArithmeticReward(),
        tool_parser=HermesToolParser(),
        **kw,
    )
    s.setup(None, TOK)
    return s


def test_the_calculator_computes_integer_arithmetic_only():
    assert calculate("12*(3+4)") == 84 and calculate("-7//2") == -4
    for bad in ("2**100", "__import__('os')", "1/0", "1//0", "x"):
        with pytest.raises(ValueError):
            calculate(bad)


def test_calculator_episodes_are_the_sampler_s_own_ids_and_score_their_answers():
    s = sampler(calculator, batch_window_s=0.2)
    try:
        prompts = [prompt(0, 2, 3), prompt(1, 10, 7)]
        groups = s.generate(prompts, 3, seed=1)
    finally:
        s.close()
    inner = s.sampler
    assert len(groups) == 2 and all(len(g) == 3 for g in groups)
    assert inner.calls < len(inner.rows)  # concurrent episodes shared generate calls
    for p, group in zip(prompts, groups):
        start = episode_prompt(p, group).tokens
        for c in group:
            e = c.episode
            assert (e["reward"], e["failed"], e["turns"], e["segments"]) == (1.0, 0.0, 2.0, 1.0)
            ids = np.r_[start, c.tokens].tolist()
            # Each sampled part is a row the sampler returned for exactly the ids before it.
            on = np.flatnonzero(c.loss_mask)
            parts = np.split(on, np.flatnonzero(np.diff(on) > 1) + 1)
            for part in parts:
                before, mine = ids[: len(start) + part[0]], c.tokens[part]
                (row, *_) = [r for q, r in inner.rows if q == before]  # same ids: same row
                assert row.tokens.tolist() == mine.tolist()
                assert row.logprobs.tolist() == c.logprobs[part].tolist()
            assert (c.logprobs[c.loss_mask == 0] == 0).all() and c.policy_version == 5
            assert len(c.tokens) <= s.max_new_tokens
        # The group's prompt is the agent's rendered first request, not the task's tokens.
        assert TOK.decode(start).startswith("system\nAnswer with an integer")


def test_a_broken_agent_costs_only_its_episode_with_a_reason():
    def agent(client, p):
        if p.id == "raises":
            raise RuntimeError("boom")
        if p.id == "hangs":
            time.sleep(3.5)
            client.chat.completions.create(
                model="rlax-policy", messages=[{"role": "user", "content": "1"}]
            )
            return 1.0
        if p.id == "greedy":
            messages = [{"role": "user", "content": "1+1"}]
            for _ in range(5):
                r = client.chat.completions.create(model="rlax-policy", messages=messages)
                messages += [r.choices[0].message.model_dump(exclude_none=True)]
                messages += [{"role": "tool", "tool_call_id": "x", "content": "2"}]
            return 1.0
        if p.id == "odd":
            return [1]
        return AgentResult(reward=0.5, info={"steps": 3})

    s = sampler(agent, max_turns=2, wall_s=3.0)
    try:
        ids = ["raises", "hangs", "greedy", "odd", "fine"]
        groups = s.generate([prompt(k, 1, 1, i) for k, i in enumerate(ids)], 1, seed=0)
    finally:
        s.close()
    report = {i: g[0].episode for i, g in zip(ids, groups)}
    assert "RuntimeError: boom" in report["raises"]["reason"]
    assert "after its 3 s" in report["hangs"]["reason"]
    assert "used its 2 turns" in report["greedy"]["reason"] and report["greedy"]["turns"] == 2
    assert "AgentResult" in report["odd"]["reason"]
    for i in ("raises", "hangs", "greedy", "odd"):
        assert (report[i]["reward"], report[i]["failed"]) == (0.0, 1.0)
    assert report["fine"]["reward"] == 0.5 and report["fine"]["steps"] == 3.0
    assert report["fine"]["failed"] == 0.0
    time.sleep(1.0)  # the hung agent's late request comes after its key was closed


def test_a_late_request_after_the_deadline_gets_401():
    seen = []

    def agent(client, p):
        time.sleep(0.6)
        try:
            client.chat.completions.create(
                model="rlax-policy", messages=[{"role": "user", "content": "1"}]
            )
        except openai.AuthenticationError as err:
            seen.append(err.status_code)
        return 1.0

    s = sampler(agent, wall_s=0.2)
    try:
        (group,) = s.generate([prompt(0, 1, 1)], 1, seed=0)
        time.sleep(1.0)
    finally:
        s.close()
    assert group[0].episode["failed"] == 1.0 and seen == [401]


def test_async_agents_run_in_one_loop_and_a_rewrite_is_counted_not_trained():
    async def agent(client, p):
        assert isinstance(client, openai.AsyncOpenAI)
        one = [{"role": "user", "content": p.text}]
        r = await client.chat.completions.create(model="rlax-policy", messages=one)
        # Rewrites its history: a new conversation, a second segment.
        other = [{"role": "user", "content": "9+9"}]
        await client.chat.completions.create(model="rlax-policy", messages=other)
        if p.id == "slow":
            await asyncio.sleep(30)  # cancelled at the deadline
        return r.choices[0].message.content or ""

    s = sampler(agent, wall_s=3.0)
    try:
        (group,) = s.generate([prompt(0, 2, 2)], 2, seed=0)
        (slow,) = s.generate([prompt(0, 2, 2, "slow")], 1, seed=0)
    finally:
        s.close()
    for c in group:
        e = c.episode
        assert (e["segments"], e["rewrites"], e["turns"]) == (2.0, 1.0, 2.0)
        assert e["dropped_tokens"] > 0 and e["failed"] == 0.0
        assert c.loss_mask.sum() == len(s.sampler.rows[0][1].tokens)  # the first segment only
    assert "after its 3 s" in slow[0].episode["reason"] and slow[0].episode["failed"] == 1.0


def test_an_interrupted_episode_is_replayed_from_its_recorded_turns_not_sampled_again():
    gate = threading.Event()  # the agents wait here after their first turn until after the cut

    def paused(client, p):  # the calculator, held between its two turns the first time
        create = client.chat.completions.create

        def held(**request):
            reply = create(**request)
            gate.wait(10)
            return reply

        client.chat.completions.create = held
        return calculator(client, p)

    def cut() -> bool:
        if len(inner.rows) < 2:
            return False
        threading.Timer(1.0, gate.set).start()  # after the keys are closed
        return True

    s = sampler(paused)
    inner = s.sampler
    try:
        p = prompt(0, 6, 7)
        (part,) = s.generate_groups([p], 2, seed=0, interrupt=cut)
        first_rows = len(inner.rows)
        # As the parameter server hands it to the next worker's lease.
        wired = msgs_to_partial(partial_to_msg(part, "lease", p.id).rows)
        # The gate is open now: the same agent runs through.
        (group,) = s.generate_groups([p], 2, seed=0, partials=[wired])
    finally:
        s.close()
    assert isinstance(part, PartialGroup) and part.unfinished == 2
    replays = [row.episode["replay"] for row in part.rows]
    assert [len(r) for r in replays] == [1, 1]  # each had its first turn before the cut
    # The resumed call sampled only the turns past the recorded ones.
    assert [c.episode["replayed_turns"] for c in group] == [1.0, 1.0]
    assert [c.episode["turns"] for c in group] == [2.0, 2.0]
    assert len(inner.rows) - first_rows == 2
    for c, replay in zip(group, replays):
        assert (c.episode["reward"], c.episode["failed"]) == (1.0, 0.0)
        sampled = c.tokens[c.loss_mask == 1].tolist()
        recorded = replay[0]["tokens"]
        assert sampled[: len(recorded)] == recorded  # the same ids for the replayed part
        assert c.logprobs[: len(recorded)].tolist() == replay[0]["logprobs"]


def test_the_endpoint_serves_the_model_name_the_agent_s_code_asks_for():
    def agent(client, p):
        r = client.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "1"}]
        )
        return float(r.model == "gpt-x")

    s = sampler(agent, model="gpt-x")
    try:
        (group,) = s.generate([prompt(0, 1, 1)], 1, seed=0)
    finally:
        s.close()
    assert group[0].episode["reward"] == 1.0


class Scripted(Rules):
    """Plays a script chosen by the question: what the twin test covers."""

    max_new_tokens = 512  # two calls in one turn fit (a character a token)

    def reply(self, text: str) -> str:
        (question,) = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", text)[-1:]
        results = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", text)

        def call(expression: str) -> str:
            body = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
            return f"<tool_call>\n{body}\n</tool_call>"

        if question == "two calls":  # two calls in one turn, then their sum
            return "\n".join([call("6*7"), call("1+x")]) if not results else results[0]
        if question == "never answers":
            return call(f"{len(results)}+1")
        if question == "malformed":
            return "<tool_call>\n{not json\n</tool_call>"
        return call(question) if not results else results[-1]


def test_the_calculator_environment_plays_the_calculator_agent_s_episodes_id_for_id():
    """``environments.calculator`` is the agent's twin: the same policy gives the same
    group prompt, ids, loss mask, logprobs, reward and counts through either."""
    from rlax.plugins.environments.calculator import CalculatorEnvironment
    from rlax.plugins.environments.runner import EpisodeSampler

    prompts = [
        Prompt("a", "2+3", TOK.encode("2+3"), "5"),
        Prompt("b", "x", TOK.encode("x"), "0"),  # the tool's error, then an answer
        Prompt("c", "two calls", TOK.encode("two calls"), "42"),
        Prompt("d", "never answers", TOK.encode("never answers"), "1"),
        Prompt("e", "malformed", TOK.encode("malformed"), "1"),
    ]
    agent = AgentSampler(
        sampler=Scripted(),
        agent=functools.partial(calculator, max_calls=2),
        reward=ArithmeticReward(),
        tool_parser=HermesToolParser(),
        max_turns=3,
        max_episode_tokens=4096,
    )
    agent.setup(None, TOK)
    env = EpisodeSampler(
        sampler=Scripted(),
        environment=CalculatorEnvironment(
            reward=ArithmeticReward(), max_calls=2, max_episode_tokens=4096
        ),
    )
    env.setup(None, TOK)
    try:
        by_agent = agent.generate(prompts, 2, seed=0)
    finally:
        agent.close()
    by_env = env.generate(prompts, 2, seed=0)
    rewards, turns = [], []
    for p, mine, twin in zip(prompts, by_agent, by_env):
        start = episode_prompt(p, mine).tokens
        assert start.tolist() == episode_prompt(p, twin).tokens.tolist()
        assert TOK.decode(start).startswith("system\nAnswer with an integer")
        for a, e in zip(mine, twin):
            assert a.tokens.tolist() == e.tokens.tolist(), p.text
            assert a.loss_mask.tolist() == e.loss_mask.tolist()
            assert a.logprobs.tolist() == e.logprobs.tolist()
            for key in ("reward", "turns", "failed"):
                assert float(a.episode[key]) == float(e.episode[key]), (p.text, key)
        rewards.append(twin[0].episode["reward"])
        turns.append(twin[0].episode["turns"])
    # By hand: 2+3 -> 5 (right); x -> an error, answered as text (0); two calls -> 42 and an
    # error, answers 42 (right); never answers -> 3 turns, no answer (0); malformed -> text (0).
    assert rewards == [1.0, 0.0, 1.0, 0.0, 0.0] and turns == [2, 2, 2, 3, 1]
    assert by_env[2][0].episode["tool_calls"] == 2 and by_env[2][0].episode["tool_errors"] == 1
