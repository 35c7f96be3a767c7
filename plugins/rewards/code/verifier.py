"""The ``code`` reward: run the completion's program against the task's tests.

The program is the last fenced code block of the completion (the whole text
if it has none). The tests are the prompt's ``answer``, in any shape that
:func:`~rlax.plugins.rewards.code.plan.read_tests` reads: call-style
(function, arguments, expected value), stdin/stdout pairs, or assert
statements (MBPP / HumanEval style).

Every run is sandboxed (:mod:`rlax.plugins.rewards.sandbox.run`): only the
tests' inputs enter the sandbox, the program's outputs come back in a typed
format, and the comparison and the count happen outside it, so a program can
pass only by computing the right outputs. Assert statements are converted to
call tests where they compare a call with a literal
(:func:`~rlax.plugins.rewards.code.plan.plan_tests`); a test set with any
other assert can only be judged inside the program's interpreter, where the
program can forge the verdict, so it is refused (a ``ValueError`` naming the
setting) unless ``allow_weak_tests=True``, and its reason then says
``[weak: ...]``. The reason also says when the network was not cut off.

Every call of :meth:`CodeReward.score` (in a reward pool, directly, in a tool
environment, in evaluation) is bounded by its own deadline, ``wall_s`` plus
``sandbox.run.GRACE_S``: the sandbox is killed there, and judging the
program's outputs, bounded in size, depth and work by ``code/verdict.py``,
stops there too (a ``timeout``, scored 0).
"""

from __future__ import annotations

import re
from typing import Annotated

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, Positive
from rlax.core.types import Prompt, RewardResult
from rlax.plugins.rewards.code.plan import plan_tests, read_tests
from rlax.plugins.rewards.code.sandboxed import Limits, SandboxResult, run_tests

__all__ = ["CodeReward", "extract_code", "read_tests"]

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block of ``text`` (a Python one if any), else all of it."""
    blocks = _FENCE.findall(text)
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    if python or blocks:
        return (python or [code for _, code in blocks])[-1]
    return text


class CodeReward:
    """1.0 when the program passes every test (or the passed fraction with ``partial_credit``).

    Args:
      cpu_s: CPU seconds per process.
      wall_s: wall-clock seconds per run.
      memory_mb: address space per process.
      file_mb: largest file the program may write.
      processes: processes the program may have at once.
      run_memory_mb: memory of the whole run, every process together, mapped or
        not (the run's cgroup, where one can be had; see ``sandbox/run.py``).
      partial_credit: score passed / total instead of all-or-nothing.
      namespaces: isolate with namespaces and the minimal world (False: the
        weak mode, warned once per process).
      allow_weak_isolation: where the kernel refuses namespaces, run in the
        weak mode (warned) instead of scoring 0 with an ``error`` reason.
      allow_weak_tests: accept assert tests that cannot be converted to call
        tests, judged inside the program (forgeable) instead of refusing them.
    """

    def __init__(
        self,
        *,
        cpu_s: Annotated[int, AtLeast(1)] = 5,
        wall_s: Annotated[float, Positive] = 10.0,
        memory_mb: Annotated[int, AtLeast(1)] = 512,
        file_mb: Annotated[int, AtLeast(1)] = 16,
        processes: Annotated[int, AtLeast(1)] = 16,
        run_memory_mb: Annotated[int, AtLeast(1)] = 1024,
        partial_credit: bool = False,
        namespaces: bool = True,
        allow_weak_isolation: bool = False,
        allow_weak_tests: bool = False,
    ) -> None:
        self.limits = Limits(
            cpu_s=cpu_s,
            wall_s=wall_s,
            memory_mb=memory_mb,
            file_mb=file_mb,
            processes=processes,
            run_memory_mb=run_memory_mb,
        )
        self.partial_credit = partial_credit
        self.namespaces = namespaces
        self.allow_weak_isolation = allow_weak_isolation
        self.allow_weak_tests = allow_weak_tests

    def run(self, prompt: Prompt, completion_text: str) -> SandboxResult:
        """The sandboxed run behind :meth:`score`.

        Raises:
          ValueError: the tests cannot be read, or need the weak asserts mode
            and ``allow_weak_tests`` is off.
        """
        plan = plan_tests(read_tests(prompt.answer))
        if plan.weak and not self.allow_weak_tests:
            raise ValueError(
                f"code reward: prompt {prompt.id!r} has assert tests that do not compare a call "
                "with a literal; they can only run inside the program, which can forge them. "
                "Rewrite them as call tests ({'calls': [...]}) or set allow_weak_tests=True"
            )
        return run_tests(
            extract_code(completion_text),
            plan,
            limits=self.limits,
            namespaces=self.namespaces,
            allow_weak_isolation=self.allow_weak_isolation,
        )

    def score(self, prompt: Prompt, completion_text: str) -> RewardResult:
        return self.judge(self.run(prompt, completion_text))

    def judge(self, result: SandboxResult) -> RewardResult:
        """The reward of a sandboxed run: from the trusted side's count only."""
        if result.status in ("passed", "failed"):
            value = 1.0 if result.status == "passed" else 0.0
            if self.partial_credit and result.total:
                value = result.passed / result.total
            reason = f"{result.status} {result.passed}/{result.total}"
            reason += f": {result.detail}" if result.detail else ""
        else:
            value, reason = 0.0, f"{result.status}: {result.detail}"
        if result.verdict_by == "program":
            reason += " [weak: assert tests judged inside the program]"
        if not result.network_isolated:
            why = result.isolation.get("network_reason", "unknown")
            reason += f" [network NOT isolated: {why}]"
        return RewardResult(value, reason)


@hookimpl
def rlax_register_rewards():
    return {"code": CodeReward}
