"""``rewards.judge`` against rlax's own endpoint, a scripted grader behind it, the real client.

The grader is a sampler whose answers are scripted; :class:`AgentEndpoint`
serves it to the ``openai`` client the reward uses. A tiny HTTP server in
front answers chosen statuses first (5xx, 429, 4xx) and then passes requests
through, to show what is retried and what is not.
"""

from __future__ import annotations

import concurrent.futures
import http.server
import pickle
import threading
import time

import numpy as np
import pytest
from chatml_case import chatml_tokenizer

from rlax.core.errors import BadSetting
from rlax.core.rollout.agents.endpoint import AgentEndpoint
from rlax.core.rollout.reward_pool import RewardPool
from rlax.core.types import Completion, Prompt
from rlax.plugins.rewards.judge.reward import JudgeReward
from rlax.plugins.rewards.judge.verdict import JudgeError, JudgeTimeout, parse_score

TOK = chatml_tokenizer()
GRADER = "grader"
KEY_ENV = "RLAX_TEST_JUDGE_KEY"
PROMPT = Prompt(id="p", text="What is 6 * 7?", tokens=np.zeros(1, np.int32), answer="42")


class ScriptedGrader:
    """A sampler answering each prompt with the next scripted text; ``(seconds, text)``
    sleeps first. Keeps each prompt it was asked, decoded."""

    temperature, max_new_tokens = 0.0, 128  # a grader is asked for its one judgement

    def __init__(self) -> None:
        self.script: list[str | tuple[float, str]] = []
        self.asked: list[str] = []

    def generate(self, prompts, n, *, seed):
        out = []
        for p in prompts:
            self.asked.append(TOK.decode(p.tokens))
            line = self.script.pop(0)
            if isinstance(line, tuple):
                time.sleep(line[0])
                line = line[1]
            ids = np.append(TOK.encode(line), TOK.eos_id).astype(np.int32)
            out.append((Completion(ids, np.full(len(ids), -0.5, np.float32), line, "stop", 0),))
        return out


@pytest.fixture(scope="module")
def served():
    grader = ScriptedGrader()
    with AgentEndpoint(sampler=grader, tokenizer=TOK, model=GRADER) as endpoint:
        yield endpoint, grader


@pytest.fixture
def grader(served, monkeypatch):
    endpoint, scripted = served
    scripted.script.clear()
    scripted.asked.clear()
    monkeypatch.setenv(KEY_ENV, endpoint.open_episode("judge"))
    return scripted


def judge(base_url: str, **settings) -> JudgeReward:
    defaults = {"model": GRADER, "api_key_env": KEY_ENV, "backoff_s": 0.01, "retries": 2}
    return JudgeReward(base_url=base_url, **{**defaults, **settings})


class Front:
    """A tiny HTTP server: answers the first requests with ``statuses`` (a status, or
    ``(status, retry_after)``), then passes each through to ``target`` unchanged after
    ``delay_s``; ``seen`` counts the requests it got, ``peak`` the most at once."""

    def __init__(self, target: str, statuses: list, delay_s: float = 0.0) -> None:
        import urllib.request

        front = self
        self.seen, self.statuses = 0, list(statuses)
        self.in_flight = self.peak = 0
        lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                with lock:
                    front.seen += 1
                    front.in_flight += 1
                    front.peak = max(front.peak, front.in_flight)
                time.sleep(delay_s)
                with lock:
                    front.in_flight -= 1
                wait = ""
                if front.statuses:
                    status, payload = front.statuses.pop(0), b'{"error": {"message": "no"}}'
                    status, wait = status if isinstance(status, tuple) else (status, "")
                else:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    request = urllib.request.Request(target + self.path[3:], body, headers)
                    with urllib.request.urlopen(request) as r:
                        status, payload = r.status, r.read()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                if wait:
                    self.send_header("retry-after", wait)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the verdict ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fine\nSCORE: 7", 7.0),
        ("SCORE:10", 10.0),
        ("reasoning\n  SCORE: 2.5  \n\n", 2.5),
        ("SCORE: 0", 0.0),
    ],
)
def test_a_final_score_line_is_read(text, expected):
    assert parse_score(text, 0, 10) == expected


@pytest.mark.parametrize(
    "text",
    ["good answer", "SCORE: 7\nthat is all", "SCORE: seven", "SCORE: 7/10", "score: 7", ""],
)
def test_anything_but_a_final_score_line_is_an_error(text):
    with pytest.raises(JudgeError, match="does not end with") as err:
        parse_score(text, 0, 10)
    assert err.value.kind == "verdict"


@pytest.mark.parametrize("text", ["SCORE: 11", "SCORE: -1", "SCORE: 10.01"])
def test_a_score_out_of_range_is_an_error(text):
    with pytest.raises(JudgeError, match=r"outside \[0, 10\]"):
        parse_score(text, 0, 10)


