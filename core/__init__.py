"""The minimal core of rlax.

Plugins import their hook marker from here::

    from rlax.core import hookimpl
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "rlax"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]
