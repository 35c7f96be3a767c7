"""The run specification built from the parsed gin config, and written for the children.

gin builds the :class:`~rlax.core.spec.RunSpec` once per process (``rlax.run``); the
supervisor of ``rlax run`` writes the gin text it was built from into the run directory
(``RUN/spec.gin``, :func:`save_spec`) and starts every child on that file alone, so each
role builds the same value, and a child restarted later runs the same run even if the
files it came from were edited meanwhile. Each child checks that what it built is what
the supervisor built (:data:`SPEC_DIGEST_ENV`).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from typing import TYPE_CHECKING

import gin

from rlax.core.config.building import refusing_components
from rlax.core.errors import ConfigError

if TYPE_CHECKING:
    from rlax.core.plugins import PluginManager
    from rlax.core.runtime.run_dir import RunDir
    from rlax.core.spec import RunSpec

__all__ = ["SPEC_DIGEST_ENV", "build_spec", "save_spec", "spec_digest", "supervised"]

#: The digest of the specification's text the supervisor started a child with.
SPEC_DIGEST_ENV = "RLAX_SPEC_DIGEST"

_HEADER = """\
# The run specification as the supervisor built it (core/spec/run.py): every role of
# this run reads this file. To run it again: rlax run --gin {path}

"""


def spec_digest() -> str:
    """The digest of every binding of the parsed config (what the specification is built from)."""
    return hashlib.sha256(gin.config_str().encode()).hexdigest()[:16]


def supervised() -> bool:
    """Whether this process is a child of ``rlax run``'s supervisor, started on the spec it
    built and checked as a whole (:func:`build_spec` refuses one whose build differs), so
    the whole-run checks need not run again at each start and restart of a role."""
    return bool(os.environ.get(SPEC_DIGEST_ENV))


def build_spec(plugins: PluginManager | None = None) -> RunSpec:
    """The run specification the parsed config describes (``rlax.run``), built once.

    Raises:
      ConfigError: a component refused its settings while gin built it, or this process was
        started on a specification that differs from its supervisor's.
    """
    from rlax.core.spec import RunSpec

    expected = os.environ.get(SPEC_DIGEST_ENV)
    if expected and expected != spec_digest():
        raise ConfigError(
            f"the run specification differs from the supervisor's (digest {spec_digest()}, "
            f"expected {expected}): start the child on the supervisor's spec.gin"
        )
    spec = refusing_components(gin.get_configurable("rlax.run"))()
    if not isinstance(spec, RunSpec):  # rlax.run rebound to something else
        raise ConfigError(f"rlax.run: built a {type(spec).__name__}, not a RunSpec")
    return spec


def save_spec(run_dir: RunDir) -> tuple[pathlib.Path, dict[str, str]]:
    """Writes the parsed config the specification was built from to ``RUN/spec.gin``; the
    file, and the environment a child started on it checks its own build against."""
    path = run_dir.spec
    path.parent.mkdir(parents=True, exist_ok=True)  # --run-dir DIR need not exist yet
    path.write_text(_HEADER.format(path=path) + gin.config_str())
    return path, {SPEC_DIGEST_ENV: spec_digest()}
