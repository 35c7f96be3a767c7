"""The plugin manager: finds plugins, collects their components, exposes them to gin.

Built-in plugins and third-party ones load the same way, through the
entry-point group ``rlax`` (``[project.entry-points.rlax]`` in a
``pyproject.toml``). Nothing loads at import time: build a manager and load
it explicitly::

    pm = build_plugin_manager(disabled=("zero_variance",))
    pm.get("algorithms", "grpo").factory

Switches, as in pytest: ``RLAX_DISABLE_PLUGIN_AUTOLOAD=1`` skips the entry
points of every other distribution (third-party plugins); the built-ins, the
entry points of rlax's own distribution ``rlax-llm``, still load, and so do
the plugins named in ``extra`` (an entry-point name included). ``disabled``
blocks plugins by name, built-ins included (the CLI's ``-p no:NAME``).
``builtins=False`` leaves the built-ins out too (an empty manager for tests).

Every component becomes the gin configurable ``<kind>.<name>``, e.g.
``@algorithms.grpo()``; the gin module of each kind holds exactly the
components of the manager loaded last.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import re
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pluggy

from rlax.core import PROJECT_NAME, hookspecs
from rlax.core.configurables import register_configurables
from rlax.core.errors import DuplicatePluginError, PluginError, PluginLoadError, UnknownPluginError

__all__ = [
    "AUTOLOAD_ENV",
    "BUILTIN_DISTRIBUTION",
    "CONTRACTS",
    "ENTRY_POINT_GROUP",
    "KINDS",
    "Component",
    "PluginManager",
    "autoload_notice",
    "build_plugin_manager",
    "installed_entry_points",
    "is_builtin",
]

ENTRY_POINT_GROUP = "rlax"
AUTOLOAD_ENV = "RLAX_DISABLE_PLUGIN_AUTOLOAD"
BUILTIN_DISTRIBUTION = "rlax-llm"  # its entry points are the built-in plugins

# Component kind (also its gin module) -> the registration hook that provides it.
KINDS: dict[str, str] = {
    "algorithms": "rlax_register_algorithms",
    "rewards": "rlax_register_rewards",
    "samplers": "rlax_register_samplers",
    "curation": "rlax_register_curation_filters",
    "tasks": "rlax_register_tasks",
    "loggers": "rlax_register_loggers",
    "environments": "rlax_register_environments",
    "tool_parsers": "rlax_register_tool_parsers",
    "weight_lanes": "rlax_register_weight_lanes",
    "critics": "rlax_register_critics",
    "agents": "rlax_register_agents",
}
# Each kind's contracts, the Protocols of rlax.core.contracts by name: the first is what
# every component of the kind is, the others optional capabilities. A setting typed with
# one takes a component of that kind (messages list the valid names).
CONTRACTS: dict[str, tuple[str, ...]] = {
    "algorithms": ("Algorithm", "BatchTerms", "Distils", "UsesEntropy"),
    "rewards": ("Reward",),
    "samplers": ("Sampler", "Resumable"),
    "curation": ("OnlineFilter", "OfflineFilter", "Curriculum", "Refilling", "Stateful"),
    "tasks": ("Task", "Dataset"),
    "loggers": ("Logger",),
    "environments": ("Environment",),
    "tool_parsers": ("ToolParser",),
    "weight_lanes": ("WeightLane", "HasServerHalf"),
    "critics": ("Critic",),
    "agents": (),  # a function or callable object: rlax.core.rollout.agents.episodes
}

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True)
class Component:
    """One registered component and where it came from.

    Attributes:
      kind: one of :data:`KINDS`, also its gin module.
      name: its name within the kind, also its gin name.
      factory: the class or function that builds it (keyword-only parameters).
      plugin: the name of the plugin that registered it (the entry-point name).
      distribution: the distribution that ships the plugin, or ``"-"``.
      version: that distribution's version, or ``"-"``.
    """

    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    distribution: str = "-"
    version: str = "-"

    @property
    def source(self) -> str:
        """Where the component comes from, for messages."""
        if self.distribution == "-":
            return f"plugin {self.plugin!r} (no distribution)"
        return f"plugin {self.plugin!r} from {self.distribution} {self.version}"


class PluginManager(pluggy.PluginManager):
    """pluggy's manager for project ``rlax`` plus the component registries.

    Args:
      disabled: plugin names to block (entry-point names or module names).
    """

    kinds: tuple[str, ...] = tuple(KINDS)

    def __init__(self, *, disabled: Iterable[str] = ()) -> None:
        super().__init__(PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        for name in disabled:
            self.set_blocked(name)
        self._distributions: dict[str, tuple[str, str]] = {}
        self._registry: dict[str, dict[str, Component]] | None = None
        self.autoloaded = False  # whether load() loaded the third-party entry points

    # -- loading ----------------------------------------------------------

    def load(
        self,
        extra: Iterable[str | object] = (),
        *,
        autoload: bool | None = None,
        builtins: bool = True,
    ) -> None:
        """Loads plugins, collects the registries and registers them with gin.

        Args:
          extra: more plugins: an entry-point name of group ``rlax``, a module
            path to import, or a plugin object (module, class or instance).
          autoload: load the entry points of group ``rlax`` of every
            distribution other than ``rlax-llm`` (the third-party plugins); by
            default unless ``RLAX_DISABLE_PLUGIN_AUTOLOAD`` is set and non-empty.
          builtins: load the entry points of ``rlax-llm`` (the built-ins),
            whatever ``autoload`` says.

        Raises:
          PluginLoadError: a plugin failed to import or is not a valid plugin.
          DuplicatePluginError: two plugins share a plugin or component name.
          PluginError: a registration hook returned something other than a
            ``dict`` of identifier -> callable.
          RuntimeError: called a second time.
        """
        if self._registry is not None:
            raise RuntimeError("plugins are already loaded; build a new PluginManager")
        if autoload is None:
            autoload = not os.environ.get(AUTOLOAD_ENV)
        self.autoloaded = autoload
        entry_points = installed_entry_points()
        for entry_point in entry_points:
            if builtins if is_builtin(entry_point) else autoload:
                self._load_entry_point(entry_point)
        for plugin in extra:
            if not isinstance(plugin, str):
                self._register(plugin, None, f"plugin object {plugin!r}")
                continue
            named = [ep for ep in entry_points if ep.name == plugin]
            for entry_point in named:
                self._load_entry_point(entry_point)
            if not named:
                self._load_module(plugin)
        try:
            self.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginLoadError(f"plugin {exc.plugin!r} is invalid: {exc}") from exc
        self._registry = self._collect()
        for kind, components in self._registry.items():
            factories = {name: c.factory for name, c in components.items()}
            register_configurables(kind, factories, exclusive=True)

    def _load_entry_point(self, ep: importlib.metadata.EntryPoint) -> None:
        dist = (ep.dist.name, ep.dist.version) if ep.dist is not None else ("-", "-")
        what = f"entry point {ep.name!r} ({ep.value}) of distribution {dist[0]} {dist[1]}"
        if self.is_blocked(ep.name) or self.get_plugin(ep.name) is not None:
            known = self._distributions.get(ep.name)
            if known is not None and known[0] != dist[0]:
                raise DuplicatePluginError(
                    f"plugin name {ep.name!r} is used by {known[0]} {known[1]} and by {what}"
                )
            return
        try:
            plugin = ep.load()
        except Exception as exc:  # any import-time failure makes the plugin unusable
            raise PluginLoadError(f"cannot load {what}: {type(exc).__name__}: {exc}") from exc
        self._distributions[ep.name] = dist
        self._register(plugin, ep.name, what)

    def _load_module(self, module_name: str) -> None:
        if self.is_blocked(module_name) or self.get_plugin(module_name) is not None:
            return
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # any import-time failure makes the plugin unusable
            raise PluginLoadError(
                f"cannot load plugin module {module_name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        self._register(module, module_name, f"plugin module {module_name!r}")

    def _register(self, plugin: object, name: str | None, what: str) -> None:
        if self.is_registered(plugin):
            return
        try:
            self.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginLoadError(f"{what} is invalid: {exc}") from exc
        except ValueError as exc:  # pluggy: the name is taken by another plugin
            raise DuplicatePluginError(f"{what}: {exc}") from exc
        if self.is_registered(plugin) and not self.get_hookcallers(plugin):
            self.unregister(plugin)
            raise PluginLoadError(f"{what} implements no rlax hook (is it the right module?)")

    # -- the registries ---------------------------------------------------

    def _collect(self) -> dict[str, dict[str, Component]]:
        registry: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}
        for kind, hook_name in KINDS.items():
            # Each implementation is called on its own so every name can be
            # attributed to the plugin that registered it.
            for impl in getattr(self.hook, hook_name).get_hookimpls():
                if impl.hookwrapper or impl.wrapper:
                    continue
                for name, factory in _checked(impl.function(), impl.plugin_name, hook_name):
                    dist, version = self._distributions.get(impl.plugin_name, ("-", "-"))
                    new = Component(kind, name, factory, impl.plugin_name, dist, version)
                    old = registry[kind].get(name)
                    if old is not None:
                        raise DuplicatePluginError(
                            f"duplicate {kind} name {name!r}: registered by {old.source} "
                            f"and by {new.source}"
                        )
                    registry[kind][name] = new
        return registry

    def _loaded(self) -> dict[str, dict[str, Component]]:
        if self._registry is None:
            raise RuntimeError("plugins are not loaded yet: call PluginManager.load() first")
        return self._registry

    def registry(self, kind: str) -> Mapping[str, Component]:
        """The components of one kind by name (read-only).

        Raises:
          UnknownPluginError: ``kind`` is not one of :data:`KINDS`.
        """
        registry = self._loaded()
        if kind not in registry:
            raise UnknownPluginError(
                f"unknown plugin kind {kind!r}; valid kinds: {', '.join(sorted(registry))}"
            )
        return types.MappingProxyType(registry[kind])

    def names(self, kind: str) -> list[str]:
        """The component names of one kind, sorted."""
        return sorted(self.registry(kind))

    def get(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``.

        Raises:
          UnknownPluginError: no such kind or name; the message lists the valid names.
        """
        components = self.registry(kind)
        if name not in components:
            valid = ", ".join(sorted(components)) or "(none registered)"
            raise UnknownPluginError(f"unknown {kind} plugin {name!r}; valid {kind}: {valid}")
        return components[name]

    def components(self) -> list[Component]:
        """Every registered component, sorted by kind then name."""
        return [
            c for kind in sorted(self._loaded()) for _, c in sorted(self.registry(kind).items())
        ]


