"""The harness that runs inside the sandbox, as the unprivileged program.

Standard library only; copied into the sandbox's work dir as ``harness.py``
next to ``solution.py`` and run with ``python -I -S -B``. It reads one JSON
job from stdin *before* any untrusted code runs, then only computes: it runs
the solution on the job's inputs and writes each output to fd 3, one JSON line
per test, ``{"i": index, "value": tagged value}`` (call-style; the tagged
format is ``code/values.py``'s), ``{"i": index, "stdout": text}``
(stdin/stdout) or ``{"i": index, "error": text}``. It decides nothing: the job
holds no expected output, and the trusted side compares what it received.
This file shares the interpreter with the program, which may replace any of
its functions; that gains the program nothing but the power to send other
outputs, which it had anyway. ``exit`` and ``quit`` are defined as ``site``
would (the harness runs without it).

Tests share no process: after each call (and after loading, before the first)
and after each stdin/stdout case, every other process of the run is killed
and reaped (the harness adopts orphans: the supervisor makes the program a
child subreaper before ``execve``, which keeps that setting; in the run's pid
namespace ``kill(-1)`` reaches them all) before the case's outputs are read
and its line is sent, so nothing a case started writes to the outputs channel
or meets a later case. In stdin/stdout mode the harness runs no untrusted code
and is not dumpable: no case opens its descriptors (the channel, a later
case's input) through ``/proc``.

Jobs (see ``code/plan.py`` for where they come from):

- ``{"mode": "call", "calls": [[function, args, kwargs], ...], "setup": code}``:
  the solution runs once as module ``solution``, then each call;
- ``{"mode": "stdio", "inputs": [text, ...]}``: the solution runs as
  ``__main__`` once per input, each in a fork of the harness whose fd 0 is a
  file holding the input and fd 1 a file the harness reads back (real file
  descriptors: ``open(0)``, ``fileno()``, ``os.write(1, ...)`` work); a
  ``SystemExit`` ends a case normally (competitive programs call ``exit()``);
- ``{"mode": "asserts", "asserts": [...], "setup": code, "nonce": hex}``: the
  weak mode, for tests that only the program's interpreter can evaluate: the
  harness runs them and reports ``{"nonce", "passed", "total", "failure"}``,
  a verdict the program can forge.
"""

import builtins
import json
import os
import signal
import sys

CHANNEL = 3
STDOUT_LIMIT = 4 * 1024 * 1024  # more of one case's stdout than the channel carries is moot
INT_BITS = 256  # a larger int travels as hex: no decimal conversion, no digit limit
_SEQUENCES = {"tuple": tuple, "set": set, "frozenset": frozenset}
PR_SET_DUMPABLE = 4


