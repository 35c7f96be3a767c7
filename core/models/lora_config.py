"""Which projections get LoRA adapters, and how large (``rlax.lora`` in gin).

A setting of the run specification, read by every role that reads settings (the
supervisor checks it, the trainer trains with it): no JAX here. The adapters themselves
are :mod:`rlax.core.models.lora`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated

from rlax.core.constraints import AtLeast, OneOf, Positive, Range
from rlax.core.errors import ConfigError
from rlax.core.types import FLOAT_DTYPES

__all__ = ["BASE_DTYPES", "DEFAULT_TARGETS", "LoraConfig"]

# Every attention and MLP projection of the Llama / Qwen decoders (not the head).
DEFAULT_TARGETS: tuple[str, ...] = (r"(^|/)attn/(q|k|v|o)$", r"(^|/)mlp/(gate|up|down)$")
BASE_DTYPES = FLOAT_DTYPES  # the frozen base's dtype in the trainer


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Which projections get adapters and how large they are.

    In gin (``rlax.lora``)::

        rlax.train.lora = @rlax.lora()
        rlax.lora.rank = 16
        rlax.lora.alpha = 32.0
        rlax.lora.targets = [r"attn/(q|v)$"]

    Attributes:
      targets: regular expressions ``re.search``-ed against each linear layer's
        module name (``"blocks/0/mlp/up"``); a layer matching any gets adapters.
      rank: r, the adapters' inner dimension.
      alpha: the update is scaled by alpha / r.
      dropout: probability of zeroing an input of the adapter path (training only).
      base_dtype: the frozen base's dtype in the trainer, ``float32`` or ``bfloat16``.
      seed: seeds the adapters' initialisation and the dropout masks.
    """

    targets: tuple[str, ...] = DEFAULT_TARGETS
    rank: Annotated[int, AtLeast(1)] = 8
    alpha: Annotated[float, Positive] = 16.0
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.0
    base_dtype: Annotated[str, OneOf(*BASE_DTYPES)] = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        if self.rank < 1:
            raise ConfigError(f"rlax.lora.rank must be >= 1, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"rlax.lora.dropout must be in [0, 1), got {self.dropout}")
        if self.base_dtype not in BASE_DTYPES:
            raise ConfigError(
                f"rlax.lora.base_dtype {self.base_dtype!r}: use one of {sorted(BASE_DTYPES)}"
            )
        if not self.targets:
            raise ConfigError("rlax.lora.targets is empty: name at least one projection pattern")
        for pattern in self.targets:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ConfigError(f"rlax.lora.targets: bad pattern {pattern!r}: {err}") from None

    @property
    def scale(self) -> float:
        return self.alpha / self.rank
