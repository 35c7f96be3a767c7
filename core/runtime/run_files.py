"""The gin files a run directory keeps, written by the trainer role (process 0).

Apart from the gin front (``rlax.core.config``) this is the one place the
library reads gin's state: what was parsed, and what the trainer used. Of
rlax it imports only the run directory, so the trainer role can call it
without an import cycle through the front (which registers the roles as
configurables).
"""

from __future__ import annotations

import gin

from rlax.core.runtime.run_dir import RunDir

_CONFIG_HEADER = """\
# The whole configuration of this run: every role's bindings (trainer, workers,
# parameter server, local cluster) from the gin files and --gin bindings, as
# parsed. Run it again with
#
#   rlax run --gin {config}
#
# (plugins loaded with -p need -p again). {trainer_config} lists
# every value the trainer used, its defaults included.

"""


def save_run_config(run_dir: RunDir) -> None:
    """Writes the config that reproduces the run, and the trainer's operative values."""
    # The operative config alone holds only what this process called (the trainer's
    # bindings): it could not start the other roles.
    header = _CONFIG_HEADER.format(
        config=run_dir.operative_config, trainer_config=run_dir.TRAINER_CONFIG
    )
    run_dir.operative_config.write_text(header + gin.config_str())
    run_dir.trainer_config.write_text(gin.operative_config_str())
