"""Requests to the agent endpoint, checked before any sampling; refusals in the API's shape."""

from __future__ import annotations

import json

import pytest

from rlax.core.rollout.agents.requests import (
    ApiError,
    EndpointLimits,
    Policy,
    chat_request,
    parse_body,
    text_request,
)

LIMITS = EndpointLimits(max_body_bytes=100, max_messages=3, max_tools=1, max_n=1)
USER = [{"role": "user", "content": "hi"}]


def chat(**body):
    return chat_request(
        {"model": "m", "messages": USER, **body}, policy=Policy("m", 16), limits=LIMITS
    )


def refused(call, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args, **kwargs)
    return info.value


def test_a_plain_request_gets_the_defaults():
    r = chat()
    assert (r.max_tokens, r.n, r.stream, r.logprobs, r.seed, r.tools) == (
        16,
        1,
        False,
        False,
        None,
        [],
    )
    assert r.messages == USER and r.tool_choice == "auto"


def test_contents_are_text_and_text_parts_are_joined():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert chat(messages=[{"role": "user", "content": parts}]).messages[0]["content"] == "ab"
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    assert (
        "only text content parts"
        in refused(chat, messages=[{"role": "user", "content": image}]).message
    )


def test_an_assistant_message_may_call_tools_without_content_and_a_tool_answer_names_its_call():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    r = chat(
        messages=[
            *USER,
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "1"},
        ]
    )
    assert r.messages[1] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert r.messages[2]["tool_call_id"] == "c"
    err = refused(chat, messages=[*USER, {"role": "assistant", "content": None}])
    assert err.param == "messages[1]" and "needs content" in err.message


@pytest.mark.parametrize(
    "body,param,says",
    [
        ({"n": True}, "n", "integer in [1, 1]"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "positive integer"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"seed": 1.5}, "seed", "integer"),
        ({"top_logprobs": 2}, "top_logprobs", "not served"),
        ({"tool_choice": "required"}, "tool_choice", '"auto" and "none"'),
        ({"messages": USER * 4}, "messages", "1 to 3"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tools", "at most 1"),
        ({"model": 3}, "model", "string"),
    ],
)
def test_each_bad_field_is_named(body, param, says):
    err = refused(chat, **body)
    assert (err.status, err.param) == (400, param) and says in err.message
    assert json.loads(json.dumps(err.body()))["error"]["type"] == "invalid_request_error"


def test_the_body_is_one_json_object_under_the_size_limit():
    assert parse_body(b'{"a": 1}', LIMITS) == {"a": 1}
    assert refused(parse_body, b"x" * 101, LIMITS).status == 413
    assert "not JSON" in refused(parse_body, b"{", LIMITS).message
    assert "JSON object" in refused(parse_body, b"[1]", LIMITS).message


def test_a_completions_prompt_is_one_string():
    def text(**body):
        return text_request({"model": "m", **body}, policy=Policy("m", 4), limits=LIMITS)

    assert text(prompt=["x"], logprobs=0).prompt == "x" and text(prompt="x", logprobs=0).logprobs
    assert refused(text, prompt=["x", "y"]).param == "prompt"
    assert refused(text, prompt="x", logprobs=1).param == "logprobs"  # top alternatives
    assert refused(text, prompt="x", echo=True).param == "echo"


def test_max_tokens_above_the_budget_is_clamped_and_a_bad_one_refused():
    def text(**body):
        return text_request({"model": "m", **body}, policy=Policy("m", 4), limits=LIMITS)

    assert text(prompt="x", max_tokens=1000).max_tokens == 4
    assert text(prompt="x", max_tokens=3).max_tokens == 3
    assert refused(text, prompt="x", max_tokens=0).param == "max_tokens"
    assert refused(text, prompt="x", max_tokens="5").param == "max_tokens"
    assert refused(text, prompt="x", max_tokens=True).param == "max_tokens"
    # The chat API's name is not a completions field: refused as the API refuses it.
    assert refused(text, prompt="x", max_completion_tokens=3).param == "max_completion_tokens"
