"""The one retry policy, on a fake clock, and the trainer's rules built on it (TrainerClient).

A fake ``sleep`` advances a fake clock, so every delay the policy waits is
recorded and the deadline is reached without waiting.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import grpc
import pytest

from rlax.core.errors import LostStep, Preempted
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.queue import recovery
from rlax.core.param_server.retry import RETRYABLE, RetryPolicy
from rlax.core.runtime.preemption import Preemption
from rlax.core.trainer.client import TrainerClient

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode):
        super().__init__(code.name)
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


class Clock:
    """A monotonic clock that only moves when someone sleeps; records every sleep."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(*codes: grpc.StatusCode, then="ok"):
    """A call that fails with ``codes`` in turn, then returns ``then``; counts its calls."""
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= len(codes):
            raise FakeRpcError(codes[len(calls) - 1])
        return then

    return fn, calls


def policy(clock: Clock, **changes) -> RetryPolicy:
    return RetryPolicy(sleep=clock.sleep, clock=clock, **changes)


# -- the policy ---------------------------------------------------------------------------


def test_the_delays_double_from_0_2_s_up_to_5_s_until_the_deadline():
    clock = Clock()
    fn, calls = failing(*[UNAVAILABLE] * 100)
    with pytest.raises(grpc.RpcError) as err:
        policy(clock, deadline_s=20.0).call("Stat", fn)
    assert err.value.code() == UNAVAILABLE  # the last error, once the deadline is near
    # 0.2 0.4 0.8 1.6 3.2, then capped at 5: slept 16.2 s; a 5 s wait more would end at
    # 21.2 s, past the 20 s deadline, so it is not made.
    assert clock.slept == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert len(calls) == 8  # the first try and one after each wait


def test_a_call_that_recovers_returns_its_value_after_the_waits():
    clock = Clock()
    fn, calls = failing(UNAVAILABLE, UNAVAILABLE, then=42)
    assert policy(clock).call("Stat", fn) == 42
    assert clock.slept == pytest.approx([0.2, 0.4]) and len(calls) == 3


@pytest.mark.parametrize("code", sorted(RETRYABLE, key=lambda c: c.name))
def test_each_retryable_status_is_retried(code):
    clock = Clock()
    fn, calls = failing(code, then="ok")
    assert policy(clock).call("Ack", fn) == "ok" and len(calls) == 2


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
    ],
)
def test_other_statuses_are_answers_and_raise_at_once(code):
    clock = Clock()
    fn, calls = failing(code)
    stopped = []
    with pytest.raises(grpc.RpcError) as err:
        policy(clock, stop=lambda what, e: stopped.append(what)).call("Submit", fn)
    assert err.value.code() == code
    assert (len(calls), clock.slept, stopped) == (1, [], [])  # no wait, no stop hook


def test_a_zero_deadline_never_retries():
    clock = Clock()
    fn, calls = failing(UNAVAILABLE)
    with pytest.raises(grpc.RpcError):
        policy(clock, deadline_s=0.0).call("Stat", fn)
    assert (len(calls), clock.slept) == (1, [])


def test_give_up_is_asked_after_each_failure_and_ends_the_retries():
    clock = Clock()
    asked = []
    fn, calls = failing(*[UNAVAILABLE] * 10)
    give_up = lambda: asked.append(1) or len(asked) >= 3
    with pytest.raises(grpc.RpcError):
        policy(clock, give_up=give_up).call("Lease", fn)
    assert (len(asked), len(calls)) == (3, 3)
    assert clock.slept == pytest.approx([0.2, 0.4])


def test_before_retry_runs_before_each_repeat_only():
    clock = Clock()
    fn, _ = failing(UNAVAILABLE, UNAVAILABLE)
    order = []
    wrapped = lambda: order.append("call") or fn()
    policy(clock).call("Take", wrapped, before_retry=lambda: order.append("before"))
    assert order == ["call", "before", "call", "before", "call"]


def test_one_log_line_per_retry_names_the_call_the_status_and_the_wait(caplog):
    clock = Clock()
    fn, _ = failing(UNAVAILABLE, grpc.StatusCode.CANCELLED)
    with caplog.at_level(logging.WARNING, logger="rlax.retry"):
        policy(clock).call("Lease", fn)
    assert [r.getMessage() for r in caplog.records] == [
        "Lease: UNAVAILABLE; retrying in 0.2s (the parameter server is unreachable)",
        "Lease: CANCELLED; retrying in 0.4s (the parameter server is unreachable)",
    ]


# -- the trainer's rules (TrainerClient) --------------------------------------------------


