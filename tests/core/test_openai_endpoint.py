"""The agent endpoint driven by the real ``openai`` client: every turn's ids are the sampler's.

A tiny random model on the slot engine answers chat and completions; a
scripted sampler writes tool calls. Whatever the client sends back, the
episode's transcript holds exactly the ids and logprobs the sampler returned.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai
import pytest
from chatml_case import chatml_tokenizer, tiny_config
from flax import nnx

from rlax.core.models.transformer import Transformer
from rlax.core.rollout.agents.endpoint import AgentEndpoint
from rlax.core.rollout.agents.requests import EndpointLimits
from rlax.core.types import Completion
from rlax.plugins.environments.tool_calls import HermesToolParser
from rlax.plugins.samplers.engine import SlotEngine

MODEL = "tiny"
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "a + b",
        "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
    },
}


TOK = chatml_tokenizer()


class Spy:
    """Wraps a sampler: records each call's prompt ids and the completion it returned."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[np.ndarray, Completion]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, n, *, seed):
        out = self.inner.generate(prompts, n, seed=seed)
        self.calls += [(p.tokens.copy(), c) for p, cs in zip(prompts, out) for c in cs]
        return out


class Scripted:
    """Answers each call with the next text of a script, stop id after it, logprob -0.25."""

    temperature, max_new_tokens = 1.0, 128

    def __init__(self, script):
        self.script = list(script)

    def generate(self, prompts, n, *, seed):
        text = self.script.pop(0)
        ids = np.append(TOK.encode(text), TOK.eos_id).astype(np.int32)
        c = Completion(ids, np.full(len(ids), -0.25, np.float32), text, "stop", 2)
        return [(c,) for _ in prompts]


@pytest.fixture(scope="module")
def engine_endpoint():
    cfg = tiny_config(TOK.vocab_size)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    engine = SlotEngine(slots=2, chunk=8, max_new_tokens=8, max_prompt_tokens=192, prompt_bucket=64)
    engine.setup(model, TOK)
    engine.load_weights(nnx.state(model), 7)
    with AgentEndpoint(sampler=Spy(engine), tokenizer=TOK, model=MODEL) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def tool_endpoint():
    limits = EndpointLimits(max_body_bytes=4096)
    spy = Spy(Scripted([]))
    endpoint = AgentEndpoint(
        sampler=spy, tokenizer=TOK, tool_parser=HermesToolParser(), model=MODEL, limits=limits
    )
    with endpoint:
        yield endpoint


def client(endpoint, key):
    return openai.OpenAI(base_url=endpoint.url, api_key=key, max_retries=0, timeout=60)


def sampled_in_order(transcript):
    """(ids, logprobs) of the sampled tokens of each segment, as the trainer gets them."""
    out = []
    for _, c in transcript.completions():
        on = c.loss_mask == 1
        out.append((c.tokens[on].tolist(), c.logprobs[on].tolist()))
    return out


def test_every_chat_turn_records_the_sampler_s_own_ids_and_logprobs(engine_endpoint):
    ep, spy = engine_endpoint, engine_endpoint.backend.sampler
    key = ep.open_episode("chat")
    chat, start = client(ep, key), len(spy.calls)
    messages = [{"role": "user", "content": "hi"}]
    for turn in range(3):
        r = chat.chat.completions.create(model=MODEL, messages=messages, logprobs=True)
        prompt, c = spy.calls[-1]
        got = [t.logprob for t in r.choices[0].logprobs.content]
        np.testing.assert_allclose(got, c.logprobs, rtol=1e-6)
        assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(c.tokens)
        # The random model's bytes need not be UTF-8: its text re-encodes to other ids.
        messages += [r.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": f"turn {turn}"}]
    transcript = ep.close_episode(key)
    calls = spy.calls[start:]
    assert transcript.rewrites == 0 and len(calls) == 3
    ((prompt, c),) = transcript.completions()
    ids = np.r_[prompt, c.tokens]
    for p, s in calls:  # each turn continued the recorded ids, then sampled these
        assert ids[: len(p)].tolist() == p.tolist()
        assert ids[len(p) : len(p) + len(s.tokens)].tolist() == s.tokens.tolist()
    assert sampled_in_order(transcript) == [
        (
            np.concatenate([s.tokens for _, s in calls]).tolist(),
            np.concatenate([s.logprobs for _, s in calls]).tolist(),
        )
    ]
    assert c.policy_version == 7 and c.episode["turns"] == 3


def test_a_rewritten_history_becomes_a_counted_new_segment(engine_endpoint):
    ep = engine_endpoint
    key = ep.open_episode("rewrite")
    chat = client(ep, key)
    first = chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}])
    reply = first.choices[0].message.model_dump(exclude_none=True)
    edited = [{"role": "user", "content": "b"}, reply, {"role": "user", "content": "c"}]
    chat.chat.completions.create(model=MODEL, messages=edited)
    transcript = ep.close_episode(key)
    assert transcript.rewrites == 1 and len(transcript.completions()) == 2
    assert [c.episode["segment"] for _, c in transcript.completions()] == [0, 1]


