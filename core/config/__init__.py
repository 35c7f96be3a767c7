"""gin configuration for the CLI: registering configurables and parsing files.

The start-up order (t5x's): build the plugin manager and load its plugins
(which registers each component as a configurable under its kind), call
:func:`register_core_configurables`, then :func:`parse` the gin files and the
command-line bindings with unknown names as errors. Library code never reads
gin; only the CLI calls :func:`configured` to get the configured entry point.

Registering a factory under a gin name is :mod:`rlax.core.configurables` (below the
plugin manager, which registers each plugin kind through it); re-exported here.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import gin

from rlax.core import gin_state
from rlax.core.config import bindings as bindings_mod
from rlax.core.config import checks as binding_checks
from rlax.core.config import spec_building
from rlax.core.config.building import refusing_components
from rlax.core.config.finder import find_gin_file, packaged_configs
from rlax.core.config.gin_errors import MOVED, as_config_error, quiet_gin_logging
from rlax.core.config.reading import include_resolution
from rlax.core.config.spec_building import build_spec, supervised
from rlax.core.configurables import register_configurables
from rlax.core.errors import ConfigError

if TYPE_CHECKING:
    from rlax.core.plugins import PluginManager
    from rlax.core.runtime.run_dir import RunDir

__all__ = [
    "MOVED",
    "build_spec",
    "config_text",
    "configured",
    "find_gin_file",
    "operative_config_text",
    "packaged_configs",
    "parse",
    "register_configurables",
    "register_core_configurables",
    "save_spec",
    "supervised",
]

# -------------------------------------------------------------------------
# Registering configurables
# -------------------------------------------------------------------------


def register_core_configurables() -> None:
    """Registers optax optimisers/schedules (``optax.*``, with their constraints), the run
    specification (``rlax.run``) and its parts (``rlax.train``, ``rlax.worker``, ...), and
    the settings objects they hold.

    Idempotent. Imports optax and the role modules only when called.
    """
    from rlax.core.evaluation import evaluate as evaluation
    from rlax.core.models import lora_config
    from rlax.core.parallel import mesh, multihost, placement
    from rlax.core.param_server import settings
    from rlax.core.param_server.spec import ParamServerSpec
    from rlax.core.runtime import compile_cache, preemption
    from rlax.core.spec import ClusterSpec, EvaluateSpec, RunSpec
    from rlax.core.trainer import checkpoint, observe
    from rlax.core.trainer import optimizer as optim
    from rlax.core.trainer import settings as trainer_settings
    from rlax.core.trainer.spec import TrainerSpec
    from rlax.core.worker.spec import WorkerSpec

    register_configurables("optax", optim.optax_configurables())
    register_configurables(
        "preemption",
        {
            "signals": preemption.SignalNotice,
            "notice_file": preemption.FileNotice,
            "gce_metadata": preemption.GceMetadataNotice,
        },
    )
    register_configurables(
        "rlax",
        {
            # The run specification and each role's part of it (core/spec/run.py).
            "run": RunSpec,
            "train": TrainerSpec,
            "worker": WorkerSpec,
            "param_server": ParamServerSpec,
            "local_cluster": ClusterSpec,
            "evaluate": EvaluateSpec,
            # The settings objects they hold.
            "clipped_optimizer": optim.clipped_optimizer,
            "ps_settings": settings.ServerSettings,
            "mesh": mesh.MeshConfig,
            "trainer_settings": trainer_settings.TrainerSettings,
            "checkpointing": checkpoint.CheckpointSettings,
            "held_out": evaluation.HeldOutSettings,
            "watch": observe.WatchSettings,
            "lora": lora_config.LoraConfig,
            "distributed": multihost.DistributedSettings,
            "compile_cache": compile_cache.CompileCacheSettings,
            "placement": placement.Placement,
        },
    )


def configured(module: str, name: str) -> Callable[..., Any]:
    """Returns the gin-wrapped callable ``<module>.<name>`` (bindings applied on call).

    A component that refuses its settings while gin builds the callable's
    arguments raises ConfigError (:func:`~rlax.core.config.building.refusing_components`).

    Raises:
      ConfigError: nothing is registered under that name.
    """
    selector = f"{module}.{name}"
    if not gin_state.is_registered(selector):
        raise ConfigError(f"no gin configurable {selector!r} is registered")
    return refusing_components(gin.get_configurable(selector))


def operative_config_text() -> str:
    """The values actually used so far (gin's operative config), as gin text.

    (``run_files.save_run_config`` writes this and :func:`config_text` into a run directory.)
    """
    return gin.operative_config_str()


def config_text() -> str:
    """Every value bound by the parsed files and bindings, as gin text."""
    return gin.config_str()


# -------------------------------------------------------------------------
# Parsing
# -------------------------------------------------------------------------


def parse(
    gin_files: Sequence[str | os.PathLike[str]],
    bindings: Sequence[str] = (),
    *,
    plugins: PluginManager | None = None,
) -> None:
    """Replaces the process's gin config with these files and bindings, then locks it.

    ``include`` paths resolve against the including file's directory first,
    then the working directory, then rlax's packaged configs (so a file of
    your own can ``include 'quickstart.gin'`` or ``'algorithms/dapo.gin'`` from
    anywhere: :mod:`rlax.core.config.finder`). Unknown
    configurables and parameters are errors, and so is a ``%gin.REQUIRED``
    value left unset; then the bound values are checked
    (:mod:`rlax.core.config.checks`).

    Args:
      gin_files: gin files, parsed in order.
      bindings: single bindings such as ``"train.steps=10"``, parsed after
        the files (so they override them).
      plugins: the loaded plugin manager, used to list the valid names when a
        plugin reference such as ``@algorithms.nope()`` is unknown.

    Raises:
      ConfigError: a file is missing or malformed, or a binding is wrong; the
        message starts with ``FILE:LINE:`` (or the binding) and says what.
    """
    gin.clear_config()
    origins = bindings_mod.Origins()
    with include_resolution(), quiet_gin_logging():
        for path in [find_gin_file(f) for f in gin_files]:
            with as_config_error(plugins), bindings_mod.recording(origins):
                gin.parse_config_file(path)
        for binding in bindings:
            with (
                as_config_error(plugins, binding=binding),
                bindings_mod.recording(origins, binding),
            ):
                gin.parse_config(binding)
    with as_config_error(plugins):
        binding_checks.check_required(origins)
        bindings_mod.resolve_paths(origins)
        binding_checks.check_types(origins, plugins)
        binding_checks.check_constraints(origins)
        binding_checks.check_values(
            origins, {**_validators(), **binding_checks.declared_validators()}
        )
        binding_checks.check_settings_used(origins, SETTINGS_TAKEN_BY, WIRED_BY_ROLES)
        gin.finalize()
    _PARSED[:] = [origins]


_PARSED: list[bindings_mod.Origins] = []  # where the last parse's bindings came from


def save_spec(run_dir: RunDir) -> tuple[pathlib.Path, dict[str, str]]:
    """Writes the parsed config to ``RUN/spec.gin`` for the run's children
    (:func:`rlax.core.config.spec_building.save_spec`), its relative paths made absolute
    first: a path given on the command line is relative to this process's working
    directory, and read back from the run's folder it would name another file."""
    if _PARSED:
        with gin.unlock_config():
            bindings_mod.resolve_paths(_PARSED[0], command_line=True)
    return spec_building.save_spec(run_dir)


