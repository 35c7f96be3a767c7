"""On-policy distillation's teacher: its logprobs join the batch as ``teacher_logprobs``,
apart from the reference's ``ref_logprobs``."""

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
from rlax.core.trainer.epochs import update_on_batch
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.spec import check_teacher
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.core.trainer.teacher import Teacher
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.distill import distill
from rlax.plugins.algorithms.grpo import grpo

CFG = TransformerConfig(
    vocab_size=9, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)
ROOT = pathlib.Path(__file__).resolve().parents[2]


def train_batch():
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
    return make_batch([group], np.zeros((1, 2)), row_multiple=4)


def arrays():
    return batch_arrays(train_batch())


def mean_gap(a, b, mask) -> float:
    """The mask-mean of ``a - b`` (k1 of a KL between the two logprobs)."""
    return float(np.sum((np.asarray(a) - np.asarray(b)) * mask) / mask.sum())


def test_the_teachers_logprobs_are_its_forward_pass_on_the_batch():
    teacher_model = Transformer(CFG, rngs=nnx.Rngs(1))
    a = arrays()
    annotated = Teacher(teacher_model, temperature=0.7).annotate(a)
    assert "ref_logprobs" not in annotated  # the reference's key is not the teacher's
    got = annotated["teacher_logprobs"]
    want, _ = sequence_logprobs(
        teacher_model, jnp.asarray(a["tokens"]), jnp.asarray(a["attention_mask"]), 0.7
    )
    real = np.asarray(a["attention_mask"], bool)
    targets = real[:, :-1] & real[:, 1:]  # a real token predicting a real token
    np.testing.assert_allclose(got[targets], np.asarray(want)[targets], atol=1e-6)


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
    want = mean_gap(s, t, a["loss_mask"])
    assert metrics["distill_reverse_kl"] == pytest.approx(want, abs=1e-5)
    assert metrics["grad_norm"] > 1e-3


def test_distilling_with_a_kl_term_gets_the_teacher_and_the_reference():
    # The KL term's target is the frozen starting student, not the teacher: at step 1 the
    # student is its reference (KL 0) while the teacher differs; at step 2 the KL is the
    # moved student's to the start.
    start = Transformer(CFG, rngs=nnx.Rngs(0))
    algo = distill(kl_beta=0.1, kl_estimator="k1")
    assert algo.needs_teacher and algo.needs_reference
    trainer = Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), algo, optax.sgd(1.0))
    teacher = Transformer(CFG, rngs=nnx.Rngs(1))
    a = Teacher(teacher).annotate(arrays())
    tokens, attn, mask = jnp.asarray(a["tokens"]), jnp.asarray(a["attention_mask"]), a["loss_mask"]
    s0, _ = sequence_logprobs(start, tokens, attn)
    t, _ = sequence_logprobs(teacher, tokens, attn)

    first = trainer.step(a)
    assert abs(first["kl_ref"]) < 1e-6
    assert first["distill_reverse_kl"] == pytest.approx(mean_gap(s0, t, mask), abs=1e-5)
    assert abs(first["distill_reverse_kl"]) > 1e-2  # so a teacher target would have shown

    s1, _ = sequence_logprobs(trainer.model(), tokens, attn)
    second = trainer.step(a)
    assert second["kl_ref"] == pytest.approx(mean_gap(s1, s0, mask), abs=1e-5)
    assert abs(second["kl_ref"]) > 1e-4  # the student moved away from its reference


def test_several_updates_per_batch_carry_the_teacher_to_every_minibatch():
    # Two updates on one batch: both read the teacher's logprobs against the anchors fixed
    # at the start of the batch, so their mean reverse KL is the starting student's.
    student = Transformer(CFG, rngs=nnx.Rngs(0))
    teacher = Transformer(CFG, rngs=nnx.Rngs(1))
    settings = TrainerSettings(epochs=2, minibatches=1)
    trainer = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)), distill(), optax.sgd(1.0), settings=settings
    )
    b = train_batch()
    a = Teacher(teacher).annotate(batch_arrays(b))
    metrics = update_on_batch(trainer, a, a, seed=0, step=0, group_ids=b.group_ids)
    tokens, attn = jnp.asarray(a["tokens"]), jnp.asarray(a["attention_mask"])
    s, _ = sequence_logprobs(student, tokens, attn)
    t, _ = sequence_logprobs(teacher, tokens, attn)
    assert metrics["updates"] == 2.0
    assert metrics["distill_reverse_kl"] == pytest.approx(mean_gap(s, t, a["loss_mask"]), abs=1e-5)


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
