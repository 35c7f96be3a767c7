"""Tools: the JSON-in-tags parser, the Python tool in the sandbox, hostile tool code."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import runpy
import socket
import string

import numpy as np
import pytest

from rlax.core.episodes import ToolCall
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.types import Completion, Prompt
from rlax.plugins.environments.python_tool import PythonToolEnvironment
from rlax.plugins.environments.runner import EpisodeSampler
from rlax.plugins.environments.tool_calls import HermesToolParser

TOK = CharTokenizer(string.printable)
ROOT = pathlib.Path(__file__).resolve().parents[3]
CASES = runpy.run_path(str(ROOT / "tests/plugins/rewards/hostile/cases.py"))
needs_root = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0, reason="the sandbox's isolation needs Linux as root"
)


def call(code: str) -> str:
    body = json.dumps({"name": "python", "arguments": {"code": code}})
    return f"<tool_call>\n{body}\n</tool_call>"


# ---- the parser -------------------------------------------------------------------


def test_the_parser_reads_qwen_and_hermes_calls():
    parser = HermesToolParser()
    text = 'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "1+1"}}\n'
    text += '</tool_call><tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>'
    assert parser.parse(text) == [ToolCall("python", {"code": "1+1"}), ToolCall("f", {"x": 2})]
    assert parser.parse("The answer is 4.") == []
    assert parser.format_result(ToolCall("f", {}), "4") == "<tool_response>\n4\n</tool_response>"


@pytest.mark.parametrize(
    "text,message",
    [
        ("<tool_call>{'name': 'python'}</tool_call>", "not JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'string "name"'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "JSON object"),
        ('<tool_call>{"name": "f"}', "without its </tool_call>"),
        ('<tool_call>{"name": "f"}</tool_call>' * 5, "at most 4"),
    ],
)
def test_a_malformed_call_is_a_value_error_that_says_why(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        HermesToolParser().parse(text)


# ---- the Python tool in episodes ------------------------------------------------------


class Copier:
    """Turn 1: the scripted call; turn 2: answers with what the tool printed (the last
    ``<tool_response>`` in the episode so far), as a model that read the result would."""

    temperature, max_new_tokens = 1.0, 4096

    def __init__(self, first: str):
        self.first, self.calls = first, 0

    def setup(self, model, tokenizer):
        self.tokenizer = tokenizer

    def load_weights(self, params, version):
        pass

    def generate(self, prompts, n, *, seed):
        self.calls += 1
        out = []
        for p in prompts:
            seen = "".join(TOK.alphabet[i - 3] for i in p.tokens.tolist() if i >= 3)
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", seen, re.DOTALL)
            text = self.first if self.calls == 1 else (results[-1].strip() if results else "")
            ids = np.append(TOK.encode(text), TOK.eos_id).astype(np.int32)
            c = Completion(ids, np.full(len(ids), -0.5, np.float32), text, "stop", 0)
            out.append(tuple(c for _ in range(n)))
        return out


class Equals:
    """1 when the answer is the prompt's answer."""

    def score(self, prompt, text):
        return float(text.strip() == prompt.answer)


def episode(first: str, answer: str = "42", timeout_s: float = 3.0):
    env = PythonToolEnvironment(reward=Equals(), tool_timeout_s=timeout_s, max_episode_tokens=4096)
    sampler = EpisodeSampler(sampler=Copier(first), environment=env)
    sampler.setup(None, TOK)
    prompt = Prompt("p", "q", TOK.encode("q"), answer)
    ((c,),) = sampler.generate([prompt], 1, seed=0)
    return c


@needs_root
def test_a_tool_call_runs_in_the_sandbox_and_its_output_is_an_observation():
    c = episode(call("print(6 * 7)"))
    assert c.episode["reward"] == 1.0 and c.episode["tool_calls"] == 1
    assert c.episode["tool_errors"] == 0 and c.episode["turns"] == 2
    assert "<tool_response>\n42\n\n</tool_response>" in c.text
    observed = TOK.decode(c.tokens[c.loss_mask == 0])
    assert observed == "<tool_response>\n42\n\n</tool_response>"


@needs_root
@pytest.mark.parametrize(
    "first,where",
    [
        (call("1 / 0"), "ZeroDivisionError"),
        ('<tool_call>{"name": "python"', "without its </tool_call>"),
        ('<tool_call>{"name": "shell", "arguments": {"code": "ls"}}</tool_call>', "unknown tool"),
    ],
)
def test_a_failing_tool_is_an_observation_and_the_episode_goes_on(first, where):
    c = episode(first)
    assert c.episode["tool_errors"] == 1 and c.episode["turns"] == 2
    assert c.episode["failed"] == 0 and where in c.text


CONTAIN = sorted(name for name, (kind, _, _) in CASES["HOSTILE"].items() if kind == "contain")


@pytest.fixture(scope="module")
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.05)
    yield server
    server.close()


@needs_root
@pytest.mark.parametrize("name", CONTAIN)
def test_hostile_tool_code_is_contained_and_scores_zero(name, listener, tmp_path, caplog):
    """The red-team table's containment cases as tool code: each answers ``add(1, 2)``
    correctly only if its attack worked, and the model answers with what it printed."""
    _, _, source = CASES["HOSTILE"][name]
    for key, value in (
        ("PORT", str(listener.getsockname()[1])),
        ("HOSTDIR", str(tmp_path)),
        ("CANARY", str(tmp_path / "canary")),
        ("PROJECT", str(ROOT)),
        ("SECRET", repr("hunter2")),
    ):
        source = source.replace(key, value)
    with caplog.at_level(logging.WARNING, "rlax.environments"):
        c = episode(call(source + "\nprint(add(1, 2))"), answer="3", timeout_s=1.5)
    assert c.episode["reward"] == 0.0, c.text[-300:]
    assert c.episode["reason"]
    if c.episode["failed"]:  # the sandbox stopped it: the episode ended there, logged
        assert c.episode["turns"] == 1 and "sandbox stopped the tool call" in caplog.text
    with pytest.raises(OSError):
        listener.accept()
    assert list(tmp_path.iterdir()) == []
