"""The Responses and Messages endpoints, driven by the ``openai`` client's ``responses`` and the
``anthropic`` client's ``messages``: the same recording as chat, token exact, tools included;
every field honoured or refused by name; a seeded fuzz gets no 5xx."""

from __future__ import annotations

import json
import random

import anthropic
import httpx
import numpy as np
import openai
import pytest
from agent_endpoint_case import MODEL, TOK, ScriptSampler, junk

from rlax.core.rollout.agents.endpoint import AgentEndpoint
from rlax.core.rollout.agents.formats import MESSAGES, RESPONSES
from rlax.plugins.environments.tool_calls import HermesToolParser

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}


@pytest.fixture(scope="module")
def endpoint():
    ep = AgentEndpoint(
        sampler=ScriptSampler(), tokenizer=TOK, tool_parser=HermesToolParser(), model=MODEL
    )
    with ep:
        yield ep


def oai(ep, key):
    return openai.OpenAI(base_url=ep.url, api_key=key, max_retries=0)


def claude(ep, key):
    return anthropic.Anthropic(base_url=ep.url.removesuffix("/v1"), api_key=key, max_retries=0)


def one_segment(ep, key, replies):
    """The episode's one segment: its sampled ids are exactly the sampler's replies, in order."""
    transcript = ep.close_episode(key)
    assert transcript.rewrites == 0
    ((_, c),) = transcript.completions()
    sampled = [np.append(TOK.encode(r), TOK.eos_id) for r in replies]
    assert c.tokens[c.loss_mask == 1].tolist() == np.concatenate(sampled).tolist()
    np.testing.assert_array_equal(c.logprobs[c.loss_mask == 1], -0.25)
    return c


def test_a_responses_harness_with_tools_records_one_token_exact_segment(endpoint):
    endpoint.backend.sampler.script[:] = [CALL, "It is 5."]
    key = endpoint.open_episode("responses")
    client = oai(endpoint, key)
    tool = {"type": "function", "name": "add", "parameters": SCHEMA}
    items: list = [{"role": "user", "content": "2+3?"}]
    r = client.responses.create(
        model=MODEL, instructions="be brief", input=items, tools=[tool], store=False
    )
    (call,) = r.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"a": 2, "b": 3}
    shown = TOK.decode(endpoint.backend.sampler.calls[-1][0])
    assert "be brief" in shown and '"name": "add"' in shown
    items += [call.model_dump(exclude_none=True)]
    items += [{"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
    r2 = client.responses.create(model=MODEL, instructions="be brief", input=items, tools=[tool])
    assert r2.output_text == "It is 5." and r2.status == "completed"
    assert r2.usage.output_tokens == len(TOK.encode("It is 5.")) + 1
    one_segment(endpoint, key, [CALL, "It is 5."])


def test_a_responses_stream_joins_to_the_recorded_reply(endpoint):
    endpoint.backend.sampler.script[:] = ["streamed words"]
    key = endpoint.open_episode("responses/stream")
    events = list(oai(endpoint, key).responses.create(model=MODEL, input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "streamed words" == events[-1].response.output_text
    one_segment(endpoint, key, ["streamed words"])


def test_a_messages_harness_with_tools_records_one_token_exact_segment(endpoint):
    endpoint.backend.sampler.script[:] = [CALL, "It is 5."]
    key = endpoint.open_episode("messages")
    client = claude(endpoint, key)
    tool = {"name": "add", "description": "a + b", "input_schema": SCHEMA}
    messages: list = [{"role": "user", "content": "2+3?"}]
    r = client.messages.create(
        model=MODEL, max_tokens=128, system="be brief", messages=messages, tools=[tool]
    )
    (use,) = r.content
    assert r.stop_reason == "tool_use" and use.type == "tool_use" and use.input == {"a": 2, "b": 3}
    messages += [{"role": "assistant", "content": [use.model_dump()]}]
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "5"}
    messages += [{"role": "user", "content": [result]}]
    r2 = client.messages.create(
        model=MODEL, max_tokens=128, system="be brief", messages=messages, tools=[tool]
    )
    assert r2.content[0].text == "It is 5." and r2.stop_reason == "end_turn"
    c = one_segment(endpoint, key, [CALL, "It is 5."])
    tool_part = TOK.encode_parts(["\n<|im_start|>", "tool\n5", "<|im_end|>\n<|im_start|>"])
    assert tool_part.tolist() == c.tokens[c.loss_mask == 0].tolist()[: len(tool_part)]


def test_messages_stop_sequences_and_the_stream(endpoint):
    endpoint.backend.sampler.script[:] = ["one. two", "three"]
    key = endpoint.open_episode("messages/stop")
    client = claude(endpoint, key)
    user = [{"role": "user", "content": "count"}]
    r = client.messages.create(model=MODEL, max_tokens=64, messages=user, stop_sequences=["."])
    assert (r.content[0].text, r.stop_reason, r.stop_sequence) == ("one", "stop_sequence", ".")
    history = [*user, {"role": "assistant", "content": r.content[0].text}, *user]
    with client.messages.stream(model=MODEL, max_tokens=64, messages=history) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "three" and final.stop_reason == "end_turn"
    transcript = endpoint.close_episode(key)
    ((_, c),) = transcript.completions()
    kept = TOK.encode("one.").tolist()  # through the stop string
    assert transcript.rewrites == 0 and c.tokens[: len(kept)].tolist() == kept


def test_messages_errors_are_the_messages_api_s(endpoint):
    key = endpoint.open_episode("messages/errors")
    with pytest.raises(anthropic.BadRequestError) as err:
        claude(endpoint, key).messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"top_k": 5},
        )
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "top_k" in err.value.message
    with pytest.raises(anthropic.AuthenticationError):
        claude(endpoint, "nope").messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.NotFoundError):
        claude(endpoint, key).messages.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )


