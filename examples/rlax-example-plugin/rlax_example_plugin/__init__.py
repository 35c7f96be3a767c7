"""An example third-party rlax plugin (see README.md)."""

from __future__ import annotations

from rlax_example_plugin.shouting import ShoutingReward

__all__ = ["ShoutingReward"]
