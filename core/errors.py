"""The exceptions the core raises at its edges.

The CLI maps each to an exit status (``rlax.core.cli``): configuration and
plugin errors are usage errors (status 2, a one-line message, no traceback);
:class:`Preempted` is the orderly "stop at a safe point" (status 75).
"""

from __future__ import annotations

import pathlib

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "EXIT_USAGE",
    "USAGE_ERROR_FILE_ENV",
    "BadSetting",
    "ConfigError",
    "DuplicatePluginError",
    "LostStep",
    "NothingToResume",
    "PluginError",
    "PluginLoadError",
    "Preempted",
    "RunFinished",
    "SourceMismatch",
    "UnknownPluginError",
]


# The exit statuses of every rlax process (the CLI and each role it starts).
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad arguments, gin configuration or plugins
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped at a safe point; restart to resume

# A supervised child (``rlax run --role all``'s) writes its usage error here instead of
# printing it and exits EXIT_USAGE; the supervisor prints the first one, once, and
# restarts nothing (several workers refusing the same setting make one line).
USAGE_ERROR_FILE_ENV = "RLAX_USAGE_ERROR_FILE"


class ConfigError(Exception):
    """A gin file or binding is wrong; the message says what and where."""


class BadSetting(ConfigError, ValueError):
    """A setting's value is refused by its callee (raised by a validator, before any work).

    Attributes:
      parameter: the parameter whose value is wrong, so the CLI can say where it was set.
    """

    def __init__(self, parameter: str, message: str):
        super().__init__(message)
        self.parameter = parameter


class SourceMismatch(ConfigError):
    """A checkpoint's data position was recorded by another kind of rollout source.

    An inline run's position is the prompts it drew; a run fed by a parameter
    server keeps its position in the server's queue: neither can continue the
    other. The trainer loop adds the run directory and step to the message.

    Attributes:
      made_with: how the checkpoint's run was started (e.g. ``"--role inline
        (an in-process sampler)"``).
    """

    def __init__(self, made_with: str):
        super().__init__(f"the checkpoint was trained with {made_with}; resume it the same way")
        self.made_with = made_with


class NothingToResume(ConfigError):
    """A run's checkpoints are there, and none of them can be restored.

    Resuming would start the run over from step 0; the trainer refuses unless it was
    asked to (``rlax run --start-over``), and moves nothing.
    """

    def __init__(self, directory: pathlib.Path, step: int, why: str):
        super().__init__(
            f"{directory}: no checkpoint can be restored (the newest, step {step}: {why}); "
            "to train this run again from step 0, add --start-over (its checkpoints are "
            "moved aside, not deleted)"
        )


class PluginError(Exception):
    """Base of the plugin errors: a plugin or a component is unusable."""


class PluginLoadError(PluginError):
    """A plugin (an entry point or a ``-p MODULE``) could not be imported."""


class DuplicatePluginError(PluginError):
    """Two plugins registered the same component name within one kind."""


class UnknownPluginError(PluginError, LookupError):
    """A component name (or kind) is not registered; the message lists the valid ones."""


class Preempted(Exception):
    """The process stopped at a safe point because it was asked to (not a failure).

    Attributes:
      run_dir: the trainer's run directory, set by ``rlax.train`` so the CLI
        can say how to resume it (None elsewhere).
    """

    run_dir: pathlib.Path | None

    def __init__(self, *args: object, run_dir: pathlib.Path | None = None) -> None:
        super().__init__(*args)
        # An instance attribute, not a class default: gin re-raises a proxy of the exception
        # that finds the original's attributes only when its own lookup fails.
        self.run_dir = run_dir


class RunFinished(Preempted):
    """The run is over (the local supervisor's trainer finished): stop as at a notice, status 0."""


class LostStep(Preempted):
    """After a notice the server went away mid-step: stop without saving; the step is redone."""