RESPONSES_CASES = {
    "model": (None, None),
    "input": (None, [{"type": "reasoning", "summary": []}]),
    "instructions": ("be brief", 5),
    "tools": (None, [{"type": "web_search"}]),
    "tool_choice": ("auto", "required"),
    "max_output_tokens": (16, 0),
    "stream": (None, "yes"),
    "stream_options": (None, {"include_usage": True}),
    "temperature": (1.0, 0.2),
    "top_p": (1.0, 0.5),
    "top_logprobs": (0, 3),
    "parallel_tool_calls": (True, False),
    "metadata": ({"a": "b"}, {"a": 1}),
    "user": ("u", 1),
    "prompt_cache_key": ("k", 1),
    "safety_identifier": ("s", 1),
    "service_tier": ("default", "priority"),
    "store": (False, True),
    "background": (False, True),
    "truncation": ("disabled", "auto"),
    "include": ([], ["reasoning.encrypted_content"]),
    "text": ({"format": {"type": "text"}}, {"format": {"type": "json_object"}}),
    "reasoning": (None, {"effort": "low"}),
    "previous_response_id": (None, "resp_1"),
    "conversation": (None, "conv_1"),
    "prompt": (None, {"id": "pmpt_1"}),
    "max_tool_calls": (None, 3),
}
MESSAGES_CASES = {
    "model": (None, None),
    "max_tokens": (16, 0),
    "messages": (None, [{"role": "system", "content": "x"}]),
    "system": ("be brief", 5),
    "tools": (None, [{"type": "bash_20250124", "name": "bash"}]),
    "tool_choice": ({"type": "auto"}, {"type": "any"}),
    "stop_sequences": (None, [""]),
    "stream": (None, "yes"),
    "temperature": (1.0, 0.5),
    "top_p": (1.0, 0.5),
    "top_k": (0, 5),
    "metadata": ({"user_id": "u"}, {"tenant": "x"}),
    "service_tier": ("auto", "priority"),
    "thinking": ({"type": "disabled"}, {"type": "enabled", "budget_tokens": 1024}),
    "container": (None, "c"),
    "mcp_servers": (None, []),
    "context_management": (None, {}),
}


def test_every_field_of_both_apis_has_a_case():
    assert set(RESPONSES_CASES) == set(RESPONSES) and set(MESSAGES_CASES) == set(MESSAGES)


def _last_prompt(ep):
    return ep.backend.sampler.calls[-1][0].tolist()


@pytest.mark.parametrize("field", sorted(RESPONSES_CASES))
def test_each_responses_field_is_honoured_or_refused_by_name(endpoint, field):
    served, bad = RESPONSES_CASES[field]
    client = oai(endpoint, endpoint.open_episode(f"r/{field}"))
    base = {"model": MODEL, "input": "hi"}
    if served is not None:
        client.responses.create(**base)
        plain = _last_prompt(endpoint)
        client2 = oai(endpoint, endpoint.open_episode(f"r2/{field}"))
        r = client2.responses.create(**base, extra_body={field: served})
        if field != "instructions":  # no effect on what is sampled
            assert _last_prompt(endpoint) == plain and r.output_text == "ok"
        else:
            assert "be brief" in TOK.decode(_last_prompt(endpoint))
    if bad is not None:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(**base, extra_body={field: bad})
        assert err.value.param.startswith(field)


@pytest.mark.parametrize("field", sorted(MESSAGES_CASES))
def test_each_messages_field_is_honoured_or_refused_by_name(endpoint, field):
    served, bad = MESSAGES_CASES[field]
    client = claude(endpoint, endpoint.open_episode(f"m/{field}"))
    base = {"model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
    if served is not None:
        client.messages.create(**base)
        plain = _last_prompt(endpoint)
        client2 = claude(endpoint, endpoint.open_episode(f"m2/{field}"))
        r = client2.messages.create(**base, extra_body={field: served})
        if field == "system":
            assert "be brief" in TOK.decode(_last_prompt(endpoint))
        elif field == "max_tokens":
            assert r.usage.output_tokens == 3
        else:
            assert _last_prompt(endpoint) == plain and r.content[0].text == "ok"
    if bad is not None:
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(**base, extra_body={field: bad})
        assert field in err.value.message


@pytest.mark.parametrize(
    "path,table,base",
    [
        ("/responses", RESPONSES, {"model": MODEL, "input": "hi"}),
        (
            "/messages",
            MESSAGES,
            {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ],
)
def test_no_value_a_client_sends_gets_a_5xx(endpoint, path, table, base):
    rng = random.Random(57)
    key = endpoint.open_episode(f"fuzz{path}")
    headers = {"x-api-key": key, "content-type": "application/json"}
    statuses = []
    for _ in range(150):
        body = dict(base) if rng.random() < 0.7 else {}
        for field in rng.sample(sorted(table) + ["extra"], rng.randrange(1, 4)):
            body[field] = junk(rng)
        raw = json.dumps(body)
        statuses.append(
            httpx.post(f"{endpoint.url}{path}", content=raw, headers=headers).status_code
        )
    assert all(s < 500 for s in statuses), sorted(set(statuses))
    assert {200, 400} <= set(statuses)
    ok = httpx.post(
        f"{endpoint.url}{path}", json=base, headers={"x-api-key": endpoint.open_episode("after")}
    )
    assert ok.status_code == 200
