"""scripts/accelerator_memory.py: the parameter counts are Qwen's, the bytes are the
formulas' (checked on a model by hand), and docs/accelerators.md shows exactly what the
script computes."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

from rlax.core.models.config import TransformerConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def memory():
    spec = importlib.util.spec_from_file_location(
        "accelerator_memory", ROOT / "scripts" / "accelerator_memory.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_models_have_the_parameter_counts_qwen_publishes(memory):
    assert list(memory.MODELS) == [
        f"Qwen2.5-{s}" for s in ("0.5B", "1.5B", "3B", "7B", "14B", "32B")
    ]
    for name, (cfg, published) in memory.MODELS.items():
        assert abs(cfg.num_params() / published - 1) < 0.01, name


def test_the_bytes_of_a_small_model_by_hand(memory):
    cfg = TransformerConfig.tiny(16)  # L 4, D 128, K 2, H 32, F 384
    params = cfg.num_params()
    # keys and values x layers x kv heads x head dim x 32 slots x 4096 tokens x 2 bytes
    assert memory.kv_cache_bytes(cfg) == 2 * 4 * 2 * 32 * 32 * 4096 * 2 == 134_217_728
    trainer = memory.trainer_bytes(cfg)
    assert trainer.split == 16 * params
    # remat='block': each layer's bf16 input (8192 tokens x 128) and one block's internals
    assert trainer.whole == 4 * 8192 * 128 * 2 + 8192 * (4 * 128 + 3 * 384) * 2
    # 2 devices divide the 2 kv heads; 4 do not: then the cache is whole on each device
    assert memory.sampler_per_device(cfg, 2) == (2 * params + 134_217_728) / 2
    assert memory.sampler_per_device(cfg, 4) == 2 * params / 4 + 134_217_728
    assert memory.role_bytes(cfg)["param_server"] == 4 * params


def test_bigger_devices_never_need_more_of_them(memory):
    for cfg, _ in memory.MODELS.values():
        needs = [
            memory.devices_needed(memory.trainer_bytes(cfg).per_device, gb)
            for gb in (16, 32, 80, 141)
        ]
        assert needs == sorted(needs, key=lambda n: -n)
        for n, gb in zip(needs, (16, 32, 80, 141)):
            fits = memory.trainer_bytes(cfg).per_device(n) <= 0.9 * gb * 1e9
            smaller = n == 1 or memory.trainer_bytes(cfg).per_device(n // 2) > 0.9 * gb * 1e9
            assert fits and smaller


def test_the_page_shows_the_script_s_tables(memory):
    doc = (ROOT / "docs" / "accelerators.md").read_text()
    assert memory.written(doc) == doc  # python scripts/accelerator_memory.py --write
    assert memory.tables() in doc
    # The page's reading of the table is the table's.
    cfg = memory.MODELS["Qwen2.5-7B"][0]
    assert memory.devices_needed(memory.trainer_bytes(cfg).per_device, 80) == 2
    assert memory.devices_needed(lambda n: memory.sampler_per_device(cfg, n), 80) == 1
    assert memory.devices_needed(memory.trainer_bytes(cfg).per_device, 16) == 16