# -- against the endpoint --------------------------------------------------------------


def test_the_grader_s_score_is_normalised_and_it_saw_the_rubric_filled_in(served, grader):
    grader.script += ["Right: 6 * 7 = 42.\nSCORE: 7", "SCORE: 3"]
    reward = judge(served[0].url)
    result = reward.score(PROMPT, "It is 42.")
    assert result.score == pytest.approx(0.7) and "7" in result.reason
    asked = grader.asked[-1]
    assert "What is 6 * 7?" in asked and "It is 42." in asked and "Reference answer:\n42" in asked
    other = judge(served[0].url, lo=1, hi=5, rubric="{completion}: from {lo} to {hi}?")
    assert other.score(PROMPT, "x").score == pytest.approx((3 - 1) / (5 - 1))
    assert grader.asked[-1].endswith("user\nx: from 1 to 5?")  # decoded up to the stop id


def test_an_unparseable_judgement_is_a_counted_error_not_a_zero(served, grader):
    grader.script += ["Looks fine to me.", "SCORE: 12", "SCORE: 10"]
    reward = judge(served[0].url)
    with RewardPool(reward, workers=0) as pool:
        got = pool.score([PROMPT] * 3, ["a", "b", "c"])
    assert got.failed.tolist() == [True, True, False] and got.errors == 2
    assert got.scores.tolist() == [0.0, 0.0, 1.0]
    assert "does not end with 'SCORE: <number>'" in got.reasons[0]
    assert "outside [0, 10]" in got.reasons[1]
    metrics = reward.metrics()
    assert metrics["judge/verdict_errors"] == 2 and metrics["judge/errors"] == 2
    assert metrics["judge/judged"] == 1 and metrics["judge/requests"] == 3


def test_the_same_judgement_is_asked_once(served, grader, tmp_path):
    grader.script += ["SCORE: 4", "SCORE: 9", "garbage"]
    path = str(tmp_path / "judgements.jsonl")
    reward = judge(served[0].url, cache_file=path)
    assert reward.score(PROMPT, "a").score == pytest.approx(0.4)
    assert reward.score(PROMPT, "a").score == pytest.approx(0.4)
    assert reward.score(PROMPT, "b").score == pytest.approx(0.9)
    assert len(grader.asked) == 2 and reward.metrics()["judge/cache_hits"] == 1
    answer = Prompt(id="p", text=PROMPT.text, tokens=PROMPT.tokens, answer="41")
    with pytest.raises(JudgeError):  # another reference answer: asked, and garbage
        reward.score(answer, "a")
    with pytest.raises(JudgeError):  # the garbage is kept too: read again, not asked
        reward.score(answer, "a")
    assert len(grader.asked) == 3
    again = judge(served[0].url, cache_file=path)  # a fresh process reads the file
    assert again.score(PROMPT, "b").score == pytest.approx(0.9)
    copied = pickle.loads(pickle.dumps(reward))  # as the reward pool ships it
    assert copied.score(PROMPT, "a").score == pytest.approx(0.4)
    assert len(grader.asked) == 3
    other_rubric = judge(served[0].url, cache_file=path, rubric="Grade {completion}")
    grader.script += ["SCORE: 1"]
    assert other_rubric.score(PROMPT, "a").score == pytest.approx(0.1)
    assert len(grader.asked) == 4


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_a_grader_past_the_deadline_is_a_timeout(served, grader):
    grader.script += [(1.5, "SCORE: 5")]
    reward = judge(served[0].url, request_timeout_s=0.3, deadline_s=0.5, retries=3)
    start = time.monotonic()
    with pytest.raises(JudgeTimeout, match="no judgement in 0.5s"):
        reward.score(PROMPT, "slow")
    assert time.monotonic() - start < 1.2
    assert reward.metrics()["judge/timeout_errors"] == 1
    time.sleep(1.2)  # the grader finishes its answer before the next test scripts one


def test_5xx_and_429_are_retried_with_backoff(served, grader):
    grader.script += ["SCORE: 8"]
    front = Front(served[0].url, [503, 429, 500])
    try:
        reward = judge(front.url, retries=3, backoff_s=0.05)
        start = time.monotonic()
        assert reward.score(PROMPT, "z").score == pytest.approx(0.8)
        assert time.monotonic() - start >= 0.05 + 0.1 + 0.2  # backoff doubles
        assert front.seen == 4 and len(grader.asked) == 1
        assert reward.metrics()["judge/retries"] == 3
        front.statuses += [502, 502, 502, 502]
        with pytest.raises(JudgeError, match="failed 4 times; last: HTTP 502") as err:
            reward.score(PROMPT, "y")
        assert err.value.kind == "transport" and front.seen == 8
    finally:
        front.close()


