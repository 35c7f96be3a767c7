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

import contextlib
import logging
import os
import pathlib
import re
import tokenize
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any

import gin

from rlax.core import gin_state
from rlax.core.config import bindings as bindings_mod
from rlax.core.config import checks as binding_checks
from rlax.core.config.building import refusing_components
from rlax.core.config.finder import find_gin_file, find_packaged, packaged_configs
from rlax.core.config.spec_building import build_spec, save_spec
from rlax.core.configurables import register_configurables
from rlax.core.errors import ConfigError

if TYPE_CHECKING:
    from rlax.core.plugins import PluginManager

__all__ = [
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
    from rlax.core.models import lora
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
            "lora": lora.LoraConfig,
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
    with _include_resolution(), _quiet_gin_logging():
        for path in [find_gin_file(f) for f in gin_files]:
            with _as_config_error(plugins), bindings_mod.recording(origins):
                gin.parse_config_file(path)
        for binding in bindings:
            with (
                _as_config_error(plugins, binding=binding),
                bindings_mod.recording(origins, binding),
            ):
                gin.parse_config(binding)
    with _as_config_error(plugins):
        binding_checks.check_required(origins)
        bindings_mod.resolve_paths(origins)
        binding_checks.check_types(origins, plugins)
        binding_checks.check_constraints(origins)
        binding_checks.check_values(
            origins, {**_validators(), **binding_checks.declared_validators()}
        )
        binding_checks.check_settings_used(origins, SETTINGS_TAKEN_BY)
        gin.finalize()


# Role parameters that became the run specification's own (one value for every role):
# an old binding of one is refused with the name to bind instead.
_ROLE_PARTS = ("rlax.train", "rlax.worker", "rlax.param_server", "rlax.evaluate")
MOVED: dict[str, str] = {
    **{
        f"{role}.{name}": f"rlax.run.{name}"
        for role in _ROLE_PARTS
        for name in (
            "task",
            "reward",
            "sampler",
            "curation",
            "init_checkpoint",
            "seed",
            "prompts_per_step",
            "group_size",
            "max_staleness",
            "reload_staleness",
            "deterministic",
        )
    },
    **{f"{role}.settings": "rlax.run.server" for role in (*_ROLE_PARTS, "rlax.local_cluster")},
    "rlax.train.held_out": "rlax.run.held_out",
    "rlax.evaluate.eval_samples": "rlax.held_out.samples",
    "rlax.evaluate.eval_ks": "rlax.held_out.ks",
    "rlax.local_cluster.trainer_cores": "rlax.placement.trainer_cores",
    "rlax.local_cluster.worker_cores": "rlax.placement.worker_cores",
}


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
}


def _validators() -> dict[str, Callable[..., None]]:
    """Checks of a configurable's settings taken together, run on the bound literals
    (one setting alone is held to its annotation: :mod:`rlax.core.constraints`)."""
    from rlax.core.evaluation.evaluate import HeldOutSettings

    def held_out(*, samples: int = 8, ks: Any = (1, 8), **_: Any) -> None:
        HeldOutSettings(samples=samples, ks=ks)  # its own check

    return {"rlax.held_out": held_out}


_INCLUDING_DIRS: list[str] = []  # directory of each gin file being parsed, innermost last


def _resolve(path: str) -> str | None:
    """An ``include``: the including file's folder, the working directory, the packaged configs."""
    if os.path.isabs(path):
        return path if os.path.isfile(path) else None
    if _INCLUDING_DIRS:
        candidate = os.path.join(_INCLUDING_DIRS[-1], path)
        if os.path.isfile(candidate):
            return candidate
    if os.path.isfile(path):
        return path
    return find_packaged(path)


def _check_utf8(path: str) -> None:
    """ConfigError naming the file, line and column of the first byte that is not UTF-8."""
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError:
        return  # open() below says what is wrong
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}); "
            "gin files are read as UTF-8: save it as UTF-8"
        ) from None


@contextlib.contextmanager
def _open_gin_file(path: str) -> Iterator[IO[str]]:
    resolved = _resolve(path) or path
    _check_utf8(resolved)
    with open(resolved, encoding="utf-8") as f:
        _INCLUDING_DIRS.append(os.path.dirname(resolved))
        try:
            yield f
        except tokenize.TokenError as exc:  # e.g. an unclosed bracket: gin gives no file
            raise SyntaxError(exc.args[0], (resolved, exc.args[1][0], 0, "")) from exc
        finally:
            _INCLUDING_DIRS.pop()


