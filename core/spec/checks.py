"""A run specification checked as a whole, before any work and before a run directory.

``rlax run`` (and ``rlax eval``) build the specification once and call :func:`check_run`
with the role this process plays: the supervisor of ``--role all`` for the whole run, a
role started by hand (a cluster's) for itself. A supervisor's children skip it: they are
started on the specification it checked, and refuse one whose build differs
(:func:`rlax.core.config.supervised`), so no start or restart of a role pays for the checks
again (reading a GGUF file's metadata and tokenizer takes seconds). It applies, in order: the rules between settings
(:mod:`rlax.core.spec.rules`, including the rules each component declares about itself),
the lengths (:mod:`rlax.core.spec.lengths`) and the facts of this machine
(:mod:`rlax.core.spec.machine`). Single settings were checked while gin read them
(:mod:`rlax.core.config.checks`). Every refusal is a :class:`ConfigError` of one line
naming the setting: the CLI exits with status 2 and leaves nothing behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlax.core.spec.lengths import check_lengths
from rlax.core.spec.machine import MACHINE_RULES
from rlax.core.spec.rules import RULES

if TYPE_CHECKING:
    from rlax.core.runtime.run_dir import RunDir
    from rlax.core.spec.run import RunSpec

__all__ = ["check_run"]


def check_run(spec: RunSpec, role: str, run_dir: RunDir | None = None) -> None:
    """Raises ConfigError for the first rule ``spec`` breaks for ``role`` (``all``,
    ``inline``, ``trainer``, ``worker``, ``param_server`` or ``eval``).

    ``run_dir`` is the run directory given on the command line, if any (it exists already
    when resumed; nothing here writes to it).
    """
    for rule in (*RULES, check_lengths, *MACHINE_RULES):
        rule(spec, role)