def _checked(result: object, plugin: str, hook_name: str) -> list[tuple[str, Callable[..., Any]]]:
    """Validates one registration hook's result: ``dict[identifier, callable]``."""
    if result is None:
        return []
    if not isinstance(result, Mapping):
        raise PluginError(f"plugin {plugin!r}: {hook_name}() must return a dict, got {result!r}")
    for name, factory in result.items():
        if not isinstance(name, str) or not _IDENTIFIER.match(name):
            raise PluginError(
                f"plugin {plugin!r}: {hook_name}() name {name!r} is not a Python identifier"
            )
        if not callable(factory):
            raise PluginError(f"plugin {plugin!r}: {hook_name}() {name!r} is not callable")
    return list(result.items())


def installed_entry_points() -> list[importlib.metadata.EntryPoint]:
    """The entry points of group ``rlax`` of the installed distributions."""
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def is_builtin(entry_point: importlib.metadata.EntryPoint) -> bool:
    """Whether ``entry_point`` is one of rlax's own (distribution ``rlax-llm``)."""
    if entry_point.dist is None:
        return False
    # Distribution names compare normalised (PEP 503): rlax_llm is rlax-llm.
    return re.sub(r"[-_.]+", "-", entry_point.dist.name).lower() == BUILTIN_DISTRIBUTION


def autoload_notice(pm: PluginManager) -> str | None:
    """One line saying that third-party plugins were not loaded, or None if they were."""
    if pm.autoloaded:
        return None
    return f"{AUTOLOAD_ENV} is set: only the built-in plugins and those named with -p are loaded"


def build_plugin_manager(
    *,
    disabled: Iterable[str] = (),
    extra: Iterable[str | object] = (),
    autoload: bool | None = None,
    builtins: bool = True,
) -> PluginManager:
    """Builds a :class:`PluginManager` and loads its plugins.

    Args:
      disabled: plugin names to block (``-p no:NAME``).
      extra: plugins to load besides the entry points (``-p NAME``); see
        :meth:`PluginManager.load`.
      autoload: load the third-party entry points; see :meth:`PluginManager.load`.
      builtins: load the built-in entry points; see :meth:`PluginManager.load`.

    Returns:
      The loaded manager.
    """
    pm = PluginManager(disabled=disabled)
    pm.load(extra, autoload=autoload, builtins=builtins)
    return pm
