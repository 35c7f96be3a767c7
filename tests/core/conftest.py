"""Fixtures for the plugin, config and CLI tests: fake installed distributions."""

from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import pathlib
import sys
import textwrap

import numpy as np
import pytest

from rlax.core import plugins
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.server import ParamServer
from rlax.core.param_server.settings import ServerSettings
from rlax.core.types import Prompt

REWARD_PLUGIN = """
    from rlax.core import hookimpl

    class {cls}:
        def __init__(self, *, weight: float = 1.0):
            self.weight = weight

        def score(self, prompt, completion_text):
            return self.weight * len(completion_text)

    @hookimpl
    def rlax_register_rewards():
        return {{{names}}}
"""


# The components of a run, as a plugin installs them (nothing here loads a model).
RUN_PLUGIN = """
    from rlax.core import hookimpl

    class Task:
        def prompts(self, split, *, tokenizer, seed):
            return iter(())

    class Reward:
        def score(self, prompt, completion_text):
            return 0.0

    class Sampler:
        temperature = 1.0

    class Algorithm:
        pass

    @hookimpl
    def rlax_register_tasks():
        return {"fake": Task}

    @hookimpl
    def rlax_register_rewards():
        return {"fake": Reward}

    @hookimpl
    def rlax_register_samplers():
        return {"fake": Sampler}

    @hookimpl
    def rlax_register_algorithms():
        return {"fake": Algorithm}
"""

# A whole run of those components, wired by roles.gin.
RUN_GIN = """
include 'roles.gin'
TASK = @tasks.fake()
REWARD = @rewards.fake()
SAMPLER = @samplers.fake()
INIT_CHECKPOINT = 'model'  # beside this file
rlax.train.algorithm = @algorithms.fake()
rlax.train.optimizer = @optax.sgd()
optax.sgd.learning_rate = 0.1
"""


class FakeSite:
    """A site-packages directory of fake distributions with ``rlax`` entry points.

    While the fixture is active, the plugin manager sees only these entry
    points (never the installed built-ins), so each test controls every plugin.
    """

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def install(
        self, dist: str, version: str, entry_points: dict[str, str], *, ep_name: str = ""
    ) -> None:
        """Installs ``dist``: each entry point ``name`` is a module ``name`` with that source.

        ``ep_name`` renames the (single) entry point while keeping its module.
        """
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = "".join(f"{ep_name or name} = {name}\n" for name in entry_points)
        (info / "entry_points.txt").write_text(f"[rlax]\n{lines}")
        for name, source in entry_points.items():
            self.module(name, source)

    def module(self, name: str, source: str) -> str:
        """Writes an importable module (not an entry point); returns its name."""
        (self.root / f"{name}.py").write_text(textwrap.dedent(source))
        self.modules.append(name)
        importlib.invalidate_caches()
        return name

    @staticmethod
    def rewards(*names: str, cls: str = "Reward") -> str:
        """Source of a plugin registering class ``cls`` as each reward in ``names``."""
        return REWARD_PLUGIN.format(cls=cls, names=", ".join(f"{n!r}: {cls}" for n in names))

    def install_run_components(self) -> None:
        """Installs RUN_PLUGIN: a task, a reward, a sampler and an algorithm that load nothing."""
        if "fake_run" not in self.modules:
            self.install("rlax-fake-run", "1.0", {"fake_run": RUN_PLUGIN})

    @staticmethod
    def run_gin(folder: pathlib.Path, more: str = "") -> str:
        """Writes ``folder/exp.gin``, RUN_GIN and ``more``, beside the (empty) model folder
        it names; returns its path."""
        (folder / "model").mkdir(exist_ok=True)
        path = folder / "exp.gin"
        path.write_text(RUN_GIN + more)
        return str(path)

    def entry_points(self) -> list[importlib.metadata.EntryPoint]:
        return [
            ep
            for dist in importlib.metadata.distributions(path=[str(self.root)])
            for ep in dist.entry_points
            if ep.group == plugins.ENTRY_POINT_GROUP
        ]


@pytest.fixture
def site(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "site"
    root.mkdir()
    fake = FakeSite(root)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(plugins, "installed_entry_points", fake.entry_points)
    monkeypatch.delenv(plugins.AUTOLOAD_ENV, raising=False)
    yield fake
    for name in fake.modules:
        sys.modules.pop(name, None)


# -- a real parameter server on a free loopback port (param_server and worker tests) --


TOKEN = "test-token"


def prompts():
    for i in itertools.count():
        yield Prompt(
            id=f"p{i}", text=f"{i}=", tokens=np.array([1, 3 + i % 5], np.int32), answer=str(i)
        )


class Running:
    def __init__(self, **kwargs):
        settings = kwargs.pop(
            "settings",
            ServerSettings(address="127.0.0.1:0", token=TOKEN, max_message_mb=8, chunk_mb=1),
        )
        self.server = ParamServer(
            settings, prompts(), **{"capacity": 8, "lease_ttl_s": 60.0, **kwargs}
        )
        port = self.server.start()
        self.settings = ServerSettings(**{**settings.__dict__, "address": f"127.0.0.1:{port}"})
        self.client = ParamServerClient(self.settings, retry_s=0.0)

    def stop(self):
        self.client.close()
        self.server.stop(grace=None)


@pytest.fixture
def ps():
    running = Running()
    yield running
    running.stop()


@pytest.fixture
def make_ps():
    made = []

    def make(**kwargs):
        made.append(Running(**kwargs))
        return made[-1]

    yield make
    for r in made:
        r.stop()
