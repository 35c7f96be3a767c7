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

import json
import os
import pathlib
import runpy
import shutil
import socket
import subprocess
import tempfile
import time
import warnings

import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.rewards.code.plan import plan_tests, read_tests
from rlax.plugins.rewards.code.verifier import CodeReward
from rlax.plugins.rewards.sandbox.run import WeakIsolationWarning

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs Linux")

CASES = runpy.run_path(str(pathlib.Path(__file__).with_name("cases.py")))
survivors = CASES["survivors"]
HOSTILE, HONEST, TESTS = CASES["HOSTILE"], CASES["HONEST"], CASES["TESTS"]
RIGHT = CASES["RIGHT"]
PROJECT = str(pathlib.Path(__file__).resolve().parents[4])
SECRET = "hunter2-red-team-secret"
LIMITS = CASES["LIMITS"]
ROOT = os.geteuid() == 0


def prompt(problem: str) -> Prompt:
    return Prompt(id=problem, text="", tokens=np.zeros(1, np.int32), answer=TESTS[problem])


def traces(directory: str, uid: int, before: set[str] = frozenset()) -> set[str]:
    """Entries of ``directory`` named like a hostile marker, or owned by ``uid`` and not in
    ``before`` (as an ordinary user the sandbox's uid is ours: callers' own
    ``rlax-sandbox-*`` work dirs, which they remove, are not the program's)."""
    found = set()
    for entry in os.scandir(directory):
        try:
            owner = entry.stat(follow_symlinks=False).st_uid
        except OSError:
            continue
        mine = owner == uid and entry.name not in before
        if not ROOT and entry.name.startswith(("rlax-sandbox-", "pytest-of-")):
            mine = False
        if mine or entry.name.startswith("rlax-hostile"):
            found.add(entry.name)
    return found


def in_user_namespace(namespace: str) -> list[int]:
    """Live processes in the user namespace ``namespace`` (``user:[inode]``)."""
    found = []
    for ns in pathlib.Path("/proc").glob("[0-9]*/ns/user"):
        try:
            if namespace and os.readlink(ns) == namespace:
                found.append(int(ns.parent.parent.name))
        except OSError:
            continue
    return found


def leftovers(result, temp: str, before: set[str]) -> dict[str, object]:
    """What of the run outlives the call: processes, files in the host's temp dir."""
    left = {
        "user namespace": in_user_namespace(result.isolation.get("user_namespace", "")),
        "temp files": traces(temp, result.uid, before),
        "processes": survivors(result.uid, result.isolation.get("user_namespace", "")),
    }
    return {what: found for what, found in left.items() if found}


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
    before, temp_before = snapshot(host["dir"]), set(os.listdir(temp))

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
    assert leftovers(result, temp, temp_before) == {}  # nothing of the program outlives the call
    assert snapshot(host["dir"]) == before and host["canary"].read_text() == "do not touch"
    assert host["bystander"].poll() is None
    assert result.isolation["syscalls"] == "allow-list (libseccomp)"
    if namespaces:
        assert result.isolation["root"] == "minimal read-only world"
        assert result.isolation["user_namespace"] != os.readlink("/proc/self/ns/user")
        with pytest.raises(OSError):  # nothing reached the host's loopback
            host["server"].accept()
    if "memory_peak_mb" in result.isolation:  # the run's cgroup held
        assert result.isolation["memory_peak_mb"] <= LIMITS["run_memory_mb"]


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


def _run_group_here() -> bool:
    """As root a cgroup can be had here; an ordinary user needs one delegated (.ci/run's)."""
    from rlax.plugins.rewards.sandbox import cgroup as sandbox_cgroup

    try:
        group = sandbox_cgroup.create(f"{sandbox_cgroup.PREFIX}{os.getpid()}-probe", 64, 4)
    except OSError:
        if ROOT:
            raise
        return False
    group.remove()
    return True


