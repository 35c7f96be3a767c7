"""The gin files a run directory keeps, written by the trainer role (process 0).

Apart from the gin front (``rlax.core.config``) this is the one place the
library reads gin's state: what was parsed, and what the trainer used. It
imports nothing of rlax, so the trainer role can call it without an import
cycle through the front (which registers the roles as configurables).
"""

from __future__ import annotations

import pathlib

import gin

_CONFIG_HEADER = """\
# The whole configuration of this run: every role's bindings (trainer, workers,
# parameter server, local cluster) from the gin files and --gin bindings, as
# parsed. Run it again with
#
#   rlax run --gin {run_dir}/operative_config.gin
#
# (plugins loaded with -p need -p again). trainer_operative_config.gin lists
# every value the trainer used, its defaults included.

"""


def save_run_config(run_dir: pathlib.Path) -> None:
    """Writes the config that reproduces the run, and the trainer's operative values."""
    # The operative config alone holds only what this process called (the trainer's
    # bindings): it could not start the other roles.
    header = _CONFIG_HEADER.format(run_dir=run_dir)
    (run_dir / "operative_config.gin").write_text(header + gin.config_str())
    (run_dir / "trainer_operative_config.gin").write_text(gin.operative_config_str())