# Settings objects and the one parameter that takes each: their bindings count only through it.
SETTINGS_TAKEN_BY: dict[str, str] = {
    "rlax.train": "rlax.run.train",
    "rlax.worker": "rlax.run.worker",
    "rlax.param_server": "rlax.run.param_server",
    "rlax.local_cluster": "rlax.run.local_cluster",
    "rlax.evaluate": "rlax.run.evaluate",
    "rlax.ps_settings": "rlax.run.server",
    "rlax.held_out": "rlax.run.held_out",
    "rlax.compile_cache": "rlax.run.compile_cache",
    "rlax.placement": "rlax.run.placement",
    "rlax.checkpointing": "rlax.train.checkpointing",
    "rlax.watch": "rlax.train.watch",
    "rlax.trainer_settings": "rlax.train.trainer_settings",
    "rlax.mesh": "rlax.train.mesh",
    "rlax.lora": "rlax.train.lora",
    "rlax.distributed": "rlax.train.distributed",
}
# Those configs/base/roles.gin binds to their parameter; the others are bound by choice.
WIRED_BY_ROLES = frozenset(SETTINGS_TAKEN_BY) - {
    "rlax.trainer_settings",
    "rlax.mesh",
    "rlax.lora",
    "rlax.distributed",
}


def _validators() -> dict[str, Callable[..., None]]:
    """Checks of a configurable's settings taken together, run on the bound literals
    (one setting alone is held to its annotation: :mod:`rlax.core.constraints`)."""
    from rlax.core.evaluation.evaluate import HeldOutSettings

    def held_out(*, samples: int = 8, ks: Any = (1, 8), **_: Any) -> None:
        HeldOutSettings(samples=samples, ks=ks)  # its own check

    return {"rlax.held_out": held_out}