class FakeServerClient:
    """The plain client's surface, failing each named call with the codes queued for it."""

    def __init__(self):
        self.failures: dict[str, list[grpc.StatusCode]] = {}
        self.released: list[list[str]] = []
        self.version = -1
        self.takes = 0

    def _maybe_fail(self, name: str) -> None:
        queued = self.failures.get(name, [])
        if queued:
            raise FakeRpcError(queued.pop(0))

    def take(self, max_groups, **kwargs):
        self._maybe_fail("Take")
        self.takes += 1
        return f"t{self.takes}", ["group"], 0

    def ack(self, take_id):
        self._maybe_fail("Ack")
        return 1

    def push(self, plan, tree, version, probe=None):
        self._maybe_fail("Push")
        self.version = version
        return pb.PushReply(version=version, committed=True)

    def stat(self):
        return pb.StatReply(version=self.version)

    def unary(self, method, request, *, timeout=30.0, retry=None):
        assert method == recovery.RELEASE_METHOD
        self.released.append(json.loads(request)["keep"])
        return json.dumps({"released": 0}).encode()

    def close(self):
        pass


def trainer_client(notice_after_sleeps: int | None = None):
    """(TrainerClient on a fake server, the fake, its preemption, the clock)."""
    fake, clock = FakeServerClient(), Clock()
    preemption = Preemption([], role="trainer")
    client = TrainerClient(fake, preemption, retry_s=60.0)

    def sleep(seconds):
        clock.sleep(seconds)
        if notice_after_sleeps is not None and len(clock.slept) >= notice_after_sleeps:
            preemption.notify("test notice")

    client.retry = dataclasses.replace(client.retry, sleep=sleep, clock=clock)
    return client, fake, preemption, clock


def test_the_trainer_retries_while_there_is_no_notice():
    client, fake, _, clock = trainer_client()
    fake.failures["Ack"] = [UNAVAILABLE, UNAVAILABLE]
    assert client.ack("t1") == 1
    assert clock.slept == pytest.approx([0.2, 0.4])


def test_after_a_notice_a_failed_take_stops_at_the_safe_point():
    client, fake, _, clock = trainer_client(notice_after_sleeps=1)
    fake.failures["Take"] = [UNAVAILABLE] * 5
    with pytest.raises(Preempted) as err:
        client.take(4, current_version=0, max_staleness=0, wait_s=5.0)
    assert not isinstance(err.value, LostStep)  # nothing of the step was trained yet
    assert str(err.value) == "stopped while waiting for rollouts"
    assert clock.slept == pytest.approx([0.2])  # the failure after the notice was not waited out


def test_after_a_notice_a_failed_call_mid_step_loses_the_step():
    client, fake, preemption, clock = trainer_client()
    preemption.notify("test notice")
    fake.failures["Push"] = [UNAVAILABLE]
    with pytest.raises(LostStep, match=r"^Push failed after the notice \(UNAVAILABLE\)$"):
        client.push(None, {}, 3)
    assert clock.slept == []


def test_a_take_is_not_even_tried_after_a_notice():
    client, fake, preemption, _ = trainer_client()
    preemption.notify("test notice")
    with pytest.raises(Preempted):
        client.take(4, current_version=0, max_staleness=0)
    assert fake.takes == 0


def test_before_a_take_is_repeated_the_other_open_takes_are_released():
    client, fake, _, _ = trainer_client()
    held, _, _ = client.take(4, current_version=0, max_staleness=0)
    fake.failures["Take"] = [UNAVAILABLE, UNAVAILABLE]
    client.take(4, current_version=0, max_staleness=0)
    assert fake.released == [[held], [held]]  # before each repeat, keeping the take it holds
    client.ack(held)
    fake.failures["Take"] = [UNAVAILABLE]
    client.take(4, current_version=0, max_staleness=0)
    assert fake.released[-1] == ["t2"]  # the acknowledged take is no longer held


def test_a_push_refused_as_done_after_a_retry_counts_once_the_version_is_served():
    client, fake, _, _ = trainer_client()
    fake.failures["Push"] = [UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION]
    fake.version = 5  # the first try got through before the connection broke
    reply = client.push(None, {}, 5)
    assert (reply.version, reply.committed) == (5, True)
    fake.failures["Push"] = [UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION]
    with pytest.raises(grpc.RpcError):  # refused, and the server does not serve version 6
        client.push(None, {}, 6)
    fake.failures["Push"] = [grpc.StatusCode.FAILED_PRECONDITION]
    with pytest.raises(grpc.RpcError):  # refused at the first try: a real refusal
        client.push(None, {}, 5)
