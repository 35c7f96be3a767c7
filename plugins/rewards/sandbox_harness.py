"""The test harness that runs inside the sandbox, as the unprivileged program.

Standard library only; copied into the sandbox's work dir as ``harness.py``
next to ``solution.py`` and ``tests.json`` and run with ``python -I -S``. It
reads the run's nonce from stdin *before* any untrusted code runs, then
executes the solution and the tests and writes one verdict line, tagged with
the nonce, to fd 3. A solution that exits early, crashes, or prints "all tests
passed" leaves no valid verdict and scores nothing.

``tests.json`` is either ``{"asserts": [code, ...], "setup": code}`` (each
entry runs after the solution, in its namespace; it passes if it raises
nothing) or ``{"stdio": [[stdin, expected stdout], ...]}`` (the solution runs
as ``__main__`` once per case; stdout is compared line by line, trailing
whitespace ignored).
"""

import io
import json
import os
import sys


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200] if str(exc) else type(exc).__name__


def _run_asserts(source: str, tests: dict) -> tuple[int, int, str]:
    namespace = {"__name__": "solution"}
    exec(compile(source, "solution.py", "exec"), namespace)  # noqa: S102
    if tests.get("setup"):
        exec(compile(tests["setup"], "setup", "exec"), namespace)  # noqa: S102
    passed, failure = 0, ""
    for i, test in enumerate(tests["asserts"]):
        try:
            exec(compile(test, f"test {i}", "exec"), namespace)  # noqa: S102
            passed += 1
        except Exception as exc:  # noqa: BLE001 -- a failing test is a result
            failure = failure or f"test {i}: {_first_line(exc)}"
    return passed, len(tests["asserts"]), failure


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _run_stdio(source: str, tests: dict) -> tuple[int, int, str]:
    code = compile(source, "solution.py", "exec")
    passed, failure = 0, ""
    real_stdin, real_stdout = sys.stdin, sys.stdout
    for i, (given, expected) in enumerate(tests["stdio"]):
        sys.stdin, sys.stdout = io.StringIO(given), io.StringIO()
        try:
            exec(code, {"__name__": "__main__"})  # noqa: S102
            output = sys.stdout.getvalue()
        except Exception as exc:  # noqa: BLE001 -- a failing case is a result
            output, failure = None, failure or f"case {i}: {_first_line(exc)}"
        finally:
            sys.stdin, sys.stdout = real_stdin, real_stdout
        if output is not None and _lines(output) == _lines(expected):
            passed += 1
        elif output is not None:
            failure = failure or f"case {i}: wrong output"
    return passed, len(tests["stdio"]), failure


def main() -> None:
    nonce = sys.stdin.readline().strip()
    sys.stdin = open(os.devnull)  # noqa: SIM115 -- replaces the nonce pipe for the program
    with open("solution.py", encoding="utf-8") as f:
        source = f.read()
    with open("tests.json", encoding="utf-8") as f:
        tests = json.load(f)
    try:
        run = _run_stdio if "stdio" in tests else _run_asserts
        passed, total, failure = run(source, tests)
    except BaseException as exc:  # noqa: BLE001 -- SystemExit included: exiting early fails
        total = len(tests.get("stdio") or tests.get("asserts") or ())
        passed, failure = 0, f"solution: {_first_line(exc)}"
    verdict = {"nonce": nonce, "passed": passed, "total": total, "failure": failure}
    os.write(3, (json.dumps(verdict) + "\n").encode())
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
