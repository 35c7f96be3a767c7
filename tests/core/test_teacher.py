"""On-policy distillation's teacher: its logprobs join the batch as ``ref_logprobs``."""

from __future__ import annotations

import json
import pathlib

import gin
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from cli_runs import NO_CURVES
from flax import nnx

from rlax.core import cli
from rlax.core.errors import ConfigError
from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.core.trainer.teacher import Teacher, check_teacher
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.distill import distill
from rlax.plugins.algorithms.grpo import grpo

CFG = TransformerConfig(
    vocab_size=9, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)
ROOT = pathlib.Path(__file__).resolve().parents[2]


def arrays():
    rng = np.random.default_rng(0)
    comps = tuple(
        Completion(
            rng.integers(3, 9, size=n).astype(np.int32),
            -rng.random(n).astype(np.float32),
            "",
            "stop",
            0,
        )
        for n in (2, 3)
    )
    group = Group(Prompt("0", "", np.array([3, 4, 5], np.int32), ""), comps, np.array([1.0, 0.0]))
    return batch_arrays(make_batch([group], np.zeros((1, 2)), row_multiple=4))


def test_the_teachers_logprobs_are_its_forward_pass_on_the_batch():
    teacher_model = Transformer(CFG, rngs=nnx.Rngs(1))
    a = arrays()
    got = Teacher(teacher_model, temperature=0.7).annotate(a)["ref_logprobs"]
    want, _ = sequence_logprobs(
        teacher_model, jnp.asarray(a["tokens"]), jnp.asarray(a["attention_mask"]), 0.7
    )
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_step_distils_from_the_teacher_in_the_batch():
    student = Transformer(CFG, rngs=nnx.Rngs(0))
    a = arrays()
    # The teacher is the student itself: every advantage is 0, so nothing moves.
    same = Trainer(student, distill(), optax.sgd(1.0))
    metrics = same.step(Teacher(Transformer(CFG, rngs=nnx.Rngs(0))).annotate(a))
    assert metrics["grad_norm"] < 1e-6 and abs(metrics["distill_reverse_kl"]) < 1e-6
    # Another teacher: the reverse KL's k1 is the mask-mean of log student - log teacher.
    other = Transformer(CFG, rngs=nnx.Rngs(1))
    trainer = Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), distill(), optax.sgd(1.0))
    metrics = trainer.step(Teacher(other).annotate(a))
    tokens, attn = jnp.asarray(a["tokens"]), jnp.asarray(a["attention_mask"])
    s, _ = sequence_logprobs(student, tokens, attn)
    t, _ = sequence_logprobs(other, tokens, attn)
    mask = a["loss_mask"]
    want = float(np.sum((np.asarray(s) - np.asarray(t)) * mask) / mask.sum())
    assert metrics["distill_reverse_kl"] == pytest.approx(want, abs=1e-5)
    assert metrics["grad_norm"] > 1e-3


def test_a_distilling_algorithm_needs_a_teacher_of_the_same_vocabulary():
    with pytest.raises(ConfigError, match="rlax.train.teacher: the algorithm distils"):
        check_teacher(distill(), None)
    check_teacher(grpo(), None)  # no teacher needed
    small = Teacher(Transformer(CFG, rngs=nnx.Rngs(0)))
    bigger = dict(CFG.__dict__, vocab_size=12)
    with pytest.raises(ConfigError, match="vocabulary has 9 tokens, the student's 12"):
        small.check_student(Transformer(TransformerConfig(**bigger), rngs=nnx.Rngs(0)))


def test_a_run_without_its_teacher_is_a_one_line_error(capsys):
    gin.clear_config()
    status = cli.main(
        [
            "run",
            "--gin",
            str(ROOT / "configs/experiments/quickstart.gin"),
            "--gin.rlax.train.algorithm=@algorithms.distill()",
            "--role",
            "inline",
        ]
    )
    gin.clear_config()
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rlax: error: rlax.train.teacher: the algorithm distils")


@pytest.mark.e2e
def test_an_inline_run_distils_from_the_teacher_it_names(tmp_path):
    base = ROOT / "assets" / "quickstart-base"
    gin.clear_config()
    status = cli.main(
        [
            "run",
            "--gin",
            str(ROOT / "configs/experiments/quickstart.gin"),
            f"--gin.INIT_CHECKPOINT='{base}'",
            "--gin.rlax.train.algorithm=@algorithms.distill()",
            f"--gin.rlax.train.teacher='{base}'",
            "--gin.PROMPTS_PER_STEP=8",
            "--gin.GROUP_SIZE=2",
            "--gin.tasks.arithmetic.num_eval=4",
            "--gin.rlax.held_out.samples=1",
            "--gin.rlax.held_out.ks=(1,)",
            "--gin.rlax.train.progress=False",
            NO_CURVES,
            "--gin.rlax.train.steps=1",
            "--gin.CURATION=[]",
            "--run-dir",
            str(tmp_path / "run"),
            "--role",
            "inline",
        ]
    )
    gin.clear_config()
    assert status == 0
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # The teacher is the starting student: its reverse KL to the student is 0 at step 1.
    assert abs(row["distill_reverse_kl"]) < 1e-5
