"""The ``code`` reward: run the completion's program against the task's tests.

The program is the last fenced code block of the completion (the whole text
if it has none). The tests are the prompt's ``answer``:

- a list of assert statements (MBPP / HumanEval style), or one test script;
- ``{"asserts": [...], "setup": "..."}``;
- ``{"stdio": [[stdin, expected stdout], ...]}`` or
  ``{"inputs": [...], "outputs": [...]}`` (competitive-programming style).

Every run is sandboxed (:mod:`rlax.plugins.rewards.code_sandbox`); the verdict
is the harness's, never the program's output. The reason says when the
network could not be cut off.
"""

from __future__ import annotations

import re
from typing import Any

from rlax.core import hookimpl
from rlax.core.types import Prompt, RewardResult
from rlax.plugins.rewards.code_sandbox import Limits, SandboxResult, run_python_tests

__all__ = ["CodeReward", "extract_code", "read_tests"]

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block of ``text`` (a Python one if any), else all of it."""
    blocks = _FENCE.findall(text)
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    if python or blocks:
        return (python or [code for _, code in blocks])[-1]
    return text


def read_tests(answer: Any) -> dict[str, Any]:
    """The harness's test spec from a task's ``answer`` field.

    Raises:
      ValueError: the answer is not one of the documented shapes.
    """
    if isinstance(answer, str):
        return {"asserts": [answer]}
    if isinstance(answer, list | tuple) and all(isinstance(t, str) for t in answer):
        return {"asserts": list(answer)}
    if isinstance(answer, dict):
        if "stdio" in answer:
            return {"stdio": [[str(i), str(o)] for i, o in answer["stdio"]]}
        if "inputs" in answer and "outputs" in answer:
            return {
                "stdio": [[str(i), str(o)] for i, o in zip(answer["inputs"], answer["outputs"])]
            }
        tests = answer.get("asserts", answer.get("tests"))
        if tests is not None:
            spec = read_tests(tests)
            return spec | ({"setup": str(answer["setup"])} if answer.get("setup") else {})
    raise ValueError(
        f"code reward: cannot read tests from an answer of type {type(answer).__name__}"
    )


class CodeReward:
    """1.0 when the program passes every test (or the passed fraction with ``partial_credit``).

    Args:
      cpu_s: CPU seconds per process.
      wall_s: wall-clock seconds per run.
      memory_mb: address space per process.
      file_mb: largest file the program may write.
      processes: processes the program may have at once.
      partial_credit: score passed / total instead of all-or-nothing.
      namespaces: isolate with Linux namespaces where the OS allows.
    """

    def __init__(
        self,
        *,
        cpu_s: int = 5,
        wall_s: float = 10.0,
        memory_mb: int = 512,
        file_mb: int = 16,
        processes: int = 16,
        partial_credit: bool = False,
        namespaces: bool = True,
    ) -> None:
        self.limits = Limits(
            cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb, file_mb=file_mb, processes=processes
        )
        self.partial_credit = partial_credit
        self.namespaces = namespaces

    def run(self, prompt: Prompt, completion_text: str) -> SandboxResult:
        """The sandboxed run behind :meth:`score`."""
        return run_python_tests(
            extract_code(completion_text),
            read_tests(prompt.answer),
            limits=self.limits,
            namespaces=self.namespaces,
        )

    def score(self, prompt: Prompt, completion_text: str) -> RewardResult:
        return self.judge(self.run(prompt, completion_text))

    def judge(self, result: SandboxResult) -> RewardResult:
        """The reward of a sandboxed run: from the harness's verdict only."""
        if result.status in ("passed", "failed"):
            value = 1.0 if result.status == "passed" else 0.0
            if self.partial_credit and result.total:
                value = result.passed / result.total
            reason = f"{result.status} {result.passed}/{result.total}"
            reason += f": {result.detail}" if result.detail else ""
        else:
            value, reason = 0.0, f"{result.status}: {result.detail}"
        if not result.network_isolated:
            why = result.isolation.get("network_reason", "unknown")
            reason += f" [network NOT isolated: {why}]"
        return RewardResult(value, reason)


@hookimpl
def rlax_register_rewards():
    return {"code": CodeReward}
