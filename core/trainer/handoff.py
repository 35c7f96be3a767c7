"""Weights to a sampler in the trainer's own process, device to device: the handoff.

In one-process placement (:mod:`rlax.core.parallel.placement`: ``"one_process"`` or
``"colocated"``) the sampler lives in the trainer's process, on devices of its own or
on the trainer's. Its weights then never need the host or a socket: after each publish
the trainer *offers* ``(version, params)`` to a :class:`DeviceHandoff`, which copies them
device to device onto the sampler's layout (``jax.device_put`` onto the sampler mesh's
shardings). The in-process worker, when its reload rule says reload, *takes* the newest
offered version if it is the version the parameter server reports, and pulls bytes as
any worker does otherwise (:meth:`rlax.core.worker.role.Worker.newer_weights`).

This is a seam beside publishing, not a weight lane: the trainer still pushes every
version to the parameter server, which still owns the versions, the queue and its
staleness rules, and serves workers elsewhere. Only the bytes the in-process worker
would have pulled are replaced.

What the sampler gets equals what a pull would give: the published tree (LoRA: its
merged weights, which a pulling worker builds from the adapters) rounded through the
wire dtype (``rlax.ps_settings.wire_dtype``) and back to each parameter's own dtype, as
:meth:`~rlax.core.wire.WirePlan.unpack` does. The copy is made when offered, because
the trainer's next step donates the arrays it offered (``Trainer.donate_params``); only
the newest version is kept, so the sampler's devices hold at most one offered copy
beside the one the sampler is using.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rlax.core.models.lora import merged_state
from rlax.core.parallel.mesh import MeshConfig, make_mesh, tree_shardings
from rlax.core.wire import WIRE_DTYPES

__all__ = ["DeviceHandoff", "OfferingSource", "sampler_placement"]

#: A sampler given devices but no mesh is tensor parallel over them (the samplers' rule,
#: ``rlax.plugins.samplers.sampler_mesh.SamplerMesh.of``).
SAMPLER_DEFAULT_MESH = MeshConfig(data=1, fsdp=1, tensor=-1)


def sampler_placement(
    mesh: MeshConfig | None, devices: Sequence[jax.Device]
) -> Callable[[Any], Any]:
    """Puts a weight tree on a sampler's layout: its mesh (``mesh``, or tensor parallel)
    over ``devices``, laid out by the trainer's rules, always as a new copy.

    The copy matters where the sampler shares the trainer's devices (colocated): there
    ``device_put`` onto an equal sharding would alias the trainer's arrays, which its
    next step donates.
    """
    on = make_mesh(mesh or SAMPLER_DEFAULT_MESH, list(devices))

    def place(tree: Any) -> Any:
        return jax.device_put(tree, tree_shardings(tree, on), may_alias=False)

    return place


class DeviceHandoff:
    """The newest published version, copied onto the sampler's devices.

    Args:
      place: puts a tree on the sampler's layout (:func:`sampler_placement`).
      wire_dtype: the parameter server's wire dtype; what is handed over is rounded
        through it, so it equals what a pull gives.

    Thread-safe: the trainer offers from its loop, in-process workers take from theirs.
    """

    def __init__(self, place: Callable[[Any], Any], wire_dtype: str = "float32"):
        self._place = place
        self._wire = WIRE_DTYPES[wire_dtype]
        self._round: Callable[[Any], Any] | None = None  # compiled at the first offer
        self._lock = threading.Condition()
        self._offered: tuple[int, Any] | None = None
        self._probe: tuple[int, Any] | None = None  # the offered version's probe
        self.offers = 0  # versions offered
        self.taken = 0  # versions handed to a worker
        self.refused = 0  # asks for a version other than the newest offered (a pull instead)

    @property
    def version(self) -> int:
        """The newest offered version (-1: none yet)."""
        offered = self._offered
        return -1 if offered is None else offered[0]

    def offer(self, params: Any, version: int, probe: Any = None) -> float:
        """Copies ``params`` (the trainer's, as published as ``version``) onto the sampler's
        layout; replaces any older offer. Returns the seconds it took to dispatch (the
        copy itself runs asynchronously, ahead of the trainer's next step). ``probe``: the
        version's probe (:mod:`rlax.core.rollout.probe`), checked by the taker as a pulled
        version's is."""
        start = time.perf_counter()
        placed = self._place(merged_state(params))
        if self._round is None:
            self._round = self._rounding(jax.tree.map(lambda x: x.sharding, placed))
        placed = self._round(placed)
        with self._lock:
            self._offered = (version, placed)
            self._probe = (version, probe)
            self.offers += 1
            self._lock.notify_all()
        return time.perf_counter() - start

    def take(self, version: int, wait_s: float = 2.0) -> Any | None:
        """The offered weights if ``version`` (the server's newest) is the newest offered,
        else None (the caller pulls).

        A version the server already serves but the trainer has not offered yet (a resume
        offers after its push) is waited for up to ``wait_s``.
        """
        with self._lock:
            self._lock.wait_for(lambda: self.version >= version, timeout=wait_s)
            if self._offered is not None and self._offered[0] == version:
                self.taken += 1
                return self._offered[1]
            self.refused += 1
            return None

    def probe(self, version: int) -> Any:
        """The probe offered with ``version`` (None: none, or another version is offered)."""
        with self._lock:
            return self._probe[1] if self._probe and self._probe[0] == version else None

    def _rounding(self, shardings: Any) -> Callable[[Any], Any]:
        """One compiled program on the sampler's devices rounding each parameter through
        the wire dtype and back to its own, in place (it donates the copy
        :meth:`offer` just placed, never the trainer's arrays), its results on exactly
        ``shardings`` (the sampler's layout, so the sampler takes them as they are).

        Rounding after the copy, not before, keeps the handoff one copy at memory speed:
        the reshard of the full-width weights is the copy, and the in-place rounding adds
        little to it; rounding first, then copying the narrow weights and widening them
        again, is three passes (``benchmarks/placement.py`` measures the handoff).
        """
        wire = self._wire

        def through_wire(x: Any) -> Any:
            return x if np.dtype(x.dtype) == wire else x.astype(wire).astype(x.dtype)

        return jax.jit(
            lambda tree: jax.tree.map(through_wire, tree),
            donate_argnums=0,
            out_shardings=shardings,
        )


class OfferingSource:
    """A rollout source whose every publish (and resume's publish) is also offered to a
    :class:`DeviceHandoff`; everything else is the wrapped source's.

    The offer comes first: it is dispatched in a moment and the push takes longer, so by
    the time the server reports the version the handoff holds it.
    """

    def __init__(self, source: Any, handoff: DeviceHandoff):
        self.source, self.handoff = source, handoff

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def publish(self, params: Any, version: int) -> dict[str, float]:
        probe_of = getattr(self.source, "probe_of", None)  # computed once, pushed and offered
        probe = probe_of(params, version) if probe_of is not None else None
        handoff_s = self.handoff.offer(params, version, probe)
        metrics = self.source.publish(params, version)
        return {**metrics, "handoff_s": handoff_s}

    def resume(self, params: Any, version: int) -> int:
        published = self.source.resume(params, version)
        probe_of = getattr(self.source, "probe_of", None)
        probe = probe_of(params, published) if probe_of is not None else None
        self.handoff.offer(
            params, published, probe
        )  # the restored weights, as the server serves them
        return published