class _GinLogFilter(logging.Filter):
    """Drops what gin logs itself while it reads files (a missing include's "Path not
    found"): the ConfigError that follows says it once, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}gin{os.sep}" not in record.pathname


@contextlib.contextmanager
def _quiet_gin_logging() -> Iterator[None]:
    quiet = _GinLogFilter()
    root = logging.getLogger()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


@contextlib.contextmanager
def _include_resolution() -> Iterator[None]:
    """Puts rlax's gin file reader first while parsing (gin has no public API for order)."""
    with gin_state.first_file_reader((_open_gin_file, lambda path: _resolve(path) is not None)):
        yield


_LOCATION = re.compile(r'\n\s*In file "(?P<file>[^"]*)", line (?P<line>\d+)')
_NO_PARAMETER = re.compile(
    r"Configurable '(?P<selector>[\w.]+)' doesn't have a parameter named '(?P<arg>\w+)'"
)
_UNKNOWN = re.compile(r"No configurable matching (?:reference )?'@?(?P<selector>[\w./]+)")


@contextlib.contextmanager
def _as_config_error(plugins: PluginManager | None, binding: str | None = None) -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:
        text = str(exc)
        if not _LOCATION.search(text):
            raise
        # gin appended where an include of the file at fault was: one line instead
        chain = "".join(
            f" (included from {m['file']}:{m['line']})" for m in _LOCATION.finditer(text)
        )
        raise ConfigError(re.split(r"\n\s*In file", text, maxsplit=1)[0] + chain) from exc
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else f"--gin.{binding}"
        raise ConfigError(f"{where}: syntax error: {_syntax_message(exc.msg)}") from exc
    except Exception as exc:  # anything gin raises while parsing is a config error
        raise ConfigError(_describe(str(exc), plugins, binding)) from exc


_BAD_TOKEN = re.compile(r"Failed to parse token '(?P<token>[^']*)'")
_NO_MACRO = re.compile(r"No bindings specified for '(?P<name>[\w.]+)/gin\.macro'")
_NOT_CALLED = re.compile(r"Reference '(?P<ref>[^']+)' must be evaluated")
_NO_INCLUDE = re.compile(r"Unable to open file: (?P<path>.+?)\. Searched config paths")


def _without_config_dump(what: str) -> str:
    """gin's message in one line: the whole config it appends to some messages cut off, and
    those messages said in rlax's words."""
    if macro := _NO_MACRO.search(what):
        name = macro["name"]
        return (
            f"%{name} is used but never set: set {name} = ... in a gin file "
            f"(or --gin.{name}=...), or bind a value instead"
        )
    if called := _NOT_CALLED.search(what):
        return f"{called['ref']} must be called to build it: write {called['ref']}()"
    if include := _NO_INCLUDE.search(what):
        return (
            f"include {include['path']!r}: no such file beside the including file, in the "
            "working directory or among rlax's packaged configs"
        )
    return what.split(" in config string:")[0].strip()


def _syntax_message(message: str) -> str:
    """gin's message in one line; a bare word gets a hint instead of an ``ast`` node's repr."""
    bad = _BAD_TOKEN.search(message)
    if bad and "malformed node" in message:
        token = bad["token"]
        return (
            f"{token} is not a value (a string is quoted: '{token}'; a macro is "
            f"%{token}; a configurable is @{token}())"
        )
    return " ".join(message.split())


def _describe(message: str, plugins: PluginManager | None, binding: str | None) -> str:
    """Rewrites gin's message as ``WHERE: WHAT`` (innermost file first)."""
    locations = list(_LOCATION.finditer(message))
    what = re.split(r"\n\s*In (?:file|bindings string)", message, maxsplit=1)[0].strip()
    what = _without_config_dump(what)
    unknown = _UNKNOWN.search(what)
    missing = _NO_PARAMETER.search(what)
    if missing and (moved := MOVED.get(f"{missing['selector']}.{missing['arg']}")):
        what = (
            f"{missing['selector']}.{missing['arg']} is the run's now, one value for every "
            f"role: bind {moved} instead (configs/base/roles.gin)"
            if moved.startswith("rlax.run.")
            else f"{missing['selector']}.{missing['arg']} moved: bind {moved} instead"
        )
    elif missing:
        names = bindings_mod.parameter_names(missing["selector"])
        what = f"{missing['selector']} has no parameter {missing['arg']!r}"
        what += bindings_mod.closest_names(missing["arg"], names) if names else ""
    if unknown and plugins is not None:
        kind, _, name = unknown["selector"].rpartition("/")[2].rpartition(".")
        if kind in plugins.kinds:
            valid = ", ".join(plugins.names(kind)) or "(none registered)"
            what = f"{what} No {kind} plugin is named {name!r}; valid {kind}: {valid}"
    if locations:
        first, *outer = locations
        where = f"{first['file']}:{first['line']}"
        chain = "".join(f" (included from {m['file']}:{m['line']})" for m in outer)
        return f"{where}: {what}{chain}"
    if binding is not None:
        return f"--gin.{binding}: {what}"
    return what
