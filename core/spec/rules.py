"""Rules between the settings of one run specification.

Each rule takes the whole :class:`~rlax.core.spec.RunSpec` and raises :class:`ConfigError`
whose one line names the setting at fault (``rlax.run.deterministic: ...``), says why
and what would work. A rule a plugin declares about its own settings is the component's
``check_run(spec)`` method (:func:`check_components`): an agent sampler checks that the
model it serves can render a conversation, say.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rlax.core.configurables import selector_of
from rlax.core.contracts import ChecksRun
from rlax.core.errors import BadSetting, ConfigError
from rlax.core.rollout.groups import check_online_filters
from rlax.core.trainer.spec import check_teacher
from rlax.core.worker.rules import check_reload_in_flight

if TYPE_CHECKING:
    from rlax.core.spec.run import RunSpec

__all__ = ["RULES", "check_components", "components"]

TRAINER_ROLES = ("all", "trainer", "inline")


def check_staleness(spec: RunSpec, role: str) -> None:
    """A deterministic run is synchronous: no group may be older than the weights."""
    if spec.deterministic and spec.max_staleness != 0:
        raise ConfigError(
            f"rlax.run.deterministic needs rlax.run.max_staleness = 0 (MAX_STALENESS), got "
            f"{spec.max_staleness}: a resumed run could otherwise train on other groups"
        )


def check_curation(spec: RunSpec, role: str) -> None:
    """Every filter of the run's curation runs on groups (an offline one is ``rlax curate``'s)."""
    check_online_filters(spec.curation, "rlax.run.curation")


def check_worker(spec: RunSpec, role: str) -> None:
    """In-flight reloads need a sampler that can load weights between decode steps."""
    if role in ("all", "worker"):
        check_reload_in_flight(spec.sampler, spec.worker.reload_in_flight)


def check_trainer(spec: RunSpec, role: str) -> None:
    """The trainer has an algorithm, an optimiser, and a teacher if the algorithm distils."""
    if role not in TRAINER_ROLES:
        return
    for name in ("algorithm", "optimizer"):
        if getattr(spec.train, name) is None:
            raise ConfigError(
                f"rlax.train.{name}: not set; include an algorithm's file (e.g. "
                "include 'algorithms/grpo.gin', which brings the optimiser too)"
            )
    check_teacher(spec.train.algorithm, spec.train.teacher)


def check_processes_and_weights(spec: RunSpec, role: str) -> None:
    """Several trainer processes: one update per batch, and a server that keeps weights."""
    if role not in ("trainer", "inline"):
        return  # the supervisor's trainer is one process
    from rlax.core.parallel.multihost import DistributedSettings
    from rlax.core.trainer.epochs import check_processes  # a trainer's process imports JAX

    distributed = spec.train.distributed or DistributedSettings()
    try:
        processes = distributed.resolved().num_processes or 1
    except ValueError as err:
        raise ConfigError(f"rlax.train.distributed: {err}") from err
    check_processes(spec.train.trainer_settings, processes)
    if processes > 1 and spec.param_server.saved_weights == 0:
        raise ConfigError(
            f"rlax.param_server.saved_weights = 0 needs a one-process trainer, this one has "
            f"{processes}: after a server restart only one process publishes its weights "
            "again; keep saved_weights >= 1"
        )


def check_lanes(spec: RunSpec, role: str) -> None:
    """Every weight lane the clients are to use is registered."""
    from rlax.core.param_server.transport.lanes import check_names

    check_names(spec.server.weight_lanes)


def components(spec: RunSpec) -> Iterator[tuple[str, Any]]:
    """``(setting, component)`` for every plugin component the specification holds."""
    yield from (
        ("rlax.run.task", spec.task),
        ("rlax.run.reward", spec.reward),
        ("rlax.run.sampler", spec.sampler),
        ("rlax.train.algorithm", spec.train.algorithm),
    )
    yield from ((f"rlax.run.curation[{i}]", f) for i, f in enumerate(spec.curation))
    curricula = spec.param_server.curricula
    yield from ((f"rlax.param_server.curricula[{i}]", c) for i, c in enumerate(curricula))
    yield from ((f"rlax.watch.loggers[{i}]", x) for i, x in enumerate(spec.train.watch.loggers))


def check_built(spec: RunSpec, role: str) -> None:
    """Every component was built: a reference written without its call (``@rewards.math``)
    hands over the factory itself."""
    for setting, component in components(spec):
        if inspect.isclass(component) or inspect.isfunction(component):
            name = getattr(component, "__name__", "it")
            raise ConfigError(
                f"{setting}: got the factory {name} itself, not what it builds; call the "
                "reference: @kind.name() with parentheses"
            )


def check_components(spec: RunSpec, role: str) -> None:
    """The rules each component declares about itself in this run: its ``check_run(spec)``
    (:class:`rlax.core.contracts.ChecksRun`).

    A component's rule raises :class:`BadSetting` (naming one of its own parameters) or
    ConfigError; the first becomes ``SETTING.parameter: why`` for the setting that holds it.
    """
    for setting, component in components(spec):
        if not isinstance(component, ChecksRun):
            continue
        try:
            component.check_run(spec)
        except BadSetting as err:
            raise ConfigError(f"{_owner(setting, component)}.{err.parameter}: {err}") from err


def _owner(setting: str, component: Any) -> str:
    """The gin name a component's parameters are bound under, else the setting holding it."""
    return selector_of(component) or setting


Rule = Callable[["RunSpec", str], None]

#: The rules between settings, in the order they are checked.
RULES: tuple[Rule, ...] = (
    check_built,
    check_staleness,
    check_curation,
    check_worker,
    check_trainer,
    check_processes_and_weights,
    check_lanes,
    check_components,
)
