"""Scoring completions in a pool of worker processes with a hard per-call timeout.

A verifier is code run on the policy's output: it can hang (sympy on
``9^{9^{9^9}}``), crash its interpreter, or be steered into doing so. Every
call therefore runs in a worker process, and the parent enforces the deadline
by killing the worker's whole process group and starting a fresh worker. A
call that raises, crashes its worker, returns a non-finite score or runs past
``timeout_s`` scores 0, is counted, and says why; the run goes on::

    pool = RewardPool(MathReward(), workers=4, timeout_s=5.0)
    result = pool.score(prompts, texts)      # one prompt per text
    result.scores                            # float32 [B]; 0 where a call failed
    result.errors, result.timeouts           # counts of failed calls
    result.reasons[i]                        # the verifier's reason, or the failure
    pool.close()

Workers start from a clean process (``forkserver``, not ``fork``: the caller
may be a multithreaded JAX process), receive the reward pickled once, and
serve calls until closed. ``workers=0`` scores in the calling process instead
(for debugging): exceptions are still contained, timeouts are not enforced.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
import weakref
from collections.abc import Sequence
from typing import Any, Self

import numpy as np

from rlax.core.types import Prompt, RewardResult

__all__ = ["PoolScores", "RewardPool", "score_one"]


@dataclasses.dataclass(frozen=True)
class PoolScores:
    """The outcome of :meth:`RewardPool.score` for N completions.

    Attributes:
      scores: float32 [B], the reward of each completion; 0 where its call failed.
      reasons: N strings: the reward's reason, or why the call failed.
      failed: bool [B], True where the call raised, crashed, timed out or
        returned a non-finite score.
      errors: calls that raised, crashed their worker or returned a bad value.
      timeouts: calls killed at the deadline, and calls that raised ``TimeoutError``
        (a reward's own deadline, e.g. ``rewards.judge``'s).
    """

    scores: np.ndarray
    reasons: list[str]
    failed: np.ndarray
    errors: int
    timeouts: int


def score_one(reward: Any, prompt: Prompt, text: str) -> tuple[float, str]:
    """Calls ``reward.score`` and returns ``(finite score, reason)``.

    Raises:
      ValueError: the reward returned something that is not a finite number.
    """
    result = reward.score(prompt, text)
    if isinstance(result, RewardResult):
        value, reason = result.score, result.reason
    else:
        value, reason = result, ""
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{type(reward).__name__} returned a non-finite score {value}")
    return value, reason


def _timed_out(exc: TimeoutError) -> str:
    return f"timed out: {type(exc).__name__}: {exc}"


def _worker_main(conn: Any, reward_bytes: bytes, sys_path: list[str]) -> None:
    """A worker: load the reward, say ready, then answer calls until told to stop.

    A parent that has gone (it exited on a config error while this one was
    still loading) ends the worker quietly: a broken pipe is not an error here.
    """
    os.setsid()  # its own process group: the parent kills it and all it spawned at once
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sys.path[:] = sys_path
    try:
        _serve(conn, reward_bytes)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return


def _serve(conn: Any, reward_bytes: bytes) -> None:
    try:
        reward = pickle.loads(reward_bytes)
    except BaseException as exc:  # noqa: BLE001 -- report any load failure to the parent
        conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while (message := conn.recv()) is not None:
        index, prompt, text = message
        try:
            value, reason = score_one(reward, prompt, text)
        except TimeoutError as exc:  # the reward's own deadline (e.g. rewards.judge's)
            conn.send(("timeout", index, _timed_out(exc)))
        except BaseException as exc:  # noqa: BLE001 -- a verifier failure is a counted 0
            conn.send(("error", index, f"{type(exc).__name__}: {exc}"))
        else:
            conn.send(("ok", index, value, reason))


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, reward_bytes: bytes, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.conn: multiprocessing.connection.Connection
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_worker_main, args=(child, reward_bytes, list(sys.path)), daemon=True
        )
        self.process.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        # Calls sent and not answered yet, oldest first; the worker runs them in
        # order, so the oldest is the one running, since ``head_since``.
        self.tasks: collections.deque[int] = collections.deque()
        self.head_since = 0.0

    @property
    def deadline(self) -> float:
        return self.head_since + self.timeout_s

    @property
    def busy(self) -> bool:
        return bool(self.tasks)

    def kill(self) -> None:
        pid = self.process.pid
        if pid is not None and self.process.is_alive():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


def _kill_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.kill()


class RewardPool:
    """A pool of processes that score completions with one reward, each call bounded.

    Args:
      reward: an object with ``score(prompt, completion_text) -> float |
        RewardResult``; it must be picklable (gin-built plugin objects are).
      workers: number of worker processes; 0 scores in the calling process
        (no timeout enforcement, for debugging).
      timeout_s: wall-clock limit of one call; past it the worker and every
        process it started are killed, the call scores 0 and counts as a timeout.
      start_timeout_s: how long a worker may take to start and load the reward.
      start_method: the multiprocessing start method (``forkserver`` by default;
        ``spawn`` also works; ``fork`` is unsafe in a process running JAX).
      prefetch: calls queued at a worker at once, so fast verifiers do not wait
        on a round trip per call; each call still gets its own ``timeout_s``,
        counted from when the worker reaches it, and the calls queued behind a
        killed one are handed out again.

    Raises:
      RuntimeError: a worker could not load the reward (it is not picklable,
        or its module cannot be imported in a fresh process).
    """

    def __init__(
        self,
        reward: Any,
        *,
        workers: int = 2,
        timeout_s: float = 10.0,
        start_timeout_s: float = 120.0,
        start_method: str = "forkserver",
        prefetch: int = 4,
    ) -> None:
        if workers < 0:
            raise ValueError(f"RewardPool: workers must be >= 0, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"RewardPool: timeout_s must be > 0, got {timeout_s}")
        self.reward = reward
        if prefetch < 1:
            raise ValueError(f"RewardPool: prefetch must be >= 1, got {prefetch}")
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.prefetch = prefetch
        self.restarts = 0
        self._workers: list[_Worker] = []
        self._closed = False
        if workers == 0:
            return
        self._ctx = multiprocessing.get_context(start_method)
        try:
            self._reward_bytes = pickle.dumps(reward)
        except Exception as exc:
            raise RuntimeError(f"RewardPool: the reward cannot be pickled: {exc}") from exc
        self._workers = [
            _Worker(self._ctx, self._reward_bytes, self.timeout_s) for _ in range(workers)
        ]
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)
        self._wait_ready()

    @property
    def workers(self) -> int:
        """The number of worker processes (0: scoring in-process)."""
        return len(self._workers)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not all(w.ready for w in self._workers):
            waiting = [w for w in self._workers if not w.ready]
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise RuntimeError(f"RewardPool: workers did not start in {self.start_timeout_s}s")
            for conn in multiprocessing.connection.wait([w.conn for w in waiting], timeout=left):
                worker = next(w for w in waiting if w.conn is conn)
                try:
                    kind, detail = worker.conn.recv()
                except EOFError:
                    kind, detail = "init_error", f"exit code {worker.process.exitcode}"
                if kind != "ready":
                    self.close()
                    raise RuntimeError(f"RewardPool: a worker could not load the reward: {detail}")
                worker.ready = True

    def score(self, prompts: Sequence[Prompt], texts: Sequence[str]) -> PoolScores:
        """Scores ``texts[i]`` as a completion of ``prompts[i]`` for every i.

        Never raises because of the reward: every failed call is a 0 with a reason.

        Raises:
          ValueError: ``prompts`` and ``texts`` differ in length.
          RuntimeError: the pool is closed.
        """
        if len(prompts) != len(texts):
            raise ValueError(f"RewardPool.score: {len(prompts)} prompts but {len(texts)} texts")
        if self._closed:
            raise RuntimeError("RewardPool.score: the pool is closed")
        state = _Tally(len(texts))
        if not self._workers:
            for i, (prompt, text) in enumerate(zip(prompts, texts)):
                try:
                    state.ok(i, *score_one(self.reward, prompt, text))
                except TimeoutError as exc:
                    state.timeout(i, _timed_out(exc))
                except Exception as exc:  # noqa: BLE001 -- a verifier failure is a counted 0
                    state.error(i, f"{type(exc).__name__}: {exc}")
            return state.result()
        pending = collections.deque(range(len(texts)))
        while pending or any(w.busy for w in self._workers):
            self._dispatch(pending, prompts, texts)
            self._collect(state, pending)
            self._enforce_deadlines(state, pending)
        return state.result()

    def _dispatch(self, pending: collections.deque, prompts, texts) -> None:
        for worker in self._workers:
            while pending and worker.ready and len(worker.tasks) < self.prefetch:
                index = pending.popleft()
                try:
                    worker.conn.send((index, prompts[index], texts[index]))
                except (BrokenPipeError, OSError):
                    pending.appendleft(index)
                    if not worker.tasks:  # died idle: nothing of its own to account for
                        self._replace(worker, pending)
                    # Died on a call it holds: _collect reads what it answered before the
                    # end of its pipe, counts the call it died on as the crash and replaces
                    # it (replacing here would hand that call out again, to crash again).
                    break
                if not worker.tasks:
                    worker.head_since = time.monotonic()
                worker.tasks.append(index)

    def _collect(self, state: _Tally, pending: collections.deque) -> None:
        live = [w for w in self._workers if w.busy or not w.ready]
        deadlines = [w.deadline for w in live if w.busy]
        wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.05
        for conn in multiprocessing.connection.wait([w.conn for w in live], timeout=wait_s):
            worker = next(w for w in live if w.conn is conn)
            while worker in self._workers and worker.conn.poll():
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):
                    if worker.busy:
                        worker.process.join(timeout=1)
                        code = worker.process.exitcode
                        state.error(worker.tasks.popleft(), f"worker crashed (exit code {code})")
                    self._replace(worker, pending)
                    break
                self._handle(worker, message, state, pending)

    def _handle(self, worker: _Worker, message: tuple, state: _Tally, pending) -> None:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
            return
        if kind == "init_error":  # a restarted worker: the reward loaded before, so retry
            self._replace(worker, pending)
            return
        worker.tasks.popleft()
        worker.head_since = time.monotonic()
        if kind == "ok":
            state.ok(message[1], message[2], message[3])
        elif kind == "timeout":
            state.timeout(message[1], message[2])
        else:
            state.error(message[1], message[2])

    def _enforce_deadlines(self, state: _Tally, pending: collections.deque) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.busy and now >= worker.deadline:
                index = worker.tasks.popleft()
                state.timeout(index, f"timed out after {self.timeout_s:g}s (worker killed)")
                self._replace(worker, pending)
            elif not worker.ready and now - worker.started > self.start_timeout_s:
                self._replace(worker, pending)

    def _replace(self, worker: _Worker, pending: collections.deque) -> None:
        """Kills ``worker`` (and all it started); its queued calls go back to ``pending``."""
        worker.kill()
        pending.extendleft(reversed(worker.tasks))
        worker.tasks.clear()
        fresh = _Worker(self._ctx, self._reward_bytes, self.timeout_s)
        self._workers[self._workers.index(worker)] = fresh
        self.restarts += 1

    def close(self) -> None:
        """Stops the workers (killing any still busy); idempotent."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 2.0
        for worker in self._workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            worker.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Tally:
    """Accumulates one :meth:`RewardPool.score` call's results."""

    def __init__(self, n: int) -> None:
        self.scores = np.zeros(n, np.float32)
        self.reasons = [""] * n
        self.failed = np.zeros(n, bool)
        self.errors = 0
        self.timeouts = 0

    def ok(self, index: int, value: float, reason: str) -> None:
        if not np.isfinite(value):
            self.error(index, f"non-finite score {value}")
            return
        self.scores[index] = value
        self.reasons[index] = reason

    def error(self, index: int, reason: str) -> None:
        self.failed[index] = True
        self.errors += 1
        self.reasons[index] = f"error: {reason}"

    def timeout(self, index: int, reason: str) -> None:
        self.failed[index] = True
        self.timeouts += 1
        self.reasons[index] = reason

    def result(self) -> PoolScores:
        return PoolScores(self.scores, self.reasons, self.failed, self.errors, self.timeouts)
