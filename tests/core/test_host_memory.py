"""Host memory reuse (rlax.core.parallel.host_memory): page faults per call, modes, and when it is too late."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import textwrap

import jax
import pytest

from rlax.core import cli
from rlax.core.parallel import host_memory

pytestmark = pytest.mark.serial  # counts page faults: another process's load moves them

# A program whose scratch buffer is SIZE**2 floats (the [SIZE, SIZE] product
# must exist for the matmul that reads it). Prints what reuse_freed_memory did,
# the scratch size and the minor page faults of each of CALLS calls.
FAULTS_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    from rlax.core.parallel.host_memory import keep_message_buffers, reuse_freed_memory
    applied = reuse_freed_memory(sys.argv[1])
    if len(sys.argv) > 2:  # a parameter-server client or server in the process
        keep_message_buffers()
    import jax, jax.numpy as jnp

    @jax.jit
    def f(x, w):
        return (jnp.sin(x[:, None] * x[None, :]) @ w).sum()

    x, w = jnp.linspace(0, 1, SIZE), jnp.ones((SIZE, 4))
    scratch = f.lower(x, w).compile().memory_analysis().temp_size_in_bytes
    f(x, w).block_until_ready()
    faults = []
    for _ in range(CALLS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        value = float(f(x, w))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"applied": applied, "scratch": scratch, "faults": faults, "value": value}))
    """
)


CALLS = 30


def _faults(mode: str, *more: str, size: int = 4096, calls: int = CALLS) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RLAX_HOST_MALLOC", "XLA_FLAGS")}
    script = FAULTS_SCRIPT.replace("CALLS", str(calls)).replace("SIZE", str(size))
    proc = subprocess.run(
        [sys.executable, "-c", script, mode, *more],
        env={**env, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _refaulted(run: dict, pages: int) -> int:
    """How many calls faulted in more than a tenth of the scratch's pages."""
    return sum(faults > pages / 10 for faults in run["faults"])


@pytest.fixture
def fresh(monkeypatch):
    """host_memory as if never called in this process."""
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.delenv(host_memory.ENV, raising=False)
    return host_memory


def test_reused_scratch_is_not_faulted_in_again_on_every_call():
    # 64 MB of scratch: above the 32 MB glibc serves from an arena by default.
    reused, system = _faults("reuse"), _faults("system")
    assert system["applied"] == "system"
    assert reused["value"] == system["value"]
    if platform.libc_ver()[0] != "glibc":
        assert reused["applied"] == "unsupported"
        return
    assert reused["applied"] == "reused"
    pages = reused["scratch"] // 4096
    assert pages >= 16384  # the 64 MB product is scratch
    # Left alone, glibc maps each call's scratch afresh: every call faults it all in again.
    assert all(faults >= 0.9 * pages for faults in system["faults"])
    # Kept, the calls reuse the same memory. Not every call: until the heap has
    # room for the scratch beside JAX's small allocations it grows by one
    # scratch now and then (measured: 1-2 growths in 30 calls, 5-9 in 60).
    assert _refaulted(reused, pages) < CALLS / 2


def test_a_parameter_server_client_in_the_process_keeps_a_large_scratch_reused():
    # A trainer holds a client, whose message-buffer setting (a 1 GB trim
    # threshold) would hand a freed scratch of over 1 GB back to the kernel.
    calls = 12
    run = _faults("reuse", "client", size=17000, calls=calls)  # 1.1 GB of scratch
    if platform.libc_ver()[0] != "glibc":
        assert run["applied"] == "unsupported"
        return
    assert run["applied"] == "reused"
    pages = run["scratch"] // 4096
    assert pages > (1 << 30) // 4096
    # Handed back, every call faults it all in again (as the test above shows for
    # glibc's own settings). Kept, the heap grows by a scratch on some calls and the
    # others reuse it: how many grow depends on how XLA's threads interleave their
    # small allocations (measured: 2-8 of 12), but some calls always reuse it.
    assert _refaulted(run, pages) <= calls - 2


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return 1


def test_message_buffers_raise_the_mmap_and_trim_thresholds_once(fresh, monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(host_memory, "_messages_kept", False)
    monkeypatch.setattr(host_memory.ctypes, "CDLL", lambda name: libc)
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("glibc", "2.36"))
    host_memory.keep_message_buffers()
    host_memory.keep_message_buffers()
    assert libc.calls == [(-3, 256 << 20), (-1, 1024 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD


def test_message_buffers_leave_reused_memory_alone(fresh, monkeypatch):
    monkeypatch.setattr(host_memory, "_messages_kept", False)
    monkeypatch.setattr(host_memory, "_applied", "reused")
    monkeypatch.setattr(host_memory.ctypes, "CDLL", _no_libc)
    host_memory.keep_message_buffers()


def test_reuse_sets_one_arena_no_mmap_and_no_trim(fresh, monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(host_memory.ctypes, "CDLL", lambda name: libc)
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(host_memory, "_backend_started", lambda: False)
    assert host_memory.reuse_freed_memory("reuse") == "reused"
    assert libc.calls == [(-8, 1), (-4, 0), (-1, -1)]  # M_TRIM_THRESHOLD -1: never trim


def test_after_jax_started_its_backend_it_is_too_late_and_malloc_is_left_alone(
    fresh, monkeypatch, caplog
):
    jax.devices()  # the backend (and its worker threads) exist
    monkeypatch.setattr(host_memory.ctypes, "CDLL", _no_libc)
    with caplog.at_level(logging.WARNING, logger=host_memory.__name__):
        assert fresh.reuse_freed_memory("reuse") == "too late"
    assert "already running" in caplog.text
    # The first answer stands for the process.
    assert fresh.reuse_freed_memory("system") == "too late"


def test_auto_leaves_malloc_alone_when_jax_is_to_run_on_an_accelerator(fresh, monkeypatch):
    monkeypatch.setattr(host_memory.ctypes, "CDLL", _no_libc)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
    assert fresh.reuse_freed_memory() == "system"


def test_auto_on_the_cpu_means_reuse(fresh, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host_memory._cpu_backend_expected()
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert not host_memory._cpu_backend_expected()


def test_system_mode_never_touches_malloc(fresh, monkeypatch):
    monkeypatch.setattr(host_memory.ctypes, "CDLL", _no_libc)
    monkeypatch.setenv(host_memory.ENV, "System")
    assert fresh.reuse_freed_memory() == "system"


def test_an_unknown_mode_is_an_error_naming_the_variable(fresh, monkeypatch):
    monkeypatch.setenv(host_memory.ENV, "always")
    with pytest.raises(ValueError, match=r"RLAX_HOST_MALLOC='always': expected one of auto"):
        fresh.reuse_freed_memory()


def test_the_command_line_rejects_an_unknown_mode_before_doing_anything(fresh, monkeypatch, capsys):
    monkeypatch.setenv(host_memory.ENV, "sometimes")
    assert cli.main(["plugins"]) == cli.EXIT_USAGE
    assert "RLAX_HOST_MALLOC='sometimes'" in capsys.readouterr().err


def _no_libc(*args, **kwargs):
    raise AssertionError("malloc must be left alone here")