def test_streamed_chunks_join_to_the_recorded_reply(engine_endpoint):
    ep = engine_endpoint
    key = ep.open_episode("stream")
    stream = client(ep, key).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "s"}], stream=True
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    transcript = ep.close_episode(key)
    assert text == transcript.segments[0].texts[0]


def test_completions_continue_their_ids_without_encoding_the_reply_again(engine_endpoint):
    ep, spy = engine_endpoint, engine_endpoint.backend.sampler
    key = ep.open_episode("text")
    api = client(ep, key)
    r1 = api.completions.create(model=MODEL, prompt="3+4=", max_tokens=5, logprobs=0)
    sampled = spy.calls[-1][1]  # the sampler's 8 ids, cut to the request's 5
    got = r1.choices[0].logprobs.token_logprobs
    np.testing.assert_allclose(got, sampled.logprobs[:5], rtol=1e-6)
    assert r1.choices[0].finish_reason == "length"
    r2 = api.completions.create(model=MODEL, prompt="3+4=" + r1.choices[0].text + "\nok")
    prompt2, c2 = spy.calls[-1]
    transcript = ep.close_episode(key)
    assert transcript.rewrites == 0
    ((prompt, c),) = transcript.completions()
    assert np.r_[prompt, c.tokens].tolist() == [*prompt2.tolist(), *c2.tokens.tolist()]
    assert c.tokens[:5].tolist() == sampled.tokens[:5].tolist() and c.loss_mask[:5].all()
    assert r2.choices[0].text == c2.text
    stream = client(ep, ep.open_episode("t2")).completions.create(
        model=MODEL, prompt="x", stream=True
    )
    assert [ch.choices[0].finish_reason for ch in stream][-1] in ("stop", "length")


def test_tool_calls_are_parsed_and_their_ids_come_back_as_sampled(tool_endpoint):
    ep, spy = tool_endpoint, tool_endpoint.backend.sampler
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    spy.inner.script[:] = [call, "It is 5."]
    key = ep.open_episode("tools")
    api = client(ep, key)
    messages = [{"role": "user", "content": "2+3?"}]
    r = api.chat.completions.create(model=MODEL, messages=messages, tools=[ADD])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (tc,) = choice.message.tool_calls
    assert tc.function.name == "add" and tc.function.arguments == '{"a": 2, "b": 3}'
    assert '"name": "add"' in TOK.decode(spy.calls[-1][0])  # the tools were shown to the model
    messages += [choice.message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": tc.id, "content": "5"}]
    r2 = api.chat.completions.create(model=MODEL, messages=messages, tools=[ADD])
    assert r2.choices[0].message.content == "It is 5." and r2.choices[0].finish_reason == "stop"
    transcript = ep.close_episode(key)
    assert transcript.rewrites == 0
    ((_, c),) = transcript.completions()
    first = np.append(TOK.encode(call), TOK.eos_id).tolist()
    assert c.tokens[: len(first)].tolist() == first and c.loss_mask[: len(first)].all()
    tool_part = TOK.encode_parts(["\n<|im_start|>", "tool\n5", "<|im_end|>\n<|im_start|>"])
    observation = c.tokens[c.loss_mask == 0].tolist()
    assert observation == [*tool_part.tolist(), *TOK.encode("assistant\n").tolist()]


def test_the_async_client_streams_a_chat_turn(tool_endpoint):
    ep = tool_endpoint
    ep.backend.sampler.inner.script[:] = ["async ok"]
    key = ep.open_episode("async")

    async def run():
        api = openai.AsyncOpenAI(base_url=ep.url, api_key=key, max_retries=0)
        models = await api.models.list()
        stream = await api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "?"}], stream=True
        )
        text = "".join([ch.choices[0].delta.content or "" async for ch in stream])
        await api.close()
        return [m.id for m in models.data], text

    assert asyncio.run(run()) == ([MODEL], "async ok")
    assert ep.close_episode(key).segments[0].texts == ["async ok"]


USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "body,status,param",
    [
        (
            {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "messages[0].role",
        ),
        ({"model": "gpt-9", "messages": USER}, 404, "model"),
        ({"model": MODEL, "messages": USER, "n": 2}, 400, "n"),
        ({"model": MODEL, "messages": USER, "max_tokens": 1.5}, 400, "max_tokens"),
        (
            {"model": MODEL, "messages": USER, "max_completion_tokens": -1},
            400,
            "max_completion_tokens",
        ),
        ({"model": MODEL, "messages": USER, "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        (
            {
                "model": MODEL,
                "messages": USER,
                "tools": [{"type": "function", "function": {"name": "a b"}}],
            },
            400,
            "tools[0]",
        ),
        (
            {
                "model": MODEL,
                "messages": USER,
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    }
                ],
            },
            400,
            "tools[0]",
        ),
        ({"model": MODEL, "messages": [{"role": "tool", "content": "5"}]}, 400, "messages[0]"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]}, 413, None),
    ],
)
def test_bad_requests_get_api_shaped_errors(tool_endpoint, body, status, param):
    key = tool_endpoint.open_episode("bad")
    r = httpx.post(
        f"{tool_endpoint.url}/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
    )
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert tool_endpoint.close_episode(key).requests == 0  # nothing was recorded


def test_the_openai_client_raises_its_own_errors(tool_endpoint):
    ep = tool_endpoint
    key = ep.open_episode("errors")
    with pytest.raises(openai.AuthenticationError) as wrong:
        client(ep, "not-a-key").chat.completions.create(model=MODEL, messages=USER)
    assert wrong.value.status_code == 401 and wrong.value.code == "invalid_api_key"
    with pytest.raises(openai.BadRequestError, match="role 'wizard'"):
        client(ep, key).chat.completions.create(
            model=MODEL, messages=[{"role": "wizard", "content": "x"}]
        )
    with pytest.raises(openai.APIStatusError) as big:
        client(ep, key).completions.create(model=MODEL, prompt="x" * 5000)
    assert big.value.status_code == 413 and big.value.code == "request_too_large"
    ep.close_episode(key)
    with pytest.raises(openai.AuthenticationError):  # a closed episode's key is refused
        client(ep, key).models.list()
    r = httpx.post(
        f"{ep.url}/completions", content=b"{not json", headers={"authorization": f"Bearer {key}"}
    )
    assert r.status_code == 401  # the key is checked first
    key = ep.open_episode("json")
    r = httpx.post(
        f"{ep.url}/completions", content=b"{not json", headers={"authorization": f"Bearer {key}"}
    )
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.get(f"{ep.url}/nowhere")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


def test_concurrent_episodes_each_record_only_their_own_turns(engine_endpoint):
    ep, spy = engine_endpoint, engine_endpoint.backend.sampler
    keys = [ep.open_episode(f"many/{k}") for k in range(3)]

    async def episode(key, word):
        api = openai.AsyncOpenAI(base_url=ep.url, api_key=key, max_retries=0)
        messages = [{"role": "user", "content": word}]
        for _ in range(2):
            r = await api.chat.completions.create(model=MODEL, messages=messages)
            messages += [r.choices[0].message.model_dump(exclude_none=True)]
            messages += [{"role": "user", "content": "more"}]
        await api.close()

    async def run():
        await asyncio.gather(*(episode(k, w) for k, w in zip(keys, ("x", "yy", "zzz"))))

    start = len(spy.calls)
    asyncio.run(run())
    calls = spy.calls[start:]
    assert len(calls) == 6
    for key in keys:
        transcript = ep.close_episode(key)
        ((prompt, c),) = transcript.completions()
        ids = np.r_[prompt, c.tokens].tolist()
        # Exactly two of the sampler's calls continued this episode's ids, and their
        # sampled ids are the episode's model tokens, in order.
        mine = [(p, s) for p, s in calls if ids[: len(p)] == p.tolist()]
        assert len(mine) == 2 and transcript.rewrites == 0
        sampled = np.concatenate([s.tokens for _, s in mine]).tolist()
        assert c.tokens[c.loss_mask == 1].tolist() == sampled


def test_a_prompt_longer_than_the_sampler_takes_is_refused_before_it_is_recorded(engine_endpoint):
    ep = engine_endpoint
    key = ep.open_episode("long")
    with pytest.raises(openai.BadRequestError) as err:
        client(ep, key).completions.create(model=MODEL, prompt="x" * 300)
    assert err.value.code == "context_length_exceeded" and "at most 192" in str(err.value)
    assert ep.close_episode(key).segments == []


def test_max_tokens_above_the_budget_is_clamped_not_refused(engine_endpoint):
    ep = engine_endpoint
    key = ep.open_episode("clamped")
    r = client(ep, key).chat.completions.create(model=MODEL, messages=USER, max_tokens=10_000)
    (c,) = [c for _, c in ep.close_episode(key).completions()]
    assert len(c.tokens) <= 8 and r.usage.completion_tokens == len(c.tokens)
    assert r.choices[0].finish_reason == c.finish_reason
