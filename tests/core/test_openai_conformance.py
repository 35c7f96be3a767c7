"""The endpoint's conformance with the APIs it serves, driven by the real ``openai`` client.

Every request field of chat completions and completions is honoured (a test
of its effect) or refused with a 400 naming it; a seeded fuzz of field
values gets no 5xx and the server keeps serving; starting the endpoint
leaves the host's logging as it was; a reply its client never got is not
recorded, and the client's retry continues from what it did get (over the socket
and in-process, sync and async).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random

import httpx
import numpy as np
import openai
import pytest
from agent_endpoint_case import MODEL, TOK, ScriptSampler, junk

from rlax.core.rollout.agents.endpoint import AgentEndpoint
from rlax.core.rollout.agents.fields import CHAT, TEXT
from rlax.core.rollout.agents.in_process import http_package
from rlax.plugins.environments.tool_calls import HermesToolParser

USER = [{"role": "user", "content": "hi"}]
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


@pytest.fixture(scope="module")
def endpoint():
    ep = AgentEndpoint(
        sampler=ScriptSampler(), tokenizer=TOK, tool_parser=HermesToolParser(), model=MODEL
    )
    with ep:
        yield ep


def api(ep, key, **kw):
    return openai.OpenAI(base_url=ep.url, api_key=key, max_retries=0, **kw)


def post(ep, key, path, body):
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{ep.url}{path}", content=raw, headers=headers, timeout=30)


# -- item 6: the host's logging ---------------------------------------------------------


class Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records, self.closed = [], False

    def emit(self, record):
        self.records.append(record.getMessage())

    def close(self):
        self.closed = True
        super().close()


def test_starting_the_endpoint_leaves_the_host_s_logging_as_it_was():
    root, mine = logging.getLogger(), logging.getLogger("host.app")
    handler = Kept()
    root.addHandler(handler)
    before = (list(root.handlers), root.level, mine.disabled)
    try:
        with AgentEndpoint(sampler=ScriptSampler(), tokenizer=TOK, model=MODEL):
            mine.warning("after start")
            logging.getLogger("rlax.agents").warning("from the endpoint's logger")
        assert (list(root.handlers), root.level, mine.disabled) == before
        assert not handler.closed  # uvicorn's default dictConfig closed every handler
        assert handler.records[-2:] == ["after start", "from the endpoint's logger"]
    finally:
        root.removeHandler(handler)


# -- item 1: every field honoured or refused ----------------------------------------------

# Per field of each API: a value served (None: the field's effect has its own test below)
# and a value refused (None: every value of its type is served).
CHAT_CASES = {
    "model": (None, "gpt-x"),
    "messages": (None, []),
    "max_tokens": (5, 0),
    "max_completion_tokens": (5, -1),
    "n": (1, 2),
    "stream": (None, "yes"),
    "stream_options": (None, {"include_usage": "no"}),
    "seed": (None, 2**64),
    "stop": (None, ["a", "b", "c", "d", "e"]),
    "logprobs": (None, 1),
    "temperature": (1.0, 0.7),
    "top_p": (1, 0.9),
    "frequency_penalty": (0, 0.5),
    "presence_penalty": (0.0, -1),
    "logit_bias": ({}, {"5": 10}),
    "user": ("u-1", 7),
    "tools": (None, [{"type": "function", "function": {"name": "a b"}}]),
    "tool_choice": (None, "required"),
    "top_logprobs": (0, 2),
    "parallel_tool_calls": (True, False),
    "response_format": ({"type": "text"}, {"type": "json_object"}),
    "metadata": ({"run": "7"}, {"run": 7}),
    "store": (False, True),
    "service_tier": ("auto", "flex"),
    "prompt_cache_key": ("k", ["k"]),
    "safety_identifier": ("s", 1),
    "modalities": (["text"], ["text", "audio"]),
    "audio": (None, {"voice": "alloy", "format": "wav"}),
    "prediction": (None, {"type": "content", "content": "x"}),
    "reasoning_effort": (None, "low"),
    "verbosity": (None, "low"),
    "web_search_options": (None, {}),
    "functions": (None, [{"name": "f"}]),
    "function_call": (None, "auto"),
}
TEXT_CASES = {
    **{k: CHAT_CASES[k] for k in CHAT_CASES if k in TEXT},
    "prompt": (None, ["a", "b"]),
    "logprobs": (0, 1),
    "best_of": (1, 2),
    "echo": (False, True),
    "suffix": ("", "tail"),
}


def test_every_field_of_both_apis_has_a_case():
    assert set(CHAT_CASES) == set(CHAT) and set(TEXT_CASES) == set(TEXT)


def _prompt_ids(ep):
    return ep.backend.sampler.calls[-1][0].tolist()


@pytest.mark.parametrize("field", sorted(CHAT_CASES))
def test_each_chat_field_is_honoured_or_refused_by_name(endpoint, field):
    served, bad = CHAT_CASES[field]
    key = endpoint.open_episode(f"field/{field}")
    client = api(endpoint, key)
    if served is not None:
        base = client.chat.completions.create(model=MODEL, messages=USER)
        base_ids = _prompt_ids(endpoint)
        again = api(endpoint, endpoint.open_episode(f"field2/{field}"))
        r = again.chat.completions.create(model=MODEL, messages=USER, extra_body={field: served})
        # No effect on what is sampled: the same prompt ids, the same reply.
        assert _prompt_ids(endpoint) == base_ids
        assert r.choices[0].message.content == base.choices[0].message.content
    if field == "model":  # a model not served: 404, as the API answers it
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(model=bad, messages=USER)
        assert missing.value.param == "model"
        return
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=USER, extra_body={field: bad})
    assert err.value.status_code == 400 and err.value.param.startswith(field)


def test_a_wrong_model_is_404_and_an_unknown_field_is_named(endpoint):
    key = endpoint.open_episode("unknown")
    with pytest.raises(openai.NotFoundError):
        api(endpoint, key).chat.completions.create(model="gpt-x", messages=USER)
    with pytest.raises(openai.BadRequestError) as err:
        api(endpoint, key).chat.completions.create(
            model=MODEL, messages=USER, extra_body={"frobnicate": 1}
        )
    assert err.value.param == "frobnicate" and "unrecognized" in str(err.value)
    assert endpoint.close_episode(key).requests == 0


@pytest.mark.parametrize("field", sorted(TEXT_CASES))
def test_each_completions_field_is_honoured_or_refused_by_name(endpoint, field):
    served, bad = TEXT_CASES[field]
    key = endpoint.open_episode(f"text/{field}")
    client = api(endpoint, key)
    if served is not None:
        client.completions.create(model=MODEL, prompt="p", extra_body={field: served})
    if field == "model":
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=bad, prompt="p")
        return
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="p", extra_body={field: bad})
    assert err.value.status_code == 400 and err.value.param.startswith(field)


def test_stop_strings_cut_the_reply_and_the_record_keeps_what_the_model_wrote(endpoint):
    sampler = endpoint.backend.sampler
    sampler.script[:] = ["alpha STOP beta", "next"]
    key = endpoint.open_episode("stop")
    client = api(endpoint, key)
    r = client.chat.completions.create(model=MODEL, messages=USER, stop=["zzz", "STOP"])
    assert r.choices[0].message.content == "alpha " and r.choices[0].finish_reason == "stop"
    messages = [*USER, r.choices[0].message.model_dump(exclude_none=True)]
    client.chat.completions.create(model=MODEL, messages=[*messages, *USER])
    transcript = endpoint.close_episode(key)
    ((_, c),) = transcript.completions()
    kept = TOK.encode("alpha STOP").tolist()  # byte ids: through the stop string, no further
    assert transcript.rewrites == 0 and c.tokens[: len(kept)].tolist() == kept
    assert c.loss_mask[: len(kept)].all() and not c.loss_mask[len(kept)]
    np.testing.assert_array_equal(c.logprobs[: len(kept)], -0.25)
    # The next request followed those ids, then the template's end-of-message (im_end).
    (first, _, _), (prompt, _, _) = sampler.calls[-2], sampler.calls[-1]
    at = len(first) + len(kept)
    assert prompt[: len(first)].tolist() == first.tolist()
    assert prompt[len(first) : at].tolist() == kept and prompt[at] == TOK.eos_id
    text = api(endpoint, endpoint.open_episode("stop/text")).completions.create(
        model=MODEL, prompt="p", stop="ph"
    )
    sampler.script[:] = []
    assert text.choices[0].text == "ok"  # no stop string in it: whole


def test_logprob_tokens_are_text_with_their_bytes(endpoint):
    endpoint.backend.sampler.script[:] = ["h\u00e9!"]
    r = api(endpoint, endpoint.open_episode("bytes")).chat.completions.create(
        model=MODEL, messages=USER, logprobs=True
    )
    tokens = r.choices[0].logprobs.content
    # Byte-level ids: é is two ids, neither a character; the stop id has no bytes.
    assert [t.token for t in tokens] == ["h", "bytes:\\xc3", "bytes:\\xa9", "!", ""]
    assert b"".join(bytes(t.bytes) for t in tokens).decode() == "h\u00e9!"
    assert [t.logprob for t in tokens] == [-0.25] * 5


def test_seed_reaches_the_sampler_and_stream_options_add_the_usage(endpoint):
    sampler = endpoint.backend.sampler
    client = api(endpoint, endpoint.open_episode("seed"))
    client.chat.completions.create(model=MODEL, messages=USER, seed=2**63 - 1)
    assert sampler.calls[-1][2] == (2**63 - 1) % 2**32
    client.chat.completions.create(model=MODEL, messages=USER, seed=-5)
    assert sampler.calls[-1][2] == (-5) % 2**32
    chunks = list(
        api(endpoint, endpoint.open_episode("usage")).chat.completions.create(
            model=MODEL,
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3  # o, k, stop
    logprobs = [
        t
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs
        for t in ch.choices[0].logprobs.content
    ]
    assert [t.token for t in logprobs] == ["o", "k", ""]


def test_tool_schemas_are_checked_whole_as_json_schema(endpoint):
    key = endpoint.open_episode("schema")
    nested_bad = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}},
        },
    }
    with pytest.raises(openai.BadRequestError) as err:
        api(endpoint, key).chat.completions.create(model=MODEL, messages=USER, tools=[nested_bad])
    assert err.value.param == "tools[0]" and "properties/a/type" in str(err.value)
    r = api(endpoint, key).chat.completions.create(model=MODEL, messages=USER, tools=[ADD])
    assert r.choices[0].message.content == "ok"
    shown = TOK.decode(endpoint.backend.sampler.calls[-1][0])
    none = api(endpoint, key).chat.completions.create(
        model=MODEL, messages=USER, tools=[ADD], tool_choice="none"
    )
    assert '"name": "add"' in shown and none.choices[0].message.content == "ok"
    assert '"name": "add"' not in TOK.decode(endpoint.backend.sampler.calls[-1][0])


# -- the fuzz -----------------------------------------------------------------------------


RAW_JUNK = [
    b'{"model": "tiny", "messages": [{"role": "user", "content": "a"}], "seed": '
    + b"9" * 5000
    + b"}",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "tiny", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"model": "tiny", "temperature": NaN, "messages": [{"role": "user", "content": "a"}]}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b"\xff\xfe",
    b"",
]


@pytest.mark.parametrize("path,table", [("/chat/completions", CHAT), ("/completions", TEXT)])
def test_no_value_a_client_sends_gets_a_5xx_and_the_server_keeps_serving(endpoint, path, table):
    rng = random.Random(57)
    fields = sorted(table) + ["name", "extra", "messages"]
    key = endpoint.open_episode(f"fuzz{path}")
    statuses = []
    for _ in range(150):
        body = {"model": MODEL, "messages": USER, "prompt": "p"} if rng.random() < 0.7 else {}
        body.pop("messages" if path == "/completions" else "prompt", None)
        for field in rng.sample(fields, rng.randrange(1, 4)):
            body[field] = junk(rng)
        try:
            raw = json.dumps(body)
        except (ValueError, RecursionError):
            continue
        statuses.append(post(endpoint, key, path, raw).status_code)
    statuses += [post(endpoint, key, path, raw).status_code for raw in RAW_JUNK]
    assert all(s < 500 for s in statuses), sorted(set(statuses))
    assert {200, 400} <= set(statuses)
    ok = {"model": MODEL, "messages": USER} if "chat" in path else {"model": MODEL, "prompt": "p"}
    assert post(endpoint, endpoint.open_episode("after"), path, ok).status_code == 200


# -- item 2: only what the agent saw is trained --------------------------------------------


def in_process(ep, key, use_async: bool = False, **kw):
    """A client whose requests call the endpoint in-process (no socket), as
    ``samplers.agents`` gives an agent in the worker's process."""
    kind = openai.DefaultAsyncHttpxClient if use_async else openai.DefaultHttpxClient
    transport = ep.transports(http_package(kind))[1 if use_async else 0]
    client = openai.AsyncOpenAI if use_async else openai.OpenAI
    http = kind(transport=transport)
    return client(base_url=ep.url, api_key=key, max_retries=0, http_client=http, **kw)