def test_a_429_waits_as_long_as_its_retry_after_asks(served, grader):
    grader.script += ["SCORE: 6"]
    front = Front(served[0].url, [(429, "0.4")])
    try:
        reward = judge(front.url, retries=1, backoff_s=0.01)
        start = time.monotonic()
        assert reward.score(PROMPT, "w").score == pytest.approx(0.6)
        assert time.monotonic() - start >= 0.4 and front.seen == 2
    finally:
        front.close()


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_a_retry_that_cannot_finish_by_the_deadline_is_a_timeout(served, grader):
    front = Front(served[0].url, [503, 503])
    try:
        reward = judge(front.url, retries=3, backoff_s=1.0, deadline_s=0.5)
        start = time.monotonic()
        with pytest.raises(JudgeTimeout, match="last: HTTP 503"):
            reward.score(PROMPT, "z")
        assert time.monotonic() - start < 0.4 and front.seen == 1
    finally:
        front.close()


def test_requests_in_flight_are_bounded(served, grader):
    grader.script += ["SCORE: 5"] * 6
    front = Front(served[0].url, [], delay_s=0.2)
    try:
        reward = judge(front.url, max_concurrent=2)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            got = list(pool.map(lambda t: reward.score(PROMPT, t).score, "abcdef"))
        assert got == [0.5] * 6 and front.seen == 6 and front.peak == 2
    finally:
        front.close()


def test_a_pool_process_counts_the_judge_s_error(served, grader):
    grader.script += ["no verdict here", "SCORE: 2.5"]
    with RewardPool(judge(served[0].url), workers=1, timeout_s=20) as pool:
        got = pool.score([PROMPT] * 2, ["a", "b"])
    assert got.failed.tolist() == [True, False] and got.errors == 1 and got.timeouts == 0
    assert got.scores.tolist() == [0.0, 0.25] and "JudgeError" in got.reasons[0]


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_a_4xx_is_not_retried(served, grader, status):
    front = Front(served[0].url, [status])
    try:
        reward = judge(front.url, retries=3)
        with pytest.raises(JudgeError, match=f"the grader refused: HTTP {status}") as err:
            reward.score(PROMPT, "z")
        assert err.value.kind == "refused" and front.seen == 1 and grader.asked == []
        assert reward.metrics()["judge/refused_errors"] == 1
    finally:
        front.close()


def test_a_wrong_key_is_refused_by_the_endpoint_without_retries(served, grader, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "rlax-not-a-key")
    reward = judge(served[0].url, retries=3)
    with pytest.raises(JudgeError, match="HTTP 401"):
        reward.score(PROMPT, "z")
    assert reward.metrics()["judge/requests"] == 1


def test_a_server_that_is_not_there_is_retried_then_a_transport_error(grader):
    with pytest.raises(JudgeError, match="failed 3 times") as err:
        judge("http://127.0.0.1:9/v1", retries=2).score(PROMPT, "z")
    assert err.value.kind == "transport"


# -- settings --------------------------------------------------------------------------


def test_a_missing_api_key_variable_is_refused_at_construction(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(BadSetting, match=f"api_key_env: the environment variable {KEY_ENV}"):
        judge("http://127.0.0.1:1/v1")
    assert judge("http://127.0.0.1:1/v1", api_key_env="").grader.settings.api_key == ""


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"base_url": "127.0.0.1:8000"}, "rewards.judge.base_url: an http:// or https:// URL"),
        ({"model": " "}, "rewards.judge.model: the grader's model name is required"),
        ({"api_key_env": "MY-KEY"}, "rewards.judge.api_key_env: the name of an environment"),
        ({"rubric": "Grade {prompt}"}, "rewards.judge.rubric: must show the completion"),
        ({"rubric": "{completion} {score}"}, r"rewards.judge.rubric: unknown field \{score\}"),
        ({"rubric": "{completion} {"}, "rewards.judge.rubric: not a format template"),
        ({"lo": 5, "hi": 5}, r"rewards.judge.hi: must be > lo \(5\), got 5"),
        ({"deadline_s": 0}, r"rewards.judge: deadline_s: must be > 0, got 0"),
        ({"retries": -1}, r"rewards.judge: retries: must be >= 0, got -1"),
        ({"max_concurrent": 0}, r"rewards.judge: max_concurrent: must be >= 1, got 0"),
    ],
)
def test_settings_are_refused_in_one_line_naming_the_field(settings, message):
    arguments = {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "", **settings}
    with pytest.raises(BadSetting, match=message) as err:
        judge(**arguments)
    assert "\n" not in str(err.value)
    assert err.value.parameter == ("hi" if "lo" in settings else next(iter(settings)))


def test_the_key_is_never_in_the_repr(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-secret")
    assert "sk-secret" not in repr(judge("http://127.0.0.1:1/v1"))
