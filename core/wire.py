"""Pytree <-> one flat byte buffer, the unit the parameter server stores and streams.

A :class:`WirePlan` is computed once from a parameter tree: the flattened
names, shapes, byte offsets and the dtype on the wire. After that, packing is
one jitted call that casts, ravels and concatenates every leaf into a single
array (one device-to-host transfer), and unpacking is one jitted call that
slices, reshapes and casts back: no Python loop over tensors on the hot path.

The buffer of one version is cut into large chunks for the gRPC stream; the
receiver writes each chunk at its offset into a preallocated buffer.

A plan is also a layout alone (the parameter server's, which holds bytes and never
imports JAX): its programs are compiled on the first :meth:`WirePlan.pack` or
:meth:`WirePlan.unpack`, and JAX is imported by the methods that touch arrays.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np

from rlax.core.types import FLOAT_DTYPES

WIRE_DTYPES = FLOAT_DTYPES  # the dtypes weights travel in
# XLA's CPU client takes a host array as it is (no copy) when its address is a
# multiple of this; otherwise it copies (measured: 64-byte aligned views of a
# page-aligned buffer are shared, 16- and 32-byte aligned ones are copied).
_SHARE_ALIGN = 64
_PAGE = 4096


def pull_buffer(nbytes: int) -> memoryview:
    """Writable memory for ``nbytes`` of a pulled version, starting on a page boundary.

    Taken from the heap (numpy), so memory the process freed earlier is used
    again; a page-aligned start lets :meth:`WirePlan.alias` share it with JAX
    arrays. Its contents are undefined until a pull has written every byte.
    """
    raw = np.empty(nbytes + _PAGE, np.uint8)
    start = -raw.ctypes.data % _PAGE
    return raw[start : start + nbytes].data


def leaf_name(path: tuple) -> str:
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype  # the parameter's own dtype
    offset: int  # bytes, in the wire buffer
    nbytes: int  # bytes on the wire


@dataclasses.dataclass
class WirePlan:
    """Layout of a parameter tree in the wire buffer; built once, reused every version."""

    treedef: Any
    tensors: tuple[TensorSpec, ...]
    wire_dtype: np.dtype
    nbytes: int

    @classmethod
    def for_tree(cls, tree: Any, wire_dtype: str = "float32") -> WirePlan:
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(
                f"wire dtype {wire_dtype!r} not supported; use one of {sorted(WIRE_DTYPES)}"
            )
        import jax

        wire = WIRE_DTYPES[wire_dtype]
        leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
        tensors, offset = [], 0
        for path, leaf in leaves:
            dtype = np.dtype(leaf.dtype)
            if not np.issubdtype(dtype, np.floating) and dtype != ml_dtypes.bfloat16:
                raise TypeError(
                    f"weight sync: leaf {leaf_name(path)!r} has non-float dtype {dtype}"
                )
            nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * wire.itemsize
            tensors.append(TensorSpec(leaf_name(path), tuple(leaf.shape), dtype, offset, nbytes))
            offset += nbytes
        return cls(treedef, tuple(tensors), wire, offset)

    @functools.cached_property
    def _pack(self) -> Callable[[list[Any]], Any]:
        import jax
        import jax.numpy as jnp

        wire = self.wire_dtype
        return jax.jit(lambda leaves: jnp.concatenate([jnp.ravel(x).astype(wire) for x in leaves]))

    @functools.cached_property
    def _unpack(self) -> Callable[[np.ndarray], list[Any]]:
        import jax

        sizes = [t.nbytes // self.wire_dtype.itemsize for t in self.tensors]
        bounds = np.cumsum([0, *sizes])

        def unpack(flat):
            return [
                flat[bounds[i] : bounds[i + 1]].reshape(t.shape).astype(t.dtype)
                for i, t in enumerate(self.tensors)
            ]

        return jax.jit(unpack)

    def pack(self, tree: Any) -> np.ndarray:
        """The whole tree as one uint8 array of ``nbytes`` bytes (wire dtype, C order)."""
        import jax

        leaves = jax.tree_util.tree_leaves(tree)
        if len(leaves) != len(self.tensors):
            raise ValueError(
                f"weight sync: tree has {len(leaves)} leaves, plan has {len(self.tensors)}"
            )
        flat = np.asarray(self._pack(leaves))
        return flat.view(np.uint8)

    def unpack(self, buffer: bytes | bytearray | memoryview | np.ndarray) -> Any:
        """The tree back from a wire buffer of exactly ``nbytes`` bytes."""
        import jax

        flat = np.frombuffer(buffer, dtype=self.wire_dtype)
        if flat.nbytes != self.nbytes:
            raise ValueError(
                f"weight sync: buffer has {flat.nbytes} bytes, plan expects {self.nbytes}"
            )
        return jax.tree_util.tree_unflatten(self.treedef, self._unpack(flat))

    def alias(self, buffer: bytes | bytearray | memoryview) -> Any:
        """The tree back from a wire buffer, sharing the buffer's memory where it can.

        On the CPU a tensor whose wire dtype is its own and whose offset in a
        page-aligned buffer (:func:`pull_buffer`) is a multiple of 64 bytes
        becomes a JAX array over those very bytes: the weights then take their
        size once, not twice as with :meth:`unpack`. Other tensors (another
        dtype, an unaligned offset, an accelerator) are copied. The arrays
        keep the buffer alive; whoever writes into the buffer again (the next
        pull) changes every array that shares it, so the caller must treat
        them as gone from then on.
        """
        import jax
        import jax.numpy as jnp

        flat = np.frombuffer(buffer, dtype=np.uint8)
        if flat.nbytes != self.nbytes:
            raise ValueError(
                f"weight sync: buffer has {flat.nbytes} bytes, plan expects {self.nbytes}"
            )
        leaves = []
        for t in self.tensors:
            host = flat[t.offset : t.offset + t.nbytes].view(self.wire_dtype).reshape(t.shape)
            if host.dtype == t.dtype and host.ctypes.data % _SHARE_ALIGN == 0:
                leaves.append(jax.device_put(host))  # CPU: shared, not copied
            else:
                leaves.append(jnp.asarray(host).astype(t.dtype))
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def check_layout(self, tensors: list[dict]) -> None:
        """Raises ValueError unless ``tensors`` (name, shape, offset, nbytes) match this plan."""
        mine = [(t.name, t.shape, t.offset, t.nbytes) for t in self.tensors]
        theirs = [(t["name"], tuple(t["shape"]), t["offset"], t["nbytes"]) for t in tensors]
        if mine != theirs:
            diff = next(((a, b) for a, b in zip(mine, theirs) if a != b), (len(mine), len(theirs)))
            raise ValueError(f"weight sync: layout differs from this model's: {diff}")


def _host_resident(leaf) -> bool:
    if isinstance(leaf, np.ndarray):
        return True
    devices = getattr(leaf, "devices", None)
    return devices is not None and all(d.platform == "cpu" for d in devices())


def stream(plan: WirePlan, tree: Any, chunk_bytes: int) -> Iterator[tuple[int, memoryview]]:
    """(offset, view) pairs covering the wire buffer of ``tree``, in order.

    Host-resident leaves already in the wire dtype are sent from their own
    memory (no copy); small leaves are gathered into one chunk. Anything else
    (accelerator arrays, a dtype cast) goes through the one-call :meth:`WirePlan.pack`.
    """
    import jax

    leaves = jax.tree_util.tree_leaves(tree)
    if not all(_host_resident(x) and np.dtype(x.dtype) == plan.wire_dtype for x in leaves):
        yield from chunks(plan.pack(tree), chunk_bytes)
        return
    small: list[memoryview] = []
    start = 0
    for spec, leaf in zip(plan.tensors, leaves, strict=True):
        view = byte_view(np.ascontiguousarray(np.asarray(leaf)))
        if len(view) != spec.nbytes:
            raise ValueError(
                f"weight sync: {spec.name} has {len(view)} bytes, plan says {spec.nbytes}"
            )
        if len(view) < chunk_bytes // 4:  # gathered: one message for many small tensors
            if not small:
                start = spec.offset
            small.append(view)
            if sum(len(v) for v in small) >= chunk_bytes:
                yield from _gathered(start, small, chunk_bytes)
                small = []
            continue
        if small:
            yield from _gathered(start, small, chunk_bytes)
            small = []
        yield from ((spec.offset + o, v) for o, v in chunks(view, chunk_bytes))
    if small:
        yield from _gathered(start, small, chunk_bytes)


def _gathered(
    start: int, views: list[memoryview], chunk_bytes: int
) -> Iterator[tuple[int, memoryview]]:
    return ((start + o, v) for o, v in chunks(b"".join(views), chunk_bytes))


def byte_view(buffer: np.ndarray | bytes | memoryview) -> memoryview:
    """A flat byte view of ``buffer``'s memory, no copy (C-contiguous buffers only).

    An array's view is taken through ``ndarray.data``: numpy declares the
    buffer protocol of its arrays (``__buffer__``) for Python 3.12 on only, so a
    type checker for 3.11 rejects ``memoryview(array)``; the two are the same view.
    """
    view = buffer.data if isinstance(buffer, np.ndarray) else memoryview(buffer)
    return view.cast("B")


def chunks(
    buffer: np.ndarray | bytes | memoryview, chunk_bytes: int
) -> Iterator[tuple[int, memoryview]]:
    """(offset, view) pairs covering ``buffer`` in order."""
    view = byte_view(buffer)
    for offset in range(0, len(view), chunk_bytes):
        yield offset, view[offset : offset + chunk_bytes]
