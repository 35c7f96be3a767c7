"""The whole suite runs offline and on the host's own device count, however it is started.

The README's test command is all a fresh machine runs (``.ci/run`` runs exactly
that command), so what the suite needs from the environment is set here: no
model or dataset hub is ever reached, and a developer's ``XLA_FLAGS`` (a fake
device count, say) cannot change what the tests see. Tests that need fake
devices set ``XLA_FLAGS`` for the subprocesses they start.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.pop("XLA_FLAGS", None)
