"""The filter's exemptions: calls the kernel lets through seccomp, and the start-up check.

``sandbox/exemptions.py`` lists them (``uretprobe``, ``uprobe`` on x86-64)
with the kernels they apply to. The red team's class: programs that call
them, directly, from a thread, in a forked child, with crafted arguments, and
answer ``add`` rightly only if such a call *returned* success (did kernel
work past the filter); all score 0 as root and as nobody.
"""

from __future__ import annotations

import os
import pathlib
import platform
import runpy

import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.rewards.code.verifier import CodeReward
from rlax.plugins.rewards.sandbox import exemptions

HERE = pathlib.Path(__file__).parent
CASES = runpy.run_path(str(HERE / "cases.py"))
SYSCALL, WIN, LIMITS = CASES["SYSCALL"], CASES["WIN"], CASES["LIMITS"]
X86 = os.name == "posix" and platform.machine() == "x86_64"

CHILD = (
    "won = False\n"
    "for number in NUMBERS:\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os._exit(0 if CALL >= 0 else 1)\n"
    "    _, status = os.waitpid(pid, 0)\n"
    "    won = won or status == 0\n"
)
EXEMPT_CALLERS = {
    "uretprobe and uprobe in forked children": "import os\nNUMBERS = (335, 336)\n"
    + CHILD.replace("CALL", "sc(number)"),
    "uprobe with a crafted stack in a child": "import os\nNUMBERS = (336,)\n"
    + CHILD.replace("CALL", "sc(number, 0x7FFF0000, 1 << 40, -1, 0, 0, 0)"),
    "uretprobe from a thread": (
        "import os, threading\nout = []\n"
        "def go():\n    out.append(sc(335))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    t = threading.Thread(target=go)\n    t.start()\n    t.join()\n"
        "    os._exit(0 if out and out[0] >= 0 else 1)\n"
        "won = os.waitpid(pid, 0)[1] == 0\n"
    ),
}


def test_a_kernel_known_exploitable_is_refused_and_a_newer_one_is_not_told(monkeypatch):
    monkeypatch.setattr(exemptions, "EXPLOITABLE", (("uretprobe", (6, 14), (6, 15)),))
    with pytest.raises(exemptions.KernelRefused, match="refuses this kernel"):
        exemptions.check("6.14.3-custom")
    assert exemptions.check("6.15.0").startswith("exempt from the filter: uretprobe")
    assert exemptions.check("6.10.9") == "exempt from the filter: none (none known exploitable)"
    # A stable kernel between the call and the mainline exemption may carry the backport.
    assert exemptions.check("6.13.9") == (
        "exempt from the filter: uretprobe if this stable release took the backport "
        "(none known exploitable)"
    )
    assert exemptions.check("6.18.1").startswith("exempt from the filter: uretprobe, uprobe")
    assert exemptions.check("6.17.1").startswith("exempt from the filter: uretprobe (")
    newer = f"{exemptions.REVIEWED_UP_TO[0]}.{exemptions.REVIEWED_UP_TO[1] + 1}.0"
    assert exemptions.check(newer).startswith("cannot tell")
    assert exemptions.check("unknown").startswith("cannot tell")


def test_each_exemption_is_in_the_docs_with_its_kernel():
    docs = (HERE.parents[3] / "docs" / "rewards_and_data.md").read_text()
    for exempt in exemptions.EXEMPT:
        assert f"`{exempt.name}` ({exempt.number}" in docs
        assert f"{exempt.since[0]}.{exempt.since[1]}" in docs


@pytest.mark.skipif(not X86, reason="x86-64 call numbers")
@pytest.mark.parametrize("name", sorted(EXEMPT_CALLERS))
@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_calling_an_exempt_call_gains_nothing(name):
    reward = CodeReward(**LIMITS)
    source = SYSCALL + EXEMPT_CALLERS[name] + WIN
    prompt = Prompt(id="add", text="", tokens=np.zeros(1, np.int32), answer=CASES["TESTS"]["add"])
    result = reward.run(prompt, f"```python\n{source}```")
    assert reward.judge(result).score == 0.0, (result.detail, result.stderr[-300:])
    assert result.status == "failed" and result.passed == 0  # it ran, and won nothing
    assert result.isolation["filter_exemptions"] == exemptions.this_kernel()