@pytest.mark.parametrize(
    "name", ["holds memory in many processes", "holds memory that is not mapped"]
)
@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_the_run_memory_bound_holds_and_its_peak_is_measured(name, host):
    """The run's bound: the peak the kernel measured (a cgroup) stays within ``run_memory_mb``,
    whatever the program spreads over processes or keeps out of its address space; without
    a cgroup, init's watch kills the run that passes it.

    The many-process attack must also have reached the bound, or the run proved nothing;
    its four holders race each other and the bound's kills, and once in a CI run it peaked
    at 392 MB (alone here: 512 MB, 6 of 6), so it gets three tries to reach it. The
    containment is asserted on every try."""
    grouped = _run_group_here()
    _, problem, source = HOSTILE[name]
    reward = CodeReward(**LIMITS | {"wall_s": 6.0, "cpu_s": 3})  # time to push, even on a busy host
    bound, peaks = LIMITS["run_memory_mb"], []
    for _ in range(3):
        result = reward.run(prompt(problem), fill(source, host))
        assert reward.judge(result).score == 0.0, (result.detail, result.stderr[-300:])
        peak = result.isolation["memory_peak_mb"]
        print(f"{name}: peak {peak} MB of a {bound} MB bound ({result.isolation['run_limits']})")
        if grouped:
            assert result.isolation["run_limits"].startswith("cgroup v"), result.isolation
            assert peak <= bound
        else:
            assert result.isolation["run_limits"] == "resident memory watched by init"
            assert result.isolation["run_memory_exceeded"] == (peak > bound), result.isolation
        peaks.append(peak)
        if name != "holds memory in many processes" or peak >= bound - 64:
            break
    if name == "holds memory in many processes":  # it did push the bound: 4 x 230 MB tried
        assert peaks[-1] >= bound - 64, f"the attack never reached the bound: peaks {peaks} MB"
        assert grouped or result.isolation["run_memory_exceeded"]


_AS_USER = """
import json, runpy, sys
import numpy as np
from rlax.core.types import Prompt
from rlax.plugins.rewards.code.verifier import CodeReward
table = json.loads(sys.argv[1])
verdicts = {}
for name, (problem, source, tests) in table.items():
    reward = CodeReward(**json.loads(sys.argv[2]))
    prompt = Prompt(id=problem, text="", tokens=np.zeros(1, np.int32), answer=tests)
    result = reward.run(prompt, source)
    verdicts[name] = [reward.judge(result).score, result.status, result.isolation.get("root"),
                      result.isolation.get("run_limits")]
print(json.dumps(verdicts))
"""


def _verdicts_as_nobody(table: dict, limits: dict) -> dict:
    """The same table scored by a process of the unprivileged user ``nobody``."""
    from rlax.plugins.rewards.sandbox.run import python_for_sandbox

    python = python_for_sandbox()  # as root: one that any user can run
    readable = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "test", "-r", PROJECT],
        check=False,
    )
    assert readable.returncode == 0, f"nobody cannot read {PROJECT}: clone it where any user can"
    site = tempfile.mkdtemp(prefix="rlax-as-nobody-")
    try:
        os.chmod(site, 0o755)
        packages = [p for p in __import__("site").getsitepackages() if os.path.isdir(p)]
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write("import site\n" + "".join(f"site.addsitedir({p!r})\n" for p in packages))
        os.chmod(os.path.join(site, "sitecustomize.py"), 0o644)
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i"]
        command += ["PATH=/usr/bin:/bin", "HOME=/tmp", f"PYTHONPATH={site}", python, "-c"]
        done = subprocess.run(
            [*command, _AS_USER, json.dumps(table), json.dumps(limits)],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
            cwd="/",
        )
    finally:
        shutil.rmtree(site, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


ROOTLESS_TABLE = [
    "keeps a secret in the user keyring",
    "makes user and other namespaces",
    "ptraces a sibling",
    "holds memory in many processes",
    "fork bomb",
    "reads host files and project sources",
    "kills its parent and init",
    "prints a fake pass",
]


def test_an_ordinary_user_gets_the_same_sandbox_and_the_same_verdicts(host):
    """Rootless: the same world and verdicts as an unprivileged user (as root, the table also
    runs under ``setpriv`` as ``nobody``; as an ordinary user, this pass is that check)."""
    table = {name: (HOSTILE[name][1], fill(HOSTILE[name][2], host)) for name in ROOTLESS_TABLE}
    for problem, (right, wrong) in sorted(HONEST.items())[:3]:
        table[f"right {problem}"], table[f"wrong {problem}"] = (problem, right), (problem, wrong)
    table = {name: (problem, source, TESTS[problem]) for name, (problem, source) in table.items()}
    expected = {name: 1.0 if name.startswith("right") else 0.0 for name in table}
    reward = CodeReward(**LIMITS)
    mine = {}
    for name, (problem, source, _) in table.items():
        result = reward.run(prompt(problem), source)
        mine[name] = [reward.judge(result).score, result.status, result.isolation.get("root")]
    assert {name: v[0] for name, v in mine.items()} == expected, mine
    assert {v[2] for v in mine.values()} == {"minimal read-only world"}
    if ROOT:
        theirs = _verdicts_as_nobody(table, LIMITS)
        assert {name: v[0] for name, v in theirs.items()} == expected, theirs
        assert {v[2] for v in theirs.values()} == {"minimal read-only world"}
        # nobody has no cgroup here: its runs are bounded by init's watch
        assert {v[3] for v in theirs.values()} == {"resident memory watched by init"}, theirs
