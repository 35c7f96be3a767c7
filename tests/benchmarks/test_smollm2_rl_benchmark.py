"""benchmarks/smollm2_rl.py's pure parts: what it reads from eval.json and from the shipped config.

The benchmark itself runs SmolLM2 for minutes (`--steps 2 --problems 8 --samples 2`
proves it); here the pieces that turn the run's files into its figures."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location(
        "smollm2_rl", ROOT / "benchmarks" / "smollm2_rl.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pass_at_reads_one_entry_of_eval_json():
    m = load()
    evals = {
        "before": {"pass@1": 0.0625, "pass@8": 0.125},
        "after": {"pass@1": 0.1875, "pass@8": 0.5},
    }
    assert m.pass_at(evals, "after") == {"pass@1": 0.1875, "pass@8": 0.5}


def test_the_speed_part_uses_the_shipped_configs_trainer_settings():
    # The step compared with torch must be the one the RL run trains with.
    assert load().config_trainer_settings() == {
        "remat": "block",
        "logprob_chunk_tokens": 256,
        "microbatches": 8,
    }
