"""The algorithms' public surface: ``rlax.plugins.algorithms.__all__``, as optax's ``__init__``.

A third-party algorithm imports names, not module paths; importing the
package registers nothing.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

from rlax.core.plugins import build_plugin_manager
from rlax.plugins import algorithms


def test_the_algorithms_surface_names_what_its_modules_define():
    modules = [
        importlib.import_module(f"{algorithms.__name__}.{info.name}")
        for info in pkgutil.iter_modules(algorithms.__path__)
    ]
    assert len(algorithms.__all__) == len(set(algorithms.__all__))
    for name in algorithms.__all__:
        value = getattr(algorithms, name)
        homes = {m.__name__ for m in modules if getattr(m, name, None) is value}
        assert homes, f"{name} is not a name of any algorithms module"
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ in homes, f"{name} is defined in {value.__module__}"


def test_every_factory_and_building_block_is_public():
    # Hand-listed: each shipped algorithm's factory, and the pieces a new one composes.
    factories = {
        "grpo",
        "dapo",
        "drgrpo",
        "gspo",
        "cispo",
        "rloo",
        "reinforcepp",
        "reinforcepp_baseline",
        "ppo",
        "distill",
    }
    pieces = {
        "group_normalized",
        "group_centered",
        "leave_one_out",
        "raw_returns",
        "Aggregation",
        "aggregate",
        "Alignment",
        "ClippedSurrogate",
        "SequenceClippedSurrogate",
        "ClippedISWeight",
        "clipped_surrogate",
        "k3_kl",
        "kl_estimate",
        "Distillation",
        "completion_width",
        "Returns",
        "gae",
        "whiten",
        "ValueLoss",
        "PolicyGradient",
        "alignment_of",
        "settings_of",
    }
    assert factories | pieces <= set(algorithms.__all__)
    registered = build_plugin_manager(autoload=False).names("algorithms")
    assert set(registered) == factories
    for name in factories:
        assert build_plugin_manager(autoload=False).get("algorithms", name).factory is getattr(
            algorithms, name
        )


def test_importing_the_algorithms_registers_nothing():
    # In a fresh process: no gin configurable of the kind exists afterwards, and no
    # other plugin package is imported (loading is the plugin manager's, on request)
    # but the critics, whose head is PPO's default critic.
    code = (
        "import sys, rlax.plugins.algorithms as a\n"
        "from rlax.core import gin_state\n"
        "print(sorted(k for k in gin_state.registered_selectors() if k.startswith('algorithms.')),"
        " sorted({m.split('.')[2] for m in sys.modules if m.startswith('rlax.plugins.')}),"
        " a.grpo.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "['algorithms',", "'critics']", "grpo"]
