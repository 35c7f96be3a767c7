"""A solution run against a :class:`~rlax.plugins.rewards.code.plan.TestPlan` in the sandbox.

:func:`run_tests` sends only the tests' inputs into the sandbox
(:func:`~rlax.plugins.rewards.sandbox.run.run_sandboxed`; on the harness's
stdin, nothing written to a file on this side); the harness (``harness.py``,
copied into the sandbox's work dir) sends back the outputs, and
:mod:`rlax.plugins.rewards.code.verdict` compares them here, in the calling
process, with the expected outputs, which never leave it. The run and the
judging end by the call's deadline (``wall_s + GRACE_S``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from typing import Any

from rlax.plugins.rewards.code.plan import CallTest, StdioTest, TestPlan, plan_tests
from rlax.plugins.rewards.code.values import encode
from rlax.plugins.rewards.code.verdict import judge, judge_weak
from rlax.plugins.rewards.sandbox.interpreter import python_for_sandbox
from rlax.plugins.rewards.sandbox.records import Limits, SandboxResult
from rlax.plugins.rewards.sandbox.run import DEFAULT_LIMITS, GRACE_S, run_sandboxed

__all__ = ["GRACE_S", "Limits", "SandboxResult", "run_python_tests", "run_tests"]

HARNESS = pathlib.Path(__file__).resolve().parent / "harness.py"


def _job(plan: TestPlan, nonce: str) -> dict[str, Any]:
    """What the harness gets: inputs only, never an expected output."""
    if plan.mode == "stdio":
        return {
            "mode": "stdio",
            "inputs": [t.stdin for t in plan.tests if isinstance(t, StdioTest)],
        }
    if plan.mode == "call":
        calls = [
            [t.function, encode(list(t.args)), encode(t.kwargs)]
            for t in plan.tests
            if isinstance(t, CallTest)
        ]
        return {"mode": "call", "calls": calls, "setup": plan.setup}
    return {"mode": "asserts", "asserts": list(plan.asserts), "setup": plan.setup, "nonce": nonce}


def run_tests(
    solution: str,
    plan: TestPlan,
    *,
    limits: Limits = DEFAULT_LIMITS,
    namespaces: bool = True,
    allow_weak_isolation: bool = False,
    deadline: float | None = None,
) -> SandboxResult:
    """Runs ``solution`` on ``plan``'s inputs in the sandbox; judges its outputs here.

    The run and the judging both end by ``deadline`` (a ``time.monotonic()``;
    default ``limits.wall_s + GRACE_S`` from now): past it the result is a
    ``"timeout"``, whatever the program sent.
    """
    if deadline is None:
        deadline = time.monotonic() + limits.wall_s + GRACE_S
    nonce = os.urandom(16).hex()
    run = run_sandboxed(
        {"harness.py": HARNESS.read_text(), "solution.py": solution},
        [python_for_sandbox(), "-I", "-S", "-B", "harness.py"],
        stdin=json.dumps(_job(plan, nonce)) + "\n",
        limits=limits,
        namespaces=namespaces,
        allow_weak_isolation=allow_weak_isolation,
        deadline=deadline,
    )
    if run.status != "finished":
        return run
    if plan.weak:
        verdict = judge_weak(plan, run.channel, nonce)
        answered = verdict is not None
    else:
        verdict = judge(plan, run.channel, deadline)
        answered = verdict.answered > 0
        if verdict.late:
            detail = "the call's deadline passed while judging the program's outputs"
            return dataclasses.replace(run, status="timeout", detail=detail)
    by = "program" if plan.weak else "supervisor"
    if verdict is None or not answered:
        how = f"killed by signal {run.signal}" if run.signal else f"exit status {run.returncode}"
        detail = f"no output for any test ({how})"
        return dataclasses.replace(run, status="no_verdict", detail=detail, verdict_by=by)
    status = "passed" if verdict.total > 0 and verdict.passed == verdict.total else "failed"
    return dataclasses.replace(
        run,
        status=status,
        passed=verdict.passed,
        total=verdict.total,
        detail=verdict.failure,
        verdict_by=by,
    )


def run_python_tests(
    solution: str,
    tests: dict[str, Any],
    *,
    limits: Limits = DEFAULT_LIMITS,
    namespaces: bool = True,
    allow_weak_isolation: bool = False,
) -> SandboxResult:
    """Runs ``solution`` against a ``read_tests`` spec (weak asserts run as asked)."""
    return run_tests(
        solution,
        plan_tests(tests),
        limits=limits,
        namespaces=namespaces,
        allow_weak_isolation=allow_weak_isolation,
    )
