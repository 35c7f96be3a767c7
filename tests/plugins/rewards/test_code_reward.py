"""The code sandbox against hostile programs: each contained, scored 0, the run unharmed."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import random
import runpy
import shutil
import subprocess
import time
import warnings

import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.rewards.code.equality import matches
from rlax.plugins.rewards.code.plan import CallTest, plan_tests
from rlax.plugins.rewards.code.sandboxed import Limits, run_python_tests, run_tests
from rlax.plugins.rewards.code.values import WireError, encode, parse_line
from rlax.plugins.rewards.code.verdict import judge
from rlax.plugins.rewards.code.verifier import CodeReward, extract_code, read_tests

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


def survivors(result) -> list[int]:
    """Live processes of a finished run (the red-team table's helper)."""
    cases = runpy.run_path(str(pathlib.Path(__file__).with_name("hostile") / "cases.py"))
    return cases["survivors"](result.uid, result.isolation.get("user_namespace", ""))


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
# An ordinary user's weak mode runs the program as that user, outside any pid namespace:
# it can signal the caller's own processes (kill(-1) would end this test run). As documented.
_NOT_WEAK = _RLIMITS_ONLY + (() if os.geteuid() == 0 else ("kills its parent",))
_HOSTILE_CASES = [
    pytest.param(name, namespaces, id=f"{name}-{'namespaces' if namespaces else 'fallback'}")
    for name in sorted(HOSTILE)
    for namespaces in (True, False)
    if namespaces or name not in _NOT_WEAK
]


@pytest.mark.parametrize(("name", "namespaces"), _HOSTILE_CASES)
@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
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
    assert survivors(result) == []  # nothing of the program outlives the call
    assert canary.poll() is None  # the run is unharmed: our processes live on
    assert os.getppid() > 1
    if name == "opens a network connection":
        with pytest.raises(OSError):  # nothing reached the host's loopback
            listener.accept()
        assert result.network_isolated
        assert "Operation not permitted" in result.detail  # the filter refuses AF_INET


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
        "ifaces = sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:])\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "def info():\n"
        "    return ifaces, pids, os.getuid(), os.listdir('.'), os.environ.get('HOME')\n"
    )
    test = "ifaces, pids, uid, files, home = info()\nassert ifaces == ['lo'], ifaces\n"
    test += "assert pids == [1, 2], pids\nassert uid != 0\nassert home == '/tmp'"
    result = run_python_tests(probe, {"asserts": [test]}, limits=Limits(**LIMITS))
    assert result.status == "passed", result
    assert result.isolation["cleanup"] == "pid namespace"
    assert result.isolation["filesystem"] == "private tmpfs"
    assert result.isolation["user_namespace"] not in ("", os.readlink("/proc/self/ns/user"))
    assert result.isolation["syscalls"] == "allow-list (libseccomp)"


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


# ---- the trusted verdict --------------------------------------------------------------

EXPECTED_MARKER = "zq-expected-9b1c7"
INPUT_MARKER = "zq-input-4e2a1"

MEMORY_DUMP = """
import gc, os, sys
seen = []
for obj in gc.get_objects():
    try:
        seen.append(repr(obj)[:2000])
    except Exception:
        pass
f = sys._getframe()
while f:
    seen.append(repr(f.f_locals)[:5000])
    f = f.f_back
for base, dirs, files in os.walk('/'):
    dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev', 'usr', 'lib', 'lib64')]
    for name in files:
        try:
            seen.append(open(os.path.join(base, name), errors='replace').read(100000))
        except OSError:
            pass
for path in ('/proc/1/cmdline', '/proc/1/environ', '/proc/self/environ'):
    try:
        seen.append(open(path, 'rb').read().decode(errors='replace'))
    except OSError:
        pass
dump = '\\n'.join(seen)
print(dump[-60000:] if INPUT in dump else 'no input seen')
def echo(x):
    return {"input_seen": INPUT in dump, "expected_seen": EXPECTED in dump}
"""


