"""The weight-load check: the policy a worker samples with is the policy the trainer published.

After each update the trainer scores a short fixed token sequence, the *probe*, with the
weights as the wire delivers them (rounded through the wire dtype), and publishes the
probe's ids and per-token logprobs with the version (``PartHeader.probe_tokens`` and
``probe_logprobs``). After each load a worker scores the same ids with the weights it
loaded and compares: the largest per-token difference beyond ``tolerance`` means the
weights are not the published ones (bytes changed after the checksum, another version's
tensors under this version's number, a wrong layout), and the worker refuses the version
instead of sampling with it (:meth:`rlax.core.worker.role.Worker.newer_weights`).

Both sides run the same function on the same values, so what they may differ by is the
order of floating-point reductions (another device, another sharding, another XLA
program), not the wire's rounding: the trainer rounds before it scores. The default
tolerance (:data:`DEFAULT_TOLERANCE`) admits that and little more. Corrupted bytes move
the probe by nats; a version one update apart by as much as the update moves it (0.02
nats on the quickstart's first updates, so 1e-2 tells them apart; a run whose updates
are smaller needs a smaller tolerance to tell neighbouring versions apart).

The probe's values (:class:`Probe`, :func:`compare`) are numpy: the parameter server
carries them with the weights and never imports JAX; the scoring imports it where it runs.

Shapes: T probe tokens, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlax.core.wire import WIRE_DTYPES

if TYPE_CHECKING:
    import jax

__all__ = [
    "DEFAULT_LENGTH",
    "DEFAULT_TOLERANCE",
    "Probe",
    "ProbeCheck",
    "ProbeResult",
    "compare",
    "probe_logprobs",
    "probe_tokens",
    "published_probe",
    "trainer_probe",
]

#: Probe tokens per version: one forward of 16 tokens, 15 scored positions.
DEFAULT_LENGTH = 16
#: Largest per-token |logprob difference| a load may show (nats). The same float32
#: program on the same values reproduces the probe to < 1e-5 (CPU, the tests); another
#: device or sharding reorders the sums (TF32 / bfloat16 matmul passes on accelerators:
#: ~1e-3 relative on the logits, a few 1e-3 nats). 1e-2 admits that; corrupted bytes
#: differ by nats, and the quickstart's one update by 0.02.
DEFAULT_TOLERANCE = 0.01


def probe_tokens(vocab_size: int, length: int = DEFAULT_LENGTH) -> np.ndarray:
    """The fixed probe ids [T]: a stride-7919 walk over the vocabulary (distinct ids, no
    tokenizer needed, the same for every run of a model)."""
    return ((np.arange(length, dtype=np.int64) * 7919 + 1) % vocab_size).astype(np.int32)


@functools.cache
def _program() -> Callable[..., Any]:
    """:func:`_score` jitted (its architecture and dtypes static), once per process."""
    import jax

    return jax.jit(_score, static_argnums=(0, 3, 4))


def _score(
    graphdef: Any,
    params: Any,
    tokens: jax.Array,  # [T]
    wire: np.dtype | None,
    dtypes: tuple[np.dtype, ...] | None,
) -> jax.Array:  # [T - 1]
    """One program: the weights rounded through ``wire`` and cast to ``dtypes`` (each
    None: as they are), then the forward and each next token's log-softmax."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rlax.core.models.transformer import causal_mask, positions_from_mask

    leaves, treedef = jax.tree.flatten(params)
    if wire is not None:
        leaves = [x.astype(wire).astype(x.dtype) for x in leaves]
    if dtypes is not None:
        leaves = [x.astype(d) for x, d in zip(leaves, dtypes)]
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    ids = tokens[None, :]
    mask = jnp.ones_like(ids, dtype=bool)
    logits, _ = model(ids, positions_from_mask(mask), causal_mask(mask))
    logp = jax.nn.log_softmax(logits.reshape(ids.shape[1], -1).astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp[:-1], tokens[1:, None], axis=-1)[:, 0]