def chat_sync(client):
    return client.chat.completions.create(model=MODEL, messages=USER)


def chat_async(client):
    return asyncio.run(client.chat.completions.create(model=MODEL, messages=USER))


@pytest.mark.parametrize("transport", ["socket", "in_process", "in_process_async"])
def test_a_reply_the_client_timed_out_on_is_not_recorded_and_its_retry_continues(
    endpoint, transport
):
    sampler = endpoint.backend.sampler
    sampler.script[:] = ["never seen", "seen"]
    sampler.delays[:] = [1.5]  # the first reply comes after the client gave up
    key = endpoint.open_episode(f"timeout-{transport}")
    gone = endpoint.gone
    if transport == "socket":
        impatient, chat = api(endpoint, key, timeout=0.4), chat_sync
    else:
        use_async = transport.endswith("async")
        impatient = in_process(endpoint, key, use_async, timeout=0.4)
        chat = chat_async if use_async else chat_sync
    with pytest.raises(openai.APITimeoutError):
        chat(impatient)
    r = api(endpoint, key, timeout=30).chat.completions.create(model=MODEL, messages=USER)
    assert r.choices[0].message.content == "seen"
    transcript = endpoint.close_episode(key)
    assert endpoint.gone == gone + 1 and transcript.rewrites == 0
    ((prompt, c),) = transcript.completions()
    assert c.text == "seen" and c.episode["turns"] == 1
    assert c.tokens.tolist() == [*TOK.encode("seen").tolist(), TOK.eos_id]
    first_prompt, first, _ = sampler.calls[-2]
    assert first.text == "never seen" and prompt.tolist() == first_prompt.tolist()
