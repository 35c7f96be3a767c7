"""Sequence lengths a run specification implies, and the rules on them.

The longest sequence of a run is its longest prompt plus the sampler's budget
(``max_new_tokens``). It must fit the model's context, where the model declares one
(HF ``max_position_embeddings``, GGUF ``context_length``, ``context`` in an rlax model's
info), and the trainer's packed rows (``rlax.trainer_settings.row_tokens``), which never
split a sequence. The longest prompt is the sampler's own bound where it has one
(``max_prompt_tokens``), else the longest of the task's first :data:`PROMPTS_MEASURED`
training prompts, tokenised as the run will.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import pathlib
from typing import TYPE_CHECKING, Any

from rlax.core.errors import ConfigError

if TYPE_CHECKING:
    from rlax.core.spec.run import RunSpec

__all__ = ["CacheBytes", "check_lengths", "longest_prompt", "model_facts", "sampler_cache_bytes"]

PROMPTS_MEASURED = 2048
BYTES_PER_VALUE = 4  # the samplers keep their keys and values in float32


def model_facts(reference: Any) -> tuple[Any, int | None]:
    """``(TransformerConfig or None, context or None)`` of a model reference, read from its
    metadata alone (no weights, no JAX arrays); read once per process (a GGUF file's
    metadata takes seconds to parse)."""
    return _model_facts(os.fspath(reference))


@functools.lru_cache(maxsize=8)
def _model_facts(reference: str) -> tuple[Any, int | None]:
    from rlax.core.models.sources import ModelSourceError, resolve

    try:
        kind, path = resolve(reference)
    except ModelSourceError:
        return None, None
    try:
        if kind == "gguf":
            from rlax.core.models.gguf import GGUFFile

            gguf = GGUFFile(path)
            context = gguf.arch_get("context_length", None)
            return gguf.config(), int(context) if context else None
        if kind == "hf":
            from rlax.core.models.hf_config import config_from_hf

            values = json.loads((path / "config.json").read_text())
            context = values.get("max_position_embeddings")
            return config_from_hf(values), int(context) if context else None
        from rlax.core.models.config import TransformerConfig

        meta = json.loads((pathlib.Path(path) / "model.json").read_text())
        context = (meta.get("info") or {}).get("context")
        return TransformerConfig.from_dict(meta["config"]), int(context) if context else None
    except (OSError, ValueError, KeyError, TypeError):
        return None, None  # loading it says what is wrong, with the setting's name


def longest_prompt(spec: RunSpec) -> int | None:
    """The longest prompt of the run, in tokens (None: it cannot be told cheaply)."""
    bound = getattr(spec.sampler, "max_prompt_tokens", None)
    if isinstance(bound, int):
        return bound
    from rlax.core.models.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(spec.init_checkpoint)
        prompts = spec.task.prompts("train", tokenizer=tokenizer, seed=spec.seed)
        return max((len(p.tokens) for p in itertools.islice(prompts, PROMPTS_MEASURED)), default=0)
    except Exception:  # noqa: BLE001 -- the roles load them and say what is wrong
        return None


def check_lengths(spec: RunSpec, role: str) -> None:
    """The longest sequence fits the model's context and the trainer's packed rows."""
    budget = getattr(spec.sampler, "max_new_tokens", None)
    if not isinstance(budget, int):
        return
    _, context = model_facts(spec.init_checkpoint)
    settings = spec.train.trainer_settings
    row = settings.row_tokens if settings is not None and settings.packing != "padded" else None
    if context is None and row is None:
        return
    prompt = longest_prompt(spec)
    if prompt is None:
        return
    longest = prompt + budget
    if context is not None and longest > context:
        raise ConfigError(
            f"rlax.run.sampler: max_new_tokens {budget} after the longest prompt ({prompt} "
            f"tokens) makes {longest} tokens, beyond the model's context of {context} "
            f"(rlax.run.init_checkpoint); lower max_new_tokens to at most {context - prompt}"
        )
    if row is not None and role in ("all", "trainer", "inline") and longest > row:
        raise ConfigError(
            f"rlax.trainer_settings.row_tokens: {row} is shorter than the longest sequence, "
            f"{longest} tokens (a prompt of {prompt} + max_new_tokens {budget}; a sequence is "
            f"never split across rows); set it to at least {longest}, or None"
        )


class CacheBytes(int):
    """A sampler cache's size in bytes, with the ``rows`` and ``columns`` it was sized for."""

    rows: int
    columns: int


def sampler_cache_bytes(spec: RunSpec) -> CacheBytes | None:
    """The bytes of keys and values one sampler holds for its rows (None: unknown).

    Rows: the engine's ``slots``, else a worker's lease (prompts x samples) or the held-out
    evaluation's batch of 64 problems x its samples, whichever is more. Columns: the
    longest prompt plus the budget.
    """
    budget = getattr(spec.sampler, "max_new_tokens", None)
    config, _ = model_facts(spec.init_checkpoint)
    if config is None or not isinstance(budget, int):
        return None
    slots = getattr(spec.sampler, "slots", None)
    lease = spec.worker.prompts_per_lease * spec.group_size
    rows = slots if isinstance(slots, int) else max(lease, 64 * spec.held_out.samples)
    prompt = getattr(spec.sampler, "max_prompt_tokens", None)
    columns = (prompt if isinstance(prompt, int) else 0) + budget
    per_token = config.num_layers * 2 * config.num_kv_heads * config.head_dim * BYTES_PER_VALUE
    size = CacheBytes(math.prod((rows, columns, per_token)))
    size.rows, size.columns = rows, columns
    return size