def probe_logprobs(
    graphdef: Any,
    params: Any,
    tokens: np.ndarray,
    *,
    wire: Any = None,
    dtypes: tuple[np.dtype, ...] | None = None,
) -> np.ndarray:
    """log p(tokens[t + 1] | tokens[: t + 1]) [T - 1] under ``graphdef`` with ``params``
    (an ``nnx.State``), float32; one forward of T tokens. ``wire``: round the weights
    through this dtype first (a name or a dtype); ``dtypes``: then cast each leaf (in
    ``jax.tree.flatten`` order) to its dtype."""
    if isinstance(wire, str):
        wire = WIRE_DTYPES[wire]
    wire = None if wire is None else np.dtype(wire)
    got = _program()(graphdef, params, np.asarray(tokens, dtype=np.int32), wire, dtypes)
    return np.asarray(got, dtype=np.float32)


@dataclasses.dataclass(frozen=True)
class Probe:
    """A version's probe as published: the ids [T] and the trainer's logprobs [T - 1]."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """One load's check: passed, and the largest per-token |difference| (nats)."""

    ok: bool
    max_diff: float


def compare(
    expected: Sequence[float] | np.ndarray, got: Sequence[float] | np.ndarray, tolerance: float
) -> ProbeResult:
    """``expected`` (the trainer's) against ``got`` (the worker's): ok when every position
    differs by at most ``tolerance``. A length mismatch or a non-finite value fails."""
    want = np.asarray(expected, dtype=np.float64)
    have = np.asarray(got, dtype=np.float64)
    if want.shape != have.shape or not (np.isfinite(want).all() and np.isfinite(have).all()):
        return ProbeResult(False, float("inf"))
    diff = float(np.max(np.abs(want - have))) if want.size else 0.0
    return ProbeResult(diff <= tolerance, diff)


def published_probe(graphdef: Any, params: Any, wire_dtype: Any, tokens: np.ndarray) -> Probe:
    """The probe a trainer publishes with a version: ``tokens`` scored under ``params`` as
    the wire delivers them (every trainer process calls it: the forward is collective)."""
    scores = probe_logprobs(graphdef, params, tokens, wire=wire_dtype)
    return Probe(tuple(int(t) for t in tokens), tuple(float(s) for s in scores))


class ProbeCheck:
    """A worker's side of the check: scores a version's probe with the weights it loaded.

    Args:
      graphdef: the policy's architecture (``nnx.split`` of the worker's abstract model).
      dtypes: a tree like the weights whose leaves have each parameter's dtype (the
        abstract state): the loaded weights are cast to it first, as the trainer's are.
      tolerance: the largest per-token |logprob difference| accepted (nats).
    """

    def __init__(self, graphdef: Any, dtypes: Any, tolerance: float = DEFAULT_TOLERANCE):
        import jax

        self.graphdef, self.tolerance = graphdef, tolerance
        self.dtypes = tuple(np.dtype(x.dtype) for x in jax.tree.leaves(dtypes))

    def __call__(self, params: Any, probe: Probe) -> ProbeResult:
        tokens = np.asarray(probe.tokens, np.int32)
        got = probe_logprobs(self.graphdef, params, tokens, dtypes=self.dtypes)
        return compare(probe.logprobs, got, self.tolerance)


def trainer_probe(
    graphdef: Any, wire_dtype: Any, length: int = DEFAULT_LENGTH
) -> Callable[[Any], Probe | None]:
    """What a trainer's publish calls on each version's params: their probe (None for
    LoRA's adapter versions: the worker merges them into its own base, not checked)."""
    from flax import nnx

    def probe(params: Any) -> Probe | None:
        if not isinstance(params, nnx.State):
            return None
        vocab_size = nnx.merge(graphdef, params).cfg.vocab_size
        return published_probe(graphdef, params, wire_dtype, probe_tokens(vocab_size, length))

    return probe