def test_expected_outputs_never_enter_the_sandbox():
    """A program that reads all it can reach sees the input, never the expected output."""
    # Built at run time: a constant would be folded into the program's own code.
    source = MEMORY_DUMP.replace("INPUT", f"''.join([{INPUT_MARKER[:-1]!r}, '1'])")
    source = source.replace("EXPECTED", f"''.join([{EXPECTED_MARKER[:-1]!r}, '7'])")
    tests = {"calls": [{"function": "echo", "args": [INPUT_MARKER], "expected": EXPECTED_MARKER}]}
    result = CodeReward(**LIMITS).run(prompt(tests), source)
    assert result.status == "failed", result
    assert '["input_seen", true]' in result.channel  # the program did read its input
    assert result.channel.count("true") == 1 and "expected_seen" in result.channel
    assert '["expected_seen", false]' in result.channel, result.channel
    assert EXPECTED_MARKER not in result.stdout + result.stderr + result.channel


def test_the_count_is_the_plans_own_not_the_programs():
    # The program answers test 0 right, claims 50 tests and a verdict; two of three exist.
    source = (
        "import os\n"
        'os.write(3, b\'{"passed": 3, "total": 3}\\n\')\n'
        "for i in range(50):\n"
        '    os.write(3, (\'{"i": %d, "value": 3}\\n\' % i).encode())\n'
        "def add(a, b):\n    return a + b\n"
    )
    result = CodeReward(**LIMITS).run(prompt([*TESTS, "assert add(5, 5) == 10"]), source)
    assert (result.status, result.passed, result.total) == ("failed", 1, 3)  # 1+2=3 only


def test_call_values_keep_their_types_across_the_boundary():
    program = "def f(x):\n    return x\n"
    values = [(1, "a"), {1: [2.5, None]}, {frozenset({1}), 2}, b"\x00\xff", 1 + 2j, [True]]
    tests = {"calls": [{"function": "f", "args": [v], "expected": v} for v in values]}
    result = CodeReward(**LIMITS).run(prompt(tests), program)
    assert (result.status, result.passed) == ("passed", len(values)), result
    as_list = {"calls": [{"function": "f", "args": [[1, "a"]], "expected": (1, "a")}]}
    assert CodeReward(**LIMITS).run(prompt(as_list), program).status == "failed"  # list != tuple


def test_assert_tests_that_cannot_be_converted_are_refused_unless_allowed():
    weak = prompt(["x = add(1, 2)\nassert x == 3"])
    with pytest.raises(ValueError, match="allow_weak_tests=True"):
        CodeReward(**LIMITS).run(weak, GOOD)
    allowed = CodeReward(**LIMITS, allow_weak_tests=True)
    score = allowed.score(weak, GOOD)
    assert score.score == 1.0 and "[weak: assert tests judged inside the program]" in score.reason
    forged = "class A(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\n"
    forged += "def add(a, b):\n    return A(0)\n"
    assert allowed.score(weak, forged).score == 1.0  # what "weak" means: forgeable
    assert CodeReward(**LIMITS).score(prompt(TESTS), forged).score == 0.0  # converted: not


def test_stdio_programs_may_exit_and_read_stdin_buffer():
    program = "import sys\ndata = sys.stdin.buffer.read().split()\nprint(len(data))\nsys.exit(3)\n"
    tests = {"stdio": [["a b c\n", "3"], ["", "0"]]}
    assert CodeReward(**LIMITS).score(prompt(tests), program).score == 1.0


def test_the_world_holds_only_the_interpreter_read_only():
    probe = (
        "import os, sys\n"
        "def look():\n"
        "    try:\n        open('/usr/rlax-probe', 'w')\n        ro = False\n"
        "    except OSError:\n        ro = True\n"
        "    open('/tmp/scratch', 'w').write('ok')\n"
        "    return sorted(os.listdir('/')), ro, open('/tmp/scratch').read(), os.getcwd()\n"
    )
    tests = {"calls": [{"function": "look", "args": [], "expected": None}]}
    result = CodeReward(**LIMITS).run(prompt(tests), probe)
    value = result.channel.split('"value": ', 1)[1]
    listing = '[["dev", "lib", "lib64", "proc", "tmp", "usr"], true, "ok", "/tmp/work"]'
    assert value.startswith('{"tuple": ' + listing), value


