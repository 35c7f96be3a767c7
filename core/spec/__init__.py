"""The run specification (:class:`RunSpec`) and its checks as a whole (:func:`check_run`)."""

from __future__ import annotations

from rlax.core.spec.run import ClusterSpec, EvaluateSpec, RunSpec

__all__ = ["ClusterSpec", "EvaluateSpec", "RunSpec"]
