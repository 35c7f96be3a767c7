"""The red team's leftover class: a run's leftover process tries to answer a later case.

Problem ``sum_stdin`` (two stdin/stdout cases, hidden from the program). Each
program answers the first case itself, leaves something behind, and answers
the second case *only* through the leftover: its own second case prints
nothing (or a wrong number, after the leftover had time to speak first). The
leftover learns the second case's input by reading the later case's fd 0
through ``/proc`` and answers it through the later case's fd 1, the harness's
outputs channel (fd 3 through ``/proc``), or every descriptor it can open.
So a program scores 1 exactly when a leftover reached a later case. Read by
``test_leftovers.py``.
"""

from __future__ import annotations

HEAD = """import json, os, signal, sys, time
def answer(text):
    return str(sum(map(int, text.split())))
def input_of(pid):
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY)
    try:
        return os.pread(fd, 1 << 16, 0).decode()
    finally:
        os.close(fd)
def pids(skip):
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in skip]
def detach(new_session=True):
    if os.fork():
        return False
    if new_session:
        os.setsid()
    if os.fork():
        os._exit(0)
    return True
def write_to(path, text):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, text.encode())
        os.close(fd)
        return True
    except OSError:
        return False
def later_cases(seen, skip):
    for pid in pids(skip | seen | {os.getpid(), 1}):
        try:
            text = input_of(pid)
        except OSError:
            continue
        if text.strip():
            seen.add(pid)
            yield pid, text
HARNESS = os.getppid()
data = sys.stdin.read()
first = not os.path.exists("first-case-done")
if first:
    open("first-case-done", "w").close()
    print(answer(data))
    sys.stdout.flush()
"""
# The later case's own part: nothing, or a wrong number once the leftover had time.
SILENT = "if not first:\n    time.sleep(0.6)\n"
WRONG_LATE = "if not first:\n    time.sleep(0.6)\n    print(0)\n"

INTO_STDOUT = """    for pid, text in later_cases(seen, set()):
        write_to(f"/proc/{pid}/fd/1", answer(text) + "\\n")
"""
INTO_CHANNEL = """    for pid, text in later_cases(seen_channel, {HARNESS}):
        line = json.dumps({"i": 1, "stdout": answer(text)}) + "\\n"
        write_to(f"/proc/{HARNESS}/fd/3", line)
"""
EVERYWHERE = """    for pid, text in later_cases(seen, {HARNESS}):
        line = json.dumps({"i": 1, "stdout": answer(text)}) + "\\n"
        for owner in (pid, HARNESS):
            for fd in range(64):
                write_to(f"/proc/{owner}/fd/{fd}", line if owner == HARNESS else answer(text))
"""


def loop(body: str, seconds: float = 2.5, refork: bool = False) -> str:
    """A leftover's main loop: ``body`` every 5 ms for ``seconds`` (``refork``: each
    round in a fresh process, the old one exiting, so its pid keeps changing)."""
    step = "    if os.fork():\n        os._exit(0)\n" if refork else ""
    return (
        "    seen, seen_channel, end = set(), set(), time.time() + {s}\n"
        "    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
        "        signal.signal(sig, signal.SIG_IGN)\n"
        "    while time.time() < end:\n{body}{step}        time.sleep(0.005)\n"
        "    os._exit(0)\n"
    ).format(s=seconds, body="".join("    " + line + "\n" for line in body.splitlines()), step=step)


def _program(leftover: str, later: str, how: str = "if first and detach():\n") -> str:
    return HEAD + how + leftover + later


# name -> source; every one answers the second case only through a leftover
LEFTOVERS: dict[str, str] = {
    "daemon writes into the next case's stdout": _program(loop(INTO_STDOUT), SILENT),
    "daemon writes the next case's line to the outputs channel": _program(
        loop(INTO_CHANNEL), WRONG_LATE
    ),
    "daemon writes to every descriptor of every process": _program(loop(EVERYWHERE), SILENT),
    "a chain of forks, a new pid each round": _program(
        loop(INTO_STDOUT + INTO_CHANNEL, refork=True), SILENT
    ),
    "stays in the case's own process group": _program(
        loop(INTO_STDOUT + INTO_CHANNEL), SILENT, "if first and detach(new_session=False):\n"
    ),
    "several leftovers in several sessions": _program(
        "    for _ in range(3):\n        if not detach():\n            continue\n"
        + loop(INTO_STDOUT + INTO_CHANNEL)
        .replace("\n    ", "\n        ")
        .replace("    seen", "        seen", 1),
        SILENT,
        "if first:\n",
    ),
}
