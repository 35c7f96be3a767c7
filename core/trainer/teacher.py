"""The teacher of on-policy distillation: its per-token logprobs on the batch's tokens.

An algorithm whose ``needs_teacher`` is true (the ``distill`` algorithm, or
any :class:`~rlax.plugins.algorithms.policy_gradient.PolicyGradient` with a
distillation piece) reads the teacher's logprobs of the sampled tokens from
the batch's ``teacher_logprobs``. The trainer role loads the teacher named by
``rlax.train.teacher`` and, before each step, adds its logprobs to the batch
under that key, which is the teacher's alone: the reference mechanism
(``ref_logprobs``, :mod:`rlax.core.trainer.step`) means only the frozen
starting policy. An algorithm that distils and also has a KL term to the
reference (``needs_reference``) gets both, the teacher's logprobs for its
distillation term and the starting policy's for its KL term; several updates
per batch carry both to every minibatch.

The teacher may differ from the student in size and architecture; it must
use the same tokenizer (token ids), which is checked by vocabulary size. It
runs on the default device with one compiled forward pass per batch shape. Its
pass is packed as the student's step is (:mod:`rlax.core.trainer.packing`,
the ``packing``, ``microbatch_tokens`` and ``row_tokens`` of its settings):
on ragged lengths it scores packed rows, one token-budget microbatch at a
time, and gathers the logprobs back into the padded layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlax.core.errors import ConfigError
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.parallel import mesh as meshlib
from rlax.core.trainer import packing
from rlax.core.trainer.microbatch import packed_forward, unpack
from rlax.core.trainer.settings import TrainerSettings

KEY = "teacher_logprobs"  # the batch's key of the teacher's logprobs [B, L]


class Teacher:
    """A frozen model scoring the batch's tokens.

    Args:
      model: the teacher.
      temperature: the sampler's temperature (the student's logprobs are of
        the tempered policy; the teacher's are tempered alike).
      settings: how its pass is laid out (packing; the rest is the student's step's).
    """

    def __init__(
        self,
        model: Transformer,
        *,
        temperature: float = 1.0,
        settings: TrainerSettings | None = None,
    ):
        graphdef, params = nnx.split(model)
        self.vocab_size = model.cfg.vocab_size
        self._embed_dim = model.cfg.embed_dim
        self._params = params
        self.settings = settings or TrainerSettings()
        mesh = meshlib.single_device_mesh()

        def logprobs(params, tokens, attention_mask):
            logp, _ = sequence_logprobs(
                nnx.merge(graphdef, params), tokens, attention_mask, temperature
            )
            return jax.lax.stop_gradient(logp.astype(jnp.float32))

        def packed(params, tokens, segments, index, k):
            inputs = {"tokens": tokens, "attention_mask": segments}
            out = packed_forward(lambda mb: logprobs(params, **mb), inputs, k, mesh)
            return unpack(out, index)

        self._logprobs = jax.jit(logprobs)
        self._packed = jax.jit(packed, static_argnums=4)

    def check_student(self, student: Transformer, setting: str = "rlax.train.teacher") -> None:
        """ConfigError unless the teacher reads the student's token ids (same vocabulary)."""
        if student.cfg.vocab_size != self.vocab_size:
            raise ConfigError(
                f"{setting}: the teacher's vocabulary has {self.vocab_size} tokens, the "
                f"student's {student.cfg.vocab_size}; distillation needs one tokenizer"
            )

    def logprobs(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """The teacher's logprob of each target token, [B, T-1] float32 (as ``old_logprobs``)."""
        tokens, mask = np.asarray(arrays["tokens"]), np.asarray(arrays["attention_mask"])
        if self.settings.packing != "padded":
            rows, width = mask.shape
            row_tokens = self.settings.row_tokens or width
            budget = packing.rows_per_microbatch(self.settings.microbatch_tokens, row_tokens, rows)
            plan = packing.plan(mask, row_tokens)
            k, per = packing.layout(plan.used, rows, budget)
            if self.settings.packing == "packed" or packing.packed_is_cheaper(
                rows, width, 1, plan, row_tokens, per, self._embed_dim, packed_passes=1
            ):
                arrays = {"tokens": tokens, "attention_mask": mask}
                p = packing.pack(arrays, row_tokens, per, plan, k=k)
                out = self._packed(
                    self._params,
                    p[packing.PACKED_TOKENS],
                    p[packing.PACKED_SEGMENTS],
                    p[packing.UNPACK_INDEX],
                    k,
                )
                return np.asarray(out)  # 0 where no target of a sequence
        return np.asarray(self._logprobs(self._params, tokens, mask))

    def annotate(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``arrays`` with the teacher's logprobs as ``teacher_logprobs``."""
        return {**arrays, KEY: self.logprobs(arrays)}
