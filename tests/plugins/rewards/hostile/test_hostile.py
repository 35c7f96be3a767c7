"""The red-team suite: every hostile program scores 0 and leaves nothing behind.

The table is ``cases.py`` (one program per class of attack). For each run the
test looks before and after: the processes of the sandbox uid (none may be
alive after), the host's temporary directory and the directory that would be
the work dir's parent in the weak mode (no entry of the sandbox uid, no
``rlax-hostile*`` marker), a host directory and a canary file the programs aim
at (unchanged), a loopback listener (nothing connected), and a process of
ours that a program might try to kill (alive). Honest programs of eight
problems score 1 (right) and 0 (wrong), so the zeros mean something, and the
right-program table (``RIGHT``: ``exit()``, ``open(0)``, fast I/O on real file
descriptors, ints past 4,300 digits, ``Counter`` for a dict, constant
expressions in asserts) scores 1.
"""

from __future__ import annotations

import os
import pathlib
import runpy
import socket
import subprocess
import tempfile
import time
import warnings

import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.rewards.code_sandbox import WeakIsolationWarning
from rlax.plugins.rewards.code_tests import plan_tests, read_tests
from rlax.plugins.rewards.code_verifier import CodeReward

pytestmark = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0, reason="the sandbox's isolation needs Linux as root"
)

CASES = runpy.run_path(str(pathlib.Path(__file__).with_name("cases.py")))
processes_of = CASES["processes_of"]
HOSTILE, HONEST, TESTS = CASES["HOSTILE"], CASES["HONEST"], CASES["TESTS"]
RIGHT = CASES["RIGHT"]
PROJECT = str(pathlib.Path(__file__).resolve().parents[4])
SECRET = "hunter2-red-team-secret"
LIMITS = {"cpu_s": 1, "wall_s": 1.5, "memory_mb": 256, "file_mb": 4, "processes": 8}


def prompt(problem: str) -> Prompt:
    return Prompt(id=problem, text="", tokens=np.zeros(1, np.int32), answer=TESTS[problem])


def traces(directory: str, uid: int) -> set[str]:
    """Entries of ``directory`` owned by ``uid`` or named like a hostile marker."""
    found = set()
    for entry in os.scandir(directory):
        try:
            owner = entry.stat(follow_symlinks=False).st_uid
        except OSError:
            continue
        if owner == uid or entry.name.startswith("rlax-hostile"):
            found.add(entry.name)
    return found


def snapshot(path: pathlib.Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The host state the programs aim at: a directory, a canary, a listener, a process."""
    hostdir = tmp_path_factory.mktemp("hostile-target")
    canary = hostdir / "canary.txt"
    canary.write_text("do not touch")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.05)
    bystander = subprocess.Popen(["sleep", "600"])
    yield {"dir": hostdir, "canary": canary, "server": server, "bystander": bystander}
    bystander.kill()
    bystander.wait()
    server.close()


def fill(source: str, host) -> str:
    for key, value in (
        ("PORT", str(host["server"].getsockname()[1])),
        ("HOSTDIR", str(host["dir"])),
        ("CANARY", str(host["canary"])),
        ("PROJECT", PROJECT),
        ("SECRET", repr(SECRET)),
    ):
        source = source.replace(key, value)
    return source


_RUNS = [
    pytest.param(name, namespaces, id=f"{name}-{'world' if namespaces else 'weak'}")
    for name, (kind, _, _) in HOSTILE.items()
    for namespaces in (True, False)
    if namespaces or kind == "forge"
]


@pytest.mark.parametrize(("name", "namespaces"), _RUNS)
@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_hostile_program_scores_zero_and_leaves_nothing(name, namespaces, host, monkeypatch):
    monkeypatch.setenv("RLAX_RED_TEAM_SECRET", SECRET)
    _, problem, source = HOSTILE[name]
    reward = CodeReward(**LIMITS, namespaces=namespaces)
    temp = tempfile.gettempdir()
    before = snapshot(host["dir"])

    start = time.monotonic()
    with warnings.catch_warnings():  # the world must not fall back; the weak mode warns
        warnings.simplefilter("ignore" if not namespaces else "error", WeakIsolationWarning)
        result = reward.run(prompt(problem), fill(source, host))
    elapsed = time.monotonic() - start
    score = reward.judge(result)

    assert score.score == 0.0, (score.reason, result.stdout[:300], result.stderr[:300])
    assert result.status in ("failed", "no_verdict", "timeout"), result.status
    assert result.verdict_by == "supervisor"
    assert elapsed < LIMITS["wall_s"] + 5
    assert len(result.stdout) <= 64 * 1024 and SECRET not in result.stdout + result.stderr
    assert processes_of(result.uid) == []  # nothing of the program outlives the call
    assert traces(temp, result.uid) == set()  # no file left in the host's temp dir
    assert snapshot(host["dir"]) == before and host["canary"].read_text() == "do not touch"
    assert host["bystander"].poll() is None
    if namespaces:
        assert result.isolation["root"] == "minimal read-only world"
        with pytest.raises(OSError):  # nothing reached the host's loopback
            host["server"].accept()


def test_the_table_covers_every_class_of_attack():
    kinds = [kind for kind, _, _ in HOSTILE.values()]
    assert len(HOSTILE) >= 30 and kinds.count("forge") >= 15 and kinds.count("contain") >= 15
    assert kinds.count("decode") >= 9


@pytest.mark.parametrize("problem", sorted(HONEST))
def test_right_solutions_score_one_and_wrong_ones_zero(problem):
    right, wrong = HONEST[problem]
    reward = CodeReward(**LIMITS)
    good, bad = reward.run(prompt(problem), right), reward.run(prompt(problem), wrong)
    assert reward.judge(good).score == 1.0, (good.detail, good.stderr)
    assert good.passed == good.total == len(plan_tests(read_tests(TESTS[problem])).tests)
    assert reward.judge(bad).score == 0.0 and bad.status == "failed", bad
    assert bad.total == good.total and bad.passed < bad.total


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_right_programs_score_one(name):
    tests, program = RIGHT[name]
    reward = CodeReward(**LIMITS)
    plan = plan_tests(read_tests(tests))
    assert not plan.weak  # constant expressions are folded: no weak refusal
    result = reward.run(
        Prompt(id=name, text="", tokens=np.zeros(1, np.int32), answer=tests), program
    )
    assert reward.judge(result).score == 1.0, (result.detail, result.stderr[-300:])
    assert result.passed == result.total == len(plan.tests)