def test_a_broken_world_is_an_error_unless_weak_isolation_is_allowed(monkeypatch):
    from rlax.plugins.rewards.sandbox import run as sandbox_run

    monkeypatch.setattr(sandbox_run, "interpreter_world", lambda python: {"binds": ["/no/such"]})
    monkeypatch.setattr(sandbox_run, "_warned", sandbox_run.threading.Event())
    strict = CodeReward(**LIMITS).run(prompt(TESTS), GOOD)
    assert strict.status == "error" and "allow_weak_isolation=True" in strict.detail, strict
    weak = CodeReward(**LIMITS, allow_weak_isolation=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = weak.run(prompt(TESTS), GOOD), weak.run(prompt(TESTS), GOOD)
    weak_warnings = [w for w in caught if w.category is sandbox_run.WeakIsolationWarning]
    assert len(weak_warnings) == 1  # once per process, not once per run
    assert "WITHOUT namespaces" in str(weak_warnings[0].message)
    assert first.status == second.status == "passed"
    assert first.isolation["filesystem"] == "host temporary directory"


def test_the_weak_mode_removes_what_the_uid_left_in_the_host_temp_dir():
    import tempfile

    name = f"rlax-weak-left-{os.getpid()}"
    source = (
        f"import os\nopen('/tmp/{name}', 'w').write('x')\nos.mkdir('/tmp/{name}.d')\n"
        f"open('/tmp/{name}.d/f', 'w').write('x')\nwon = os.path.exists('/tmp/{name}.d/f')\n"
        "def add(a, b):\n    return a + b if won else None\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = CodeReward(**LIMITS, namespaces=False).run(prompt(TESTS), source)
    assert result.status == "passed", result  # so it did write there, as the host's /tmp
    left = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(name)]
    if os.geteuid() == 0:  # the sandbox uid's files, removed
        assert left == [] and result.isolation["cleanup"] == "process group and uid"
    else:  # an ordinary user's weak mode runs as that user: its files are the caller's
        assert sorted(left) == [name, f"{name}.d"]
        assert result.isolation["cleanup"] == "process group"
        shutil.rmtree(f"/tmp/{name}.d")
        os.unlink(f"/tmp/{name}")


# ---- deny by default, rootless (issue 35) ------------------------------------------------

KEYRING = (  # x86-64 call numbers: add_key 248, keyctl 250; -4 is the user keyring (@u)
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\nL = ctypes.c_long\n"
    "def plant():\n"
    "    return libc.syscall(L(248), b'user', b'rlax-left', b'1', L(1), L(-4)) >= 0\n"
    "def found():\n"
    "    return libc.syscall(L(250), L(10), L(-4), b'user', b'rlax-left', L(0)) >= 0\n"
)


def _unfiltered(monkeypatch) -> None:
    """As on a machine without libseccomp: only allow_weak_isolation lets a run go."""
    from rlax.plugins.rewards.sandbox import run as sandbox_run
    from rlax.plugins.rewards.sandbox.seccomp import SeccompUnavailable

    def missing():
        raise SeccompUnavailable("libseccomp.so.2 cannot be loaded (test)")

    monkeypatch.setattr(sandbox_run, "filter_program", missing)
    monkeypatch.setattr(sandbox_run, "_warned", sandbox_run.threading.Event())
    monkeypatch.setattr(sandbox_run, "_sandbox_uid", lambda: os.geteuid() or 1_999_999)


def test_without_libseccomp_a_run_is_an_error_naming_the_setting(monkeypatch):
    _unfiltered(monkeypatch)
    strict = CodeReward(**LIMITS).run(prompt(TESTS), GOOD)
    assert strict.status == "error" and "allow_weak_isolation=True" in strict.detail, strict
    assert "libseccomp.so.2" in strict.detail
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weak = CodeReward(**LIMITS, allow_weak_isolation=True).run(prompt(TESTS), GOOD)
    assert weak.status == "passed" and weak.isolation["syscalls"] == "NOT filtered", weak
    assert any("WITHOUT a system-call filter" in str(w.message) for w in caught)


def test_per_user_kernel_state_does_not_outlive_a_run(monkeypatch):
    """Keyrings are the kernel's per-user state: with the filter off (so the calls work) a
    key planted by one run is in that run's user keyring, and gone for the next run of the
    same uid, whose user namespace is its own. With the filter on, no keyring call works."""
    calls = {"calls": [{"function": "plant", "args": [], "expected": True}]}
    both = KEYRING + "def plant_and_find():\n    return plant() and found()\n"
    check = {"calls": [{"function": "plant_and_find", "args": [], "expected": True}]}
    filtered = CodeReward(**LIMITS)
    assert filtered.run(prompt(calls), KEYRING).status == "failed"  # add_key: EPERM
    _unfiltered(monkeypatch)
    reward = CodeReward(**LIMITS, allow_weak_isolation=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert reward.run(prompt(check), both).status == "passed"  # the channel, within a run
        first = reward.run(prompt(calls), KEYRING)
        gone = {"calls": [{"function": "found", "args": [], "expected": False}]}
        second = reward.run(prompt(gone), KEYRING)
    assert first.status == "passed" and first.uid == second.uid, first
    assert second.status == "passed", second  # the next run of the same uid finds nothing


_NO_USER_NAMESPACES = r"""
import ctypes, json, os, sys
from rlax.plugins.rewards.sandbox import seccomp as sandbox_seccomp
from rlax.plugins.rewards.code.sandboxed import Limits, run_python_tests
lib = sandbox_seccomp._library()
lib.seccomp_load.argtypes = [ctypes.c_void_p]
ctx = lib.seccomp_init(sandbox_seccomp.SCMP_ACT_ALLOW)
for name in (b"unshare", b"clone3"):
    number = lib.seccomp_syscall_resolve_name(name)
    arg = (sandbox_seccomp._ArgCmp * 1)()
    lib.seccomp_rule_add_array(ctx, sandbox_seccomp.errno_action(1), number, 0, arg)
libc = ctypes.CDLL(None)
assert libc.prctl(38, 1, 0, 0, 0) == 0 and lib.seccomp_load(ctx) == 0
limits = Limits(**json.loads(sys.argv[1]))
tests = {"asserts": ["assert add(1, 2) == 3"]}
for weak in (False, True):
    result = run_python_tests(
        "def add(a, b):\n    return a + b\n", tests, limits=limits, allow_weak_isolation=weak
    )
    print(json.dumps([result.status, result.detail, result.isolation.get("filesystem")]))
"""


def test_a_kernel_without_user_namespaces_is_an_error_naming_the_setting():
    """Where the kernel refuses a user namespace (here: unshare refused to the caller and
    all it starts), a run is an error naming allow_weak_isolation, as root too."""
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _NO_USER_NAMESPACES, json.dumps(LIMITS)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    strict, weak = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert strict[0] == "error" and "allow_weak_isolation=True" in strict[1], strict
    assert "user namespace" in strict[1]
    assert weak[0] == "passed" and weak[2] == "host temporary directory", weak


# ---- the pieces, without a sandbox ------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "converted"),
    [
        ("assert f(1, 'a') == [2]", CallTest("f", (1, "a"), {}, [2])),
        ("assert (3, 4) == f(x=-1)", CallTest("f", (), {"x": -1}, (3, 4))),
        ("assert f({1: 2}) is None", CallTest("f", ({1: 2},), {}, None, "is")),
        ("assert f(0)", CallTest("f", (0,), {}, True, "truthy")),
        ("assert not f(0)", CallTest("f", (0,), {}, False, "falsy")),
        (
            "assert math.isclose(f(1), 0.5, abs_tol=0.01)",
            CallTest("f", (1,), {}, 0.5, "isclose", (1e-9, 0.01)),
        ),
        ("assert f(g(1)) == 2", None),  # a nested call: the program's value as an argument
        ("assert f(1) < 2", None),
        ("assert f(1) == x", None),
        ("assert obj.f(1) == 2", None),
        ("assert f(*args) == 2", None),
        ("x = 1\nassert f(x) == 2", None),
        ("assert f(1) is 2", None),
    ],
)
def test_assert_conversion(statement, converted):
    plan = plan_tests({"asserts": [statement]})
    if converted is None:
        assert plan.weak and plan.asserts == (statement,)
    else:
        assert plan.mode == "call" and plan.tests == (converted,)


def test_one_unconvertible_assert_makes_the_whole_set_weak():
    assert plan_tests({"asserts": ["assert f(1) == 2", "assert f(1) < 2"]}).weak


HARNESS = runpy.run_path(
    str(pathlib.Path(__file__).parents[3] / "plugins" / "rewards" / "code/harness.py")
)


def wire(value):
    """A returned ``value`` as the trusted side receives it: encoded by the harness, parsed."""
    return parse_line(json.dumps(HARNESS["_encode"](value)))


def test_wire_format_round_trips_and_rejects_what_it_does_not_define():
    value = [None, True, -3, 2.5, "s", (1, [2]), {"k": {3}}, frozenset({4}), b"\x01", 1j]
    assert matches(wire(value), value)
    assert matches(wire((1,)), (1,)) and not matches(wire([1]), (1,))
    assert not matches(wire((1,)), [1])
    for bad in ({"object": 1}, {"tuple": 1}, {"a": 1, "b": 2}, {"bytes": "zz"}, {"int": "xyz"}):
        with pytest.raises(WireError):
            matches(parse_line(json.dumps(bad)), (1,) if "tuple" in bad else b"")
    assert not matches(parse_line('{"set": [[1]]}'), {1})  # an unhashable member: unequal
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(WireError, match="deeper"):
        matches(parse_line(json.dumps(deep)), deep)

    class Sneaky(int):
        pass

    with pytest.raises(WireError, match="Sneaky"):
        encode(Sneaky(1))


def test_matches_compares_builtin_values_only():
    assert matches(wire((1, 2)), (1, 2)) and not matches(wire([1, 2]), (1, 2))
    assert matches(wire(None), None, "is") and not matches(wire(0), None, "is")
    assert not matches(wire(1), True, "is")
    assert matches(wire(0.50001), 0.5, "isclose", (1e-3, 0.0))
    assert not matches(wire("0.5"), 0.5, "isclose")
    assert not matches(wire(10**400), 1.0, "isclose")  # too large for a float: not close
    assert matches(wire([0]), None, "truthy") and matches(wire(""), None, "falsy")
    assert matches(wire({}), None, "falsy") and matches(wire(3**300), None, "truthy")
    assert not matches(wire(float("nan")), float("nan"))
    assert not matches(wire({float("nan"): 1}), {float("nan"): 1})  # a NaN key equals nothing


def _values(rng: random.Random, depth: int = 0):
    """A random built-in value from a small domain, so that equal pairs are common."""
    atoms = [0, 1, 1.0, True, False, -0.0, 2, 2**300, "a", "b", b"a", None, 1 + 0j, 2j]
    kind = rng.randrange(7 if depth < 3 else 1)
    if kind == 0:
        return rng.choice(atoms)
    hashable = [v for v in atoms if v is not None] + [(1, "a"), frozenset({1, 2}), ()]
    size = rng.randrange(4)
    if kind in (1, 2):
        items = [_values(rng, depth + 1) for _ in range(size)]
        return items if kind == 1 else tuple(items)
    if kind in (3, 4):
        members = {rng.choice(hashable) for _ in range(size)}
        return members if kind == 3 else frozenset(members)
    return {rng.choice(hashable): _values(rng, depth + 1) for _ in range(size)}


def test_equality_on_the_wire_is_pythons_equality():
    """The law: for built-in values without NaN, ``matches(wire(v), w) == (v == w)``."""
    rng = random.Random(35)
    pool = [_values(rng) for _ in range(400)]
    pairs = [(v, v) for v in pool] + [(rng.choice(pool), rng.choice(pool)) for _ in range(6000)]
    pairs += [({1: "a", 2.0: "b"}, {2: "b", True: "a"}), ({(1, 2.0)}, {(1.0, 2)})]
    pairs += [(collections.Counter("aab"), {"a": 2, "b": 1}), ([{1, 2}], [frozenset({2, 1})])]
    equal = 0
    for v, w in pairs:
        assert matches(wire(v), w) == (v == w), (v, w)
        equal += v == w
    assert equal > len(pool) + 100  # the table holds many equal pairs of different shapes


def test_judge_counts_the_first_answer_per_test_and_ignores_the_rest():
    plan = plan_tests({"calls": [{"function": "f", "args": [], "expected": 1}] * 2})
    lines = [
        '{"passed": 2, "total": 2}',
        '{"i": 0, "value": 1}',
        '{"i": 0, "value": 2}',  # a second answer to test 0: ignored
        '{"i": 7, "value": 1}',  # no such test
        '{"i": true, "value": 1}',  # true is no index
        "[[[[",
        '{"i": 1, "value": {"object": 1}}',
    ]
    verdict = judge(plan, "\n".join(lines))
    assert (verdict.passed, verdict.total, verdict.answered) == (1, 2, 2)
    assert verdict.failure.startswith("test 1: malformed value")


def test_inputs_larger_than_a_pipe_buffer_arrive_whole():
    big = " ".join(["7"] * 300_000)  # 600 kB on stdin, ten times a pipe's buffer
    program = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"
    tests = {"stdio": [[big, "2100000"], ["1 1", "2"]]}
    assert CodeReward(**LIMITS).score(prompt(tests), program).score == 1.0
    call = {"calls": [{"function": "f", "args": [big], "expected": 600_000 - 1}]}
    assert CodeReward(**LIMITS).score(prompt(call), "def f(s):\n    return len(s)\n").score == 1.0


# ---- right programs (issue 35): constants, real file descriptors, big ints ---------------


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("10**9 + 7", 1_000_000_007),
        ("2**31 - 1", 2_147_483_647),
        ("[0] * 5", [0, 0, 0, 0, 0]),
        ("-(3)", -3),
        ("(1, 2) * 2", (1, 2, 1, 2)),
        ("3 * 'ab'", "ababab"),
        ("{1: [2] * 2, 'k': (1 << 4) | 1}", {1: [2, 2], "k": 17}),
        ("7 // 2 + 7 % 2 + 1 / 4", 4.25),
        ("~0 ^ 5", -6),
        ("set()", set()),
        ("2**20000", 2**20000),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_constant_expressions_of_literals_are_folded(source, value):
    plan = plan_tests({"asserts": [f"assert f() == {source}"]})
    assert plan.mode == "call" and plan.tests == (CallTest("f", (), {}, value),)
    assert type(plan.tests[0].expected) is type(value)


@pytest.mark.parametrize(
    "source",
    [
        "2**10**8",  # 100 million bits: refused before it is computed
        "[0] * 10**9",
        "'ab' * 10**7",
        "[[0] * 1000] * 2000",  # 2 million elements nested
        "1 << 10**9",
        "1 / 0",
        "2.0**100000",  # overflow
        "'%d' % 3",
        "x + 1",
        "len('ab')",
        "-'a'",
    ],
)
def test_what_is_not_a_bounded_constant_stays_weak(source):
    assert plan_tests({"asserts": [f"assert f() == {source}"]}).weak


def test_ints_of_any_size_cross_the_boundary_as_hex():
    big = 3**20000  # 9,543 digits
    assert encode(big) == {"int": format(big, "x")} and encode(-big) == {"int": format(-big, "x")}
    assert encode(2**256 - 1) == 2**256 - 1  # small ones stay JSON numbers
    assert matches(wire([big, -big, 5]), [big, -big, 5])
    assert not matches(wire([big + 1]), [big])


def test_each_stdio_case_is_its_own_process_with_real_descriptors():
    # Case 0 breaks print and closes stdout; case 1 starts clean: its own fork of the harness.
    program = (
        "import builtins, os, sys\n"
        "size = os.fstat(0).st_size\n"
        "line = open(0).read().strip()\n"
        "os.write(1, f'{line}:{size}\\n'.encode())\n"
        "if line == 'first':\n"
        "    builtins.print = None\n"
        "    sys.stdout.close()\n"
        "print('clean')\n"
    )
    tests = {"stdio": [["first\n", "first:6"], ["second\n", "second:7\nclean"]]}
    result = CodeReward(**LIMITS).run(prompt(tests), program)
    assert (result.status, result.passed) == ("failed", 1), result  # case 0 raised
    assert result.detail.startswith("test 0: raised TypeError"), result.detail


def test_an_input_past_the_file_limit_arrives_on_a_pipe():
    big = "1 " * (600 * 1024)  # 1.2 MB, past file_mb=1: fd 0 is a pipe then
    program = "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n"
    tests = {"stdio": [[big, str(600 * 1024)], ["2 2", "4"]]}
    limits = {**LIMITS, "file_mb": 1}
    assert CodeReward(**limits).score(prompt(tests), program).score == 1.0


# ---- bounded on the trusted side (issue 35) ----------------------------------------------

MIB4 = 4 * 2**20 - 64  # just under the channel's 4 MiB
HASH_MODULUS = 2**61 - 1  # ints equal modulo it share a hash, whatever the seed


def _filled(prefix: str, unit: str, suffix: str) -> str:
    return prefix + unit * ((MIB4 - len(prefix) - len(suffix)) // len(unit)) + suffix


def _answer(value_json: str) -> str:
    return '{"i": 0, "value": ' + value_json + "}"


def _colliding(tag: str, count: int, pair: bool) -> str:
    items = [f"[{k * HASH_MODULUS}, 0]" if pair else str(k * HASH_MODULUS) for k in range(count)]
    return _answer('{"' + tag + '": [' + ", ".join(items) + "]}")


# name -> (channel of about 4 MiB, expected value of test 0, why it scores 0)
DECODE_BOMBS = {
    "nested 4 million deep": ("[" * MIB4, 3, "no output"),
    "two million elements": (_answer(_filled("[", "0,", "0]")), [0, 0, 0], "wrong value"),
    "a million empty lists": (_answer(_filled("[", "[],", "[]]")), [[]] * 3, "no output"),
    "a million shallow towers": (_answer(_filled("[", "[[[[]]]],", "0]")), 3, "no output"),
    "a 4-million-digit decimal int": (_answer("9" * (MIB4 - 20)), 3, "no output"),
    "a 4-million-digit hex int": (
        _answer('{"int": "' + "f" * (MIB4 - 40) + '"}'),
        3,
        "malformed value",
    ),
    "colliding dict keys against an equally long dict": (
        _colliding("dict", 160_000, pair=True),
        dict.fromkeys(range(160_000), 0),
        "wrong value",
    ),
    "colliding set members against an equally long set": (
        _colliding("set", 200_000, pair=False),
        set(range(200_000)),
        "wrong value",
    ),
    "two million junk lines": ("x\n" * (MIB4 // 2), 3, "no output"),
    "four million blank lines": ("\n" * MIB4, 3, "no output"),
}


@pytest.mark.parametrize("name", sorted(DECODE_BOMBS))
def test_a_hostile_4_mib_answer_is_refused_or_judged_wrong(name):
    channel, expected, why = DECODE_BOMBS[name]
    assert len(channel) >= 3 * 2**20 or "colliding" in name  # colliding: 2.5 MiB and up
    plan = plan_tests({"calls": [{"function": "f", "args": [], "expected": expected}] * 2})
    verdict = judge(plan, channel, deadline=time.monotonic() + 600)
    assert (verdict.passed, verdict.total, verdict.late) == (0, 2, False)
    assert verdict.failure.startswith(f"test 0: {why}"), verdict.failure


def test_a_right_answer_of_4_mib_still_passes():
    text = "ab[{" * (MIB4 // 8)  # brackets inside a string are no containers
    plan = plan_tests({"calls": [{"function": "f", "args": [], "expected": [text, {1: text}]}]})
    channel = _answer(json.dumps([text, {"dict": [[1, text]]}]))
    assert judge(plan, channel).passed == 1
    stdio = plan_tests({"stdio": [["", text]]})
    assert judge(stdio, json.dumps({"i": 0, "stdout": text + "  \n"})).passed == 1


def test_judging_stops_at_the_deadline():
    plan = plan_tests({"calls": [{"function": "f", "args": [], "expected": list(range(5000))}]})
    verdict = judge(plan, _answer(json.dumps(list(range(5000)))), deadline=time.monotonic() - 1)
    assert verdict.late and verdict.answered == 0 and verdict.passed == 0
    plan = plan_tests({"asserts": TESTS})
    gone = run_tests(GOOD, plan, limits=Limits(**LIMITS), deadline=time.monotonic() - 1)
    assert gone.status == "timeout" and CodeReward(**LIMITS).judge(gone).score == 0.0
    on_time = run_tests(GOOD, plan, limits=Limits(**LIMITS), deadline=time.monotonic() + 30)
    assert on_time.status == "passed"


COLLIDING_PROGRAM = (
    "import os\nM = 2**61 - 1\n"
    "pairs = ', '.join(f'[{k * M}, 1]' for k in range(130_000))\n"
    'os.write(3, (\'{"i": 0, "value": {"dict": [\' + pairs + \']}}\\n\').encode())\n'
    "def ones(n):\n    return None\n"
)
ONES = {
    "calls": [{"function": "ones", "args": [130_000], "expected": dict.fromkeys(range(130_000), 1)}]
}


def test_every_scoring_path_judges_a_hostile_answer_within_the_call():
    """Direct, pool, tool environment and trace (``score_one``) paths: 0, with the judge's reason."""
    from rlax.core.rollout.reward_pool import RewardPool, score_one
    from rlax.plugins.environments.python_tool import PythonToolEnvironment

    reward = CodeReward(**LIMITS)
    text = f"```python\n{COLLIDING_PROGRAM}```"
    wanted = "failed 0/1: test 0: wrong value"
    assert reward.score(prompt(ONES), text).reason.startswith(wanted)
    assert score_one(reward, prompt(ONES), text) == (0.0, reward.score(prompt(ONES), text).reason)
    with RewardPool(reward, workers=1, timeout_s=120.0) as pool:
        scored = pool.score([prompt(ONES)], [text])
    assert scored.timeouts == scored.errors == 0 and scored.reasons[0].startswith(wanted)
    episode = PythonToolEnvironment(reward=reward).start(prompt(ONES), tokenizer=None)
    assert episode.step(text) is None  # an answer, no tool call: scored by the reward
    assert episode.reward().score == 0.0 and episode.reward().reason.startswith(wanted)


def test_an_isclose_tolerance_must_be_a_real_number():
    assert (
        plan_tests({"asserts": ["assert math.isclose(f(1), 0.5, rel_tol=1e-3 * 2)"]}).mode == "call"
    )
    for tol in ("1j", "'x'", "None"):
        assert plan_tests({"asserts": [f"assert math.isclose(f(1), 0.5, rel_tol={tol})"]}).weak
