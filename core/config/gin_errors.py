"""gin's errors in rlax's words: one line ``WHERE: WHAT`` naming the file and line (or the
``--gin.`` binding), the valid names where a name is unknown, the new name of a setting
that moved, and never the whole config some of gin's messages append."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rlax.core.config import bindings as bindings_mod
from rlax.core.errors import ConfigError

if TYPE_CHECKING:
    from rlax.core.plugins import PluginManager

__all__ = ["MOVED", "as_config_error", "quiet_gin_logging"]


# Settings that moved (all packaged configs are moved; there is no shim): role parameters
# that became the run specification's own (one value for every role), and settings that
# moved to the part of the run they belong to. An old binding is refused naming the new one.
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
    # Settings that moved to the part of the run they belong to.
    "rlax.ps_settings.relay_fanout": "weight_lanes.relay.fanout",
    "rlax.ps_settings.relay_direct": "weight_lanes.relay.direct",
    "rlax.ps_settings.relay_host": "weight_lanes.relay.host",
    "rlax.ps_settings.weight_shards": "weight_lanes.split.shards",
    "rlax.local_cluster.trainer_cores": "rlax.placement.trainer_cores",
    "rlax.local_cluster.worker_cores": "rlax.placement.worker_cores",
}


class _GinLogFilter(logging.Filter):
    """Drops what gin logs itself while it reads files (a missing include's "Path not
    found"): the ConfigError that follows says it once, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}gin{os.sep}" not in record.pathname


@contextlib.contextmanager
def quiet_gin_logging() -> Iterator[None]:
    quiet = _GinLogFilter()
    root = logging.getLogger()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


_LOCATION = re.compile(r'\n\s*In file "(?P<file>[^"]*)", line (?P<line>\d+)')
_NO_PARAMETER = re.compile(
    r"Configurable '(?P<selector>[\w.]+)' doesn't have a parameter named '(?P<arg>\w+)'"
)
_UNKNOWN = re.compile(r"No configurable matching (?:reference )?'@?(?P<selector>[\w./]+)")


@contextlib.contextmanager
def as_config_error(plugins: PluginManager | None, binding: str | None = None) -> Iterator[None]:
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
            if moved.startswith(("rlax.run.", "rlax.held_out."))
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
