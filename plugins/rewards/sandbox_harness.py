"""The harness that runs inside the sandbox, as the unprivileged program.

Standard library only; copied into the sandbox's work dir as ``harness.py``
next to ``solution.py`` and run with ``python -I -S -B``. It reads one JSON
job from stdin *before* any untrusted code runs, then only computes: it runs
the solution on the job's inputs and writes each output to fd 3, one JSON line
per test, ``{"i": index, "value": tagged value}`` (call-style; the tagged
format is ``sandbox_values.py``'s), ``{"i": index, "stdout": text}``
(stdin/stdout) or ``{"i": index, "error": text}``. It decides nothing: the job
holds no expected output, and the trusted side compares what it received.
This file shares the interpreter with the program, which may replace any of
its functions; that gains the program nothing but the power to send other
outputs, which it had anyway.

Jobs (see ``code_tests.py`` for where they come from):

- ``{"mode": "call", "calls": [[function, args, kwargs], ...], "setup": code}``:
  the solution runs once as module ``solution``, then each call;
- ``{"mode": "stdio", "inputs": [text, ...]}``: the solution runs as
  ``__main__`` once per input, with that stdin; a ``SystemExit`` ends a case
  normally (competitive programs call ``exit()``);
- ``{"mode": "asserts", "asserts": [...], "setup": code, "nonce": hex}``: the
  weak mode, for tests that only the program's interpreter can evaluate: the
  harness runs them and reports ``{"nonce", "passed", "total", "failure"}``,
  a verdict the program can forge.
"""

import io
import json
import os
import sys

CHANNEL = 3
_SEQUENCES = {"tuple": tuple, "set": set, "frozenset": frozenset}


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200] if str(exc) else type(exc).__name__


def _send(message: dict) -> None:
    os.write(CHANNEL, (json.dumps(message) + "\n").encode())


def _encode(value, depth=0):
    """The tagged wire form of ``value``, by exact type (a subclass is refused)."""
    kind = type(value)
    if depth > 64:
        raise TypeError("value nested too deep")
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [_encode(v, depth + 1) for v in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [_encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise TypeError(f"the returned type {kind.__name__} is not a built-in value type")


def _decode(data):
    if type(data) is list:
        return [_decode(v) for v in data]
    if type(data) is dict:
        ((tag, body),) = data.items()
        if tag in _SEQUENCES:
            return _SEQUENCES[tag](_decode(v) for v in body)
        if tag == "dict":
            return {_decode(k): _decode(v) for k, v in body}
        if tag == "bytes":
            return bytes.fromhex(body)
        return complex(*body)
    return data


def _run_calls(source: str, job: dict) -> None:
    namespace: dict = {"__name__": "solution"}
    exec(compile(source, "solution.py", "exec"), namespace)  # noqa: S102
    if job.get("setup"):
        exec(compile(job["setup"], "setup", "exec"), namespace)  # noqa: S102
    calls = [(name, _decode(args), _decode(kwargs)) for name, args, kwargs in job["calls"]]
    for i, (name, args, kwargs) in enumerate(calls):
        try:
            value = namespace[name](*args, **kwargs)
            _send({"i": i, "value": _encode(value)})
        except BaseException as exc:  # noqa: BLE001 -- SystemExit included: a failed test
            _send({"i": i, "error": _first_line(exc)})


def _run_stdio(source: str, job: dict) -> None:
    code = compile(source, "solution.py", "exec")
    real = sys.stdin, sys.stdout
    for i, given in enumerate(job["inputs"]):
        out = io.BytesIO()
        writer = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
        sys.stdin = io.TextIOWrapper(io.BytesIO(given.encode()), encoding="utf-8")
        sys.stdout, error = writer, None
        try:
            exec(code, {"__name__": "__main__"})  # noqa: S102
        except SystemExit:
            pass
        except BaseException as exc:  # noqa: BLE001 -- a failing case is a result
            error = _first_line(exc)
        sys.stdin, sys.stdout = real
        try:
            writer.flush()
            text = out.getvalue().decode("utf-8", "replace")
        except ValueError:  # the program closed its stdout: what it wrote is lost
            text = ""
        _send({"i": i, "error": error} if error else {"i": i, "stdout": text})


def _run_asserts(source: str, job: dict) -> None:
    """The weak mode: the tests run here, the verdict is this harness's word."""
    total, passed, failure = len(job["asserts"]), 0, ""
    try:
        namespace: dict = {"__name__": "solution"}
        exec(compile(source, "solution.py", "exec"), namespace)  # noqa: S102
        if job.get("setup"):
            exec(compile(job["setup"], "setup", "exec"), namespace)  # noqa: S102
        for i, test in enumerate(job["asserts"]):
            try:
                exec(compile(test, f"test {i}", "exec"), namespace)  # noqa: S102
                passed += 1
            except Exception as exc:  # noqa: BLE001 -- a failing test is a result
                failure = failure or f"test {i}: {_first_line(exc)}"
    except BaseException as exc:  # noqa: BLE001 -- SystemExit included: exiting early fails
        passed, failure = 0, f"solution: {_first_line(exc)}"
    _send({"nonce": job["nonce"], "passed": passed, "total": total, "failure": failure})


def main() -> None:
    job = json.loads(sys.stdin.readline())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the job pipe is not the program's
    sys.stdin = open(os.devnull)  # noqa: SIM115
    with open("solution.py", encoding="utf-8") as f:
        source = f.read()
    run = {"call": _run_calls, "stdio": _run_stdio, "asserts": _run_asserts}[job["mode"]]
    try:
        run(source, job)
    except BaseException as exc:  # noqa: BLE001 -- the solution failed to load: no outputs
        os.write(2, f"harness: {_first_line(exc)}\n".encode())
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
