"""The code sandbox against hostile programs: each contained, scored 0, the run unharmed."""

from __future__ import annotations

import os
import pathlib
import subprocess
import time

import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.rewards.code_sandbox import Limits, run_python_tests
from rlax.plugins.rewards.code_verifier import CodeReward, extract_code, read_tests

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs Linux")

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
GOOD = "def add(a, b):\n    return a + b\n"
SECRET = "hunter2-do-not-leak"

HOSTILE = {
    "infinite loop": GOOD + "while True:\n    pass\n",
    "sleep forever": GOOD + "import time\ntime.sleep(3600)\n",
    "fork bomb": GOOD
    + ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
    "memory blow-up": GOOD + "hog = []\nwhile True:\n    hog.append(bytearray(10**7))\n",
    "huge file": GOOD
    + ("with open('big', 'wb') as f:\n    while True:\n        f.write(b'0' * 2**20)\n"),
    "reads the environment": (
        "import os, glob\n"
        "found = os.environ.get('RLAX_TEST_SECRET', '')\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        found = found or open(path).read()\n"
        "    except OSError:\n"
        "        pass\n"
        "print(dict(os.environ), found)\n"
        "def add(a, b):\n"
        f"    return a + b if {SECRET!r} in found else None\n"
    ),
    "kills its parent": GOOD
    + (
        "import os, signal\n"
        "for pid in (os.getppid(), 1, -1):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "add = None\n"
    ),
    "exits 0 early": GOOD + "import os\nos._exit(0)\n",
    "sys.exit(0) early": GOOD + "import sys\nsys.exit(0)\n",
    "prints a fake pass": (
        "import os\n"
        "print('all tests passed')\n"
        'os.write(3, b\'{"passed": 2, "total": 2, "failure": ""}\\n\')\n'
        "os._exit(0)\n"
    ),
    "daemon outlives the call": GOOD
    + (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(3600)\n"
        "    os._exit(0)\n"
        "add = None\n"
    ),
    "opens a network connection": (
        "import socket\n"
        "def add(a, b):\n"
        "    socket.create_connection(('127.0.0.1', PORT), timeout=1).sendall(b'leak')\n"
        "    return a + b\n"
    ),
}

LIMITS = {"cpu_s": 1, "wall_s": 1.5, "memory_mb": 256, "file_mb": 4, "processes": 8}


def prompt(answer) -> Prompt:
    return Prompt(id="add", text="write add", tokens=np.zeros(1, np.int32), answer=answer)


def survivors(uid: int) -> list[int]:
    """Live (non-zombie) processes running as ``uid``."""
    found = []
    for status in pathlib.Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            found.append(int(status.parent.name))
    return found


@pytest.fixture(scope="module")
def canary():
    """A process of ours that a hostile program must not be able to kill."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def listener():
    """A loopback server on the host: a sandboxed program must not reach it."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    yield server
    server.close()


# Programs stopped by rlimits alone run once (with namespaces); the rest run both ways.
_RLIMITS_ONLY = ("infinite loop", "memory blow-up", "huge file")
_HOSTILE_CASES = [
    pytest.param(name, namespaces, id=f"{name}-{'namespaces' if namespaces else 'fallback'}")
    for name in sorted(HOSTILE)
    for namespaces in (True, False)
    if namespaces or name not in _RLIMITS_ONLY
]


@pytest.mark.parametrize(("name", "namespaces"), _HOSTILE_CASES)
def test_hostile_program_is_contained_and_scores_zero(
    name, namespaces, canary, listener, monkeypatch
):
    monkeypatch.setenv("RLAX_TEST_SECRET", SECRET)
    source = HOSTILE[name].replace("PORT", str(listener.getsockname()[1]))
    reward = CodeReward(**LIMITS, namespaces=namespaces)

    start = time.monotonic()
    result = reward.run(prompt(TESTS), source)
    score = reward.judge(result)
    elapsed = time.monotonic() - start

    if name == "opens a network connection" and not namespaces:
        # Without a network namespace the connection goes through: the reward says so.
        assert "network NOT isolated: namespaces disabled" in score.reason
        return
    assert score.score == 0.0, score.reason
    assert result.status in ("failed", "no_verdict", "timeout"), result
    assert elapsed < 2 * (LIMITS["wall_s"] + 3)
    assert SECRET not in result.stdout + result.stderr
    assert survivors(result.uid) == []  # nothing of the program outlives the call
    assert canary.poll() is None  # the run is unharmed: our processes live on
    assert os.getppid() > 1
    if name == "opens a network connection":
        with pytest.raises(OSError):  # nothing reached the host's loopback
            listener.accept()
        assert result.network_isolated
        assert "Network is unreachable" in result.detail


def test_a_correct_program_passes_so_zeros_are_meaningful():
    reward = CodeReward(**LIMITS)
    result = reward.score(prompt(TESTS), f"Here:\n```python\n{GOOD}```\nDone.")
    assert result.score == 1.0 and result.reason.startswith("passed 2/2"), result.reason
    half = reward.score(prompt([*TESTS, "assert add(2, 2) == 5"]), GOOD)
    assert half.score == 0.0 and "failed 2/3" in half.reason
    partial = CodeReward(**LIMITS, partial_credit=True)
    assert partial.score(prompt([*TESTS, "assert add(2, 2) == 5"]), GOOD).score == pytest.approx(
        2 / 3
    )


def test_stdio_tests_compare_output():
    program = "n = int(input())\nprint(n * 2)\n"
    reward = CodeReward(**LIMITS)
    assert (
        reward.score(prompt({"inputs": ["2\n", "5\n"], "outputs": ["4\n", "10"]}), program).score
        == 1.0
    )
    assert reward.score(prompt({"stdio": [["2", "5"]]}), program).score == 0.0


def test_namespaces_isolate_network_pids_and_files():
    probe = (
        "import os, socket\n"
        "ifaces = sorted(name for _, name in socket.if_nameindex())\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "def info():\n"
        "    return ifaces, pids, os.getuid(), os.listdir('.'), os.environ.get('HOME')\n"
    )
    test = "ifaces, pids, uid, files, home = info()\nassert ifaces == ['lo'], ifaces\n"
    test += "assert pids == [1, 2], pids\nassert uid >= 1000000\nassert home == '/tmp'"
    result = run_python_tests(probe, {"asserts": [test]}, limits=Limits(**LIMITS))
    assert result.status == "passed", result
    assert result.isolation["cleanup"] == "pid namespace"
    assert result.isolation["filesystem"] == "private tmpfs"


def test_extract_code_and_read_tests():
    text = "```\nprint(1)\n```\nthen\n```python\nx = 2\n```\n```text\nnot code\n```"
    assert extract_code(text) == "x = 2\n"
    assert extract_code("x = 3") == "x = 3"
    assert read_tests(["assert f()"]) == {"asserts": ["assert f()"]}
    assert read_tests({"tests": "assert g()", "setup": "import math"}) == {
        "asserts": ["assert g()"],
        "setup": "import math",
    }
    with pytest.raises(ValueError, match="cannot read tests"):
        read_tests(42)
