"""The in-process transport: an ``openai`` (or ``anthropic``) client whose requests call the
endpoint's app in this process records exactly what the same requests over the socket do,
with no server listening at all."""

from __future__ import annotations

import asyncio

import anthropic
import numpy as np
import openai
import pytest
from agent_endpoint_case import MODEL, TOK, ScriptSampler

from rlax.core.rollout.agents.endpoint import AgentEndpoint
from rlax.core.rollout.agents.episodes import client_factory

SCRIPT = ["first", "second"]


def conversation(client) -> list[str]:
    messages = [{"role": "user", "content": "hi"}]
    out = []
    for _ in SCRIPT:
        r = client.chat.completions.create(model=MODEL, messages=messages, logprobs=True)
        out.append(r.choices[0].message.content)
        messages += [r.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": "more"}]
    return out


def recorded(ep, key):
    ((prompt, c),) = ep.close_episode(key).completions()
    return np.r_[prompt, c.tokens].tolist(), c.loss_mask.tolist(), c.logprobs.tolist()


def test_in_process_clients_record_what_the_socket_records_with_no_server():
    socket_ep = AgentEndpoint(sampler=ScriptSampler(SCRIPT), tokenizer=TOK, model=MODEL)
    with socket_ep:
        key = socket_ep.open_episode("e")
        over_socket = conversation(client_factory(socket_ep.url, key, {})(False))
        expected = recorded(socket_ep, key)
    ep = AgentEndpoint(sampler=ScriptSampler(SCRIPT * 2), tokenizer=TOK, model=MODEL)
    assert ep.port == 0  # never started: nothing listens
    key = ep.open_episode("e")
    made: dict = {}
    assert conversation(client_factory(ep.url, key, made, "openai", ep)(False)) == over_socket
    assert recorded(ep, key) == expected
    made.pop(key).close()

    async def run_async(key):
        client = client_factory(ep.url, key, {}, "openai", ep)(True)
        messages = [{"role": "user", "content": "hi"}]
        out = []
        for _ in SCRIPT:
            r = await client.chat.completions.create(model=MODEL, messages=messages)
            out.append(r.choices[0].message.content)
            messages += [r.choices[0].message.model_dump(exclude_none=True)]
            messages += [{"role": "user", "content": "more"}]
        await client.close()
        return out

    key = ep.open_episode("e")
    assert asyncio.run(run_async(key)) == over_socket
    assert recorded(ep, key) == expected


def test_an_in_process_anthropic_client_and_errors_take_the_same_path():
    ep = AgentEndpoint(sampler=ScriptSampler(["hello"]), tokenizer=TOK, model=MODEL)
    key = ep.open_episode("m")
    client = client_factory(ep.url, key, {}, "anthropic", ep)(False)
    r = client.messages.create(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    assert r.content[0].text == "hello" and r.stop_reason == "end_turn"
    with pytest.raises(anthropic.BadRequestError, match="top_p"):
        client.messages.create(model=MODEL, max_tokens=16, messages=[], extra_body={"top_p": 0.5})
    ep.close_episode(key)
    with pytest.raises(openai.AuthenticationError) as err:
        client_factory(ep.url, key, {}, "openai", ep)(False).models.list()
    assert err.value.status_code == 401