class _Exit:
    """``exit()`` / ``quit()`` as ``site`` defines them (the harness runs without ``site``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200] if str(exc) else type(exc).__name__


def _send(message: dict) -> None:
    os.write(CHANNEL, (json.dumps(message) + "\n").encode())


def _int(value: int):
    return value if value.bit_length() <= INT_BITS else {"int": format(value, "x")}


def _encode(value, depth=0):
    """The tagged wire form of ``value``.

    A subclass of a built-in type (``Counter``, ``OrderedDict``, a named tuple,
    an ``IntEnum``) is sent as the built-in value it holds, read with the base
    type's own methods: its data, whatever its class says about equality.
    """
    if depth > 64:
        raise TypeError("value nested too deep")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, int):
        return _int(int.__int__(value))
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list | tuple | set | frozenset):
        base = next(k for k in (list, tuple, set, frozenset) if isinstance(value, k))
        iterate = vars(base)["__iter__"]  # the base type's own, not the subclass's override
        items = [_encode(v, depth + 1) for v in iterate(value)]
        return items if base is list else {base.__name__: items}
    if isinstance(value, dict):
        pairs = dict.items(value)
        return {"dict": [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in pairs]}
    if isinstance(value, bytes):
        return {"bytes": bytes.hex(value)}
    if isinstance(value, complex):
        return {"complex": [complex.real.__get__(value), complex.imag.__get__(value)]}
    raise TypeError(f"the returned type {type(value).__name__} is not a built-in value type")


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
        if tag == "int":
            return int(body, 16)
        return complex(*body)
    return data


def _run_calls(source: str, job: dict) -> None:
    namespace: dict = {"__name__": "solution"}
    exec(compile(source, "solution.py", "exec"), namespace)  # noqa: S102
    if job.get("setup"):
        exec(compile(job["setup"], "setup", "exec"), namespace)  # noqa: S102
    calls = [(name, _decode(args), _decode(kwargs)) for name, args, kwargs in job["calls"]]
    _end_case(None)  # every call starts with no process of the program but this one
    for i, (name, args, kwargs) in enumerate(calls):
        try:
            value = namespace[name](*args, **kwargs)
            message = {"i": i, "value": _encode(value)}
        except BaseException as exc:  # noqa: BLE001 -- SystemExit included: a failed test
            message = {"i": i, "error": _first_line(exc)}
        _end_case(None)  # no process the call started lives on into the next one
        _send(message)


def _prctl(option: int, value: int) -> None:
    import ctypes  # here: only the stdio mode needs it (a few ms to import)

    if ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


def _children() -> list[int]:
    """This process's children (the weak mode: the host's /proc, no pid namespace)."""
    me, found = str(os.getpid()), []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except (OSError, ValueError):
            continue
        if stat[stat.rfind(")") + 2 :].split()[1:2] == [me]:
            found.append(int(entry))
    return found


def _end_case(group: int | None) -> None:
    """Kills and reaps every process a case left (its tree: this process adopts orphans).

    In the run's pid namespace (our parent is its init, pid 1) ``kill(-1)`` reaches
    every process there but init and this one; in the weak mode, the case's process
    group and every child of ours, until none is left.
    """
    if os.getppid() == 1:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            while True:
                os.waitpid(-1, 0)
        except ChildProcessError:
            return
    if group is not None:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    while children := _children():
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _scratch(data: bytes) -> tuple[int, int | None]:
    """(fd 0 for a case, the pipe end to feed it or None): a regular file holding ``data``
    at offset 0, unlinked (``os.fstat(0).st_size`` then tells the input's size, as the
    fast-input idiom expects), or a pipe where the file-size limit refuses the file."""
    name = f".rlax-case-{os.getpid()}-{len(data)}"
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(name)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        return fd, None
    except OSError:  # EFBIG / ENOSPC: past the sandbox's file limits
        os.close(fd)
    read, write = os.pipe()
    return read, write


def _case(code, fds: tuple[int, int], report: int) -> None:
    """In a forked child: the program as ``__main__`` with real fds 0 and 1 (never returns)."""
    status = 0
    try:
        os.setpgid(0, 0)
        for target, fd in zip((0, 1), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.close(CHANNEL)  # the harness's channel is not the program's
        for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w")):
            stream = open(fd, mode, encoding="utf-8", closefd=False)  # noqa: SIM115
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        try:
            exec(code, {"__name__": "__main__"})  # noqa: S102
        except SystemExit:
            pass
        except BaseException as exc:  # noqa: BLE001 -- a failing case is a result
            os.write(report, _first_line(exc).encode()[:400])
            status = 1
        for out in (sys.stdout, sys.__stdout__):  # what interpreter exit would flush
            try:
                out.flush()  # type: ignore[union-attr]
            except BaseException:  # noqa: BLE001, S110 -- a closed or replaced stream
                pass
    finally:
        os._exit(status)


def _feed(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:  # the program left without reading it all
        pass
    os.close(fd)


def _read_all(fd: int, limit: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(1 << 20, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _stdio_case(code, given: str) -> dict:
    """One stdin/stdout case in its own process: ``{"stdout": text}`` or ``{"error": why}``."""
    data = given.encode()
    stdin, feed = _scratch(data)
    stdout, _ = _scratch(b"")
    report_read, report = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(report_read)
        if feed is not None:
            os.close(feed)
        _case(code, (stdin, stdout), report)
    for fd in (report, stdin):
        os.close(fd)
    if feed is not None:
        _feed(feed, data)
    _, status = os.waitpid(child, 0)
    _end_case(child)  # before its outputs are read: nothing of the case writes after this
    os.set_blocking(report_read, False)
    try:
        error = os.read(report_read, 4096).decode("utf-8", "replace")
    except BlockingIOError:
        error = ""
    os.close(report_read)
    text = _read_all(stdout, STDOUT_LIMIT).decode("utf-8", "replace")
    os.close(stdout)
    if os.WIFSIGNALED(status):
        error = f"killed by signal {os.WTERMSIG(status)}"
    return {"error": error} if error else {"stdout": text}


def _run_stdio(source: str, job: dict) -> None:
    """Each case runs in a fork of this process, so ``open(0)``, ``sys.stdin.fileno()``,
    ``os.read(0, ...)`` and ``os.write(1, ...)`` reach the case's own input and output,
    and no case sees what an earlier one changed."""
    code = compile(source, "solution.py", "exec")
    # Nothing of a case reads or writes this process's descriptors through /proc (the
    # outputs channel, the next case's input): it is not dumpable, and so are the cases.
    _prctl(PR_SET_DUMPABLE, 0)
    for i, given in enumerate(job["inputs"]):
        try:
            outcome = _stdio_case(code, given)
        except OSError as exc:  # no fork (the process limit), no scratch file
            outcome = {"error": _first_line(exc)}
        _send({"i": i, **outcome})


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
    for name in ("exit", "quit"):
        setattr(builtins, name, _Exit(name))
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
