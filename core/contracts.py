"""What the core calls on each kind of component: one Protocol per contract.

A plugin implements these; the core's signatures are typed with them. Each member is
documented once, here, and ``docs/plugin_hooks.md`` lists the same members under the
hook that registers the component (``tests/test_contracts.py`` checks that the two
agree, and that every built-in component satisfies its kind's Protocols). Shapes
follow the legend in :mod:`rlax.core.types`.

Data members are read-only properties, so an attribute or a property
satisfies them. Optional capabilities (the curation filters', Dataset, an
algorithm's BatchTerms, Distils and UsesEntropy, a sampler's Resumable) are runtime-checkable:
the core asks with ``isinstance``, never ``hasattr`` or ``getattr``. The
environment contract lives in :mod:`rlax.core.episodes`, the curation filters'
in :mod:`rlax.core.filters`, the weight lane's in :mod:`rlax.core.weight_lane`
and the critic's in :mod:`rlax.core.critic`, all re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from rlax.core.critic import Critic
from rlax.core.episodes import Environment, Episode, ToolParser
from rlax.core.filters import Curriculum, OfflineFilter, OnlineFilter, Refilling, Stateful
from rlax.core.types import Completion, DroppedGroup, Group, PartialGroup, Prompt, RewardResult
from rlax.core.weight_lane import (
    HasServerHalf,
    LaneHost,
    LaneLink,
    LaneServer,
    StepAside,
    WeightLane,
)

if TYPE_CHECKING:
    import jax
    from flax import nnx

    from rlax.core.models.transformer import Transformer

__all__ = [
    "Algorithm",
    "BatchTerms",
    "ChecksRun",
    "Critic",
    "Curriculum",
    "Dataset",
    "Distils",
    "Encoder",
    "Environment",
    "Episode",
    "HasServerHalf",
    "LaneHost",
    "LaneLink",
    "LaneServer",
    "Logger",
    "OfflineFilter",
    "OnlineFilter",
    "Refilling",
    "Resumable",
    "Reward",
    "RolloutSource",
    "Sampler",
    "Stateful",
    "StepAside",
    "Task",
    "Tokenizer",
    "ToolParser",
    "UsesEntropy",
    "WeightLane",
]

# -------------------------------------------------------------------------
# What the core hands to components
# -------------------------------------------------------------------------


@runtime_checkable
class ChecksRun(Protocol):
    """A component of any kind with a rule of its own about the run it is in.

    ``rlax run`` asks every component the run specification holds (task, reward, sampler,
    curation filters, algorithm, curricula, loggers) before any work
    (:mod:`rlax.core.spec.rules`); a refusal is one line naming the component's setting.
    """

    def check_run(self, spec: Any) -> None:
        """Raises ``BadSetting(parameter, why)`` (named as ``<its gin name>.parameter``) or
        ConfigError if this component cannot work in the run ``spec`` (a
        :class:`rlax.core.spec.RunSpec`): a setting of its own against the model, the
        batch, another component. Reads, never changes, and does no expensive work."""


class Encoder(Protocol):
    """What a task (and an offline filter) may call on the policy's tokenizer.

    :class:`rlax.core.models.tokenizer.CharTokenizer` and
    :class:`rlax.core.models.hf_tokenizer.HFTokenizer` are the core's tokenizers;
    ``rlax curate`` without a model passes one that only encodes (UTF-8 bytes).
    """

    def encode(self, text: str, *, bos: bool = False) -> np.ndarray:
        """Token ids of ``text``, int32 [P]; ``bos`` prefixes the begin-of-sequence id.

        Raises ValueError for text it cannot encode (a task reports such a row).
        """


class Tokenizer(Encoder, Protocol):
    """The policy's tokenizer, as a sampler's ``setup`` receives it."""

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of ``ids`` up to the first ``eos_id``, special ids dropped."""

    @property
    def eos_id(self) -> int:
        """The end-of-sequence id: a sampler's stop token."""


# -------------------------------------------------------------------------
# Algorithms (rlax_register_algorithms)
# -------------------------------------------------------------------------


class Algorithm(Protocol):
    """What the trainer (:mod:`rlax.core.trainer.step`) needs of an algorithm.

    The trainer never branches on an algorithm's name, only on its declared
    needs; ``advantages`` runs on the host, ``loss`` inside the jitted step.
    """

    @property
    def needs_reference(self) -> bool:
        """True: the trainer keeps the starting policy frozen and adds its
        ``ref_logprobs`` [B, L] to the batch ``loss`` receives."""

    @property
    def needs_critic(self) -> bool:
        """True: the trainer builds the critic ``value_model`` gives, trains it on
        the same loss and adds ``values`` (with gradient) and ``old_values``
        (without), float32 [B, L], to the batch ``loss`` receives."""

    @property
    def value_model(self) -> Critic:
        """The critic the trainer builds and trains beside the policy (a
        :class:`Critic` component, in gin e.g. ``@critics.head()``); read only
        when ``needs_critic``, so an algorithm without a critic need not have it."""

    def advantages(self, rewards: np.ndarray) -> np.ndarray:
        """Float32 rewards [M, G] of the batch's groups, on the host, to one
        advantage per completion [M, G] (the core spreads each over its
        completion's tokens as the batch's ``advantages``)."""

    def loss(
        self, new_logprobs: jax.Array, batch: dict[str, jax.Array]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The scalar loss to minimise and a dict of scalar metrics, inside the jitted step.

        ``new_logprobs`` [B, L] are the policy's, with gradient; ``batch``
        holds ``tokens`` and ``attention_mask`` [B, T]; ``loss_mask``,
        ``old_logprobs`` (the sampler's), ``advantages`` and ``train_logprobs``
        (the trainer's own at the start of the step) [B, L]; ``group_ids``
        [B]; and what ``needs_reference`` / ``needs_critic`` add. Only
        ``jax.numpy`` operations: the function is traced.
        """


@runtime_checkable
class BatchTerms(Protocol):
    """Per-token terms fixed by the whole rollout batch, for several updates per batch.

    Terms normalised over the batch (PPO's and REINFORCE++'s whitened advantages) are
    then computed once, not per minibatch (:mod:`rlax.core.trainer.epochs`)."""

    def batch_terms(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """Per-token arrays [B, L] of the whole batch (traced; anchors included): each
        minibatch's ``batch`` carries its rows by key; ``loss`` uses them, not its own."""


@runtime_checkable
class Distils(Protocol):
    """An algorithm that may learn from a teacher (on-policy distillation)."""

    @property
    def needs_teacher(self) -> bool:
        """True: the trainer loads ``rlax.train.teacher`` (refusing to start without
        one) and adds its logprobs of the batch's tokens as ``teacher_logprobs``
        [B, L] (:mod:`rlax.core.trainer.teacher`). The teacher is not the
        reference: an algorithm that also ``needs_reference`` (a KL term) gets
        both, ``ref_logprobs`` still of the frozen starting policy."""


@runtime_checkable
class UsesEntropy(Protocol):
    """An algorithm whose loss may use the policy's entropy (an entropy bonus)."""

    @property
    def needs_entropy(self) -> bool:
        """True: the loss's ``batch`` holds ``entropy`` [B, L], the entropy of the
        policy's full tempered distribution at each position, *with* gradient (a
        second output of the same forward pass; :mod:`rlax.core.trainer.step`)."""


# -------------------------------------------------------------------------
# Samplers (rlax_register_samplers)
# -------------------------------------------------------------------------


class Sampler(Protocol):
    """What the trainer, the workers and ``rlax eval`` need of a sampler."""

    def setup(self, model: Transformer, tokenizer: Tokenizer) -> None:
        """Called once, before anything else: the policy's architecture (with its initial
        weights; a worker's is abstract, its weights come by load_weights) and its tokenizer."""

    def load_weights(self, params: nnx.State, version: int) -> None:
        """New weights of the policy (the model's ``nnx.State``) and their
        version, after every update and every pull; later completions carry
        that ``policy_version``."""

    def generate(
        self, prompts: Sequence[Prompt], n: int, *, seed: int
    ) -> list[tuple[Completion, ...]]:
        """``n`` completions of each prompt: one tuple per prompt, in order.

        Each :class:`~rlax.core.types.Completion` holds the generated ids (stop
        token included) [C'], their logprobs under softmax(logits /
        ``temperature``) [C'] (or under the truncated distribution a token was
        drawn from, with each position's ``kept_floor``: top-k / top-p,
        :mod:`rlax.plugins.samplers.sampling`), the text without the stop token, its
        ``finish_reason`` and the ``policy_version`` of the last
        ``load_weights``. ``seed`` changes from call to call; the same prompts,
        weights and seed give the same completions (deterministic mode).
        """

    @property
    def temperature(self) -> float:
        """The sampling temperature; the trainer recomputes logprobs at it."""

    @property
    def max_new_tokens(self) -> int:
        """No completion is longer, in tokens (the trainer pads to it)."""


@runtime_checkable
class Resumable(Protocol):
    """A sampler whose generation can be cut off, continued and re-weighted mid-way.

    The slot engine (``plugins/samplers/engine.py``) has it; the static
    sampler does not. A worker asks with ``isinstance``: with it, a
    preemption notice costs at most one decode chunk per unfinished row (the
    rows go to the parameter server as partial work) and new weights can be
    loaded between decode steps (``rlax.worker.reload_in_flight``).
    """

    def generate_groups(
        self,
        prompts: Sequence[Prompt],
        n: int,
        *,
        seed: int,
        partials: Sequence[PartialGroup | None] | None = None,
        interrupt: Callable[[], bool] | None = None,
        refresh: Callable[[], tuple[nnx.State, int] | None] | None = None,
    ) -> list[tuple[Completion, ...] | PartialGroup]:
        """``generate``, one entry per prompt, with three additions.

        ``partials[i]`` (when given and not None) is prompt i's work so far:
        its finished rows come back unchanged and its unfinished rows continue
        from their tokens, so with greedy decoding the result equals an
        uninterrupted run. ``interrupt()`` is polled between decode chunks;
        once it is True the call returns at once, a tuple for every group
        whose rows all finished and a :class:`~rlax.core.types.PartialGroup`
        for every other. ``refresh()`` is polled between decode chunks too;
        a ``(params, version)`` it returns is loaded for the tokens that
        follow, rows in flight keep going, and each completion's
        ``versions`` records which version produced each token
        (``policy_version`` is the oldest).
        """


# -------------------------------------------------------------------------
# Rewards (rlax_register_rewards)
# -------------------------------------------------------------------------


class Reward(Protocol):
    """What the workers, the inline trainer and the evaluation need of a reward.

    Workers call it in a :class:`rlax.core.rollout.reward_pool.RewardPool`
    (other processes, a timeout per call), so the object must be picklable.
    """

    def score(self, prompt: Prompt, completion_text: str) -> float | RewardResult:
        """The reward of one completion: a finite number, or a
        :class:`~rlax.core.types.RewardResult` (the number and why).

        ``prompt.answer`` is the task's ground truth; the text is the
        completion decoded without its stop token. A call that raises, hangs
        or returns a non-finite number scores 0 and is counted. Evaluation
        counts a completion as correct when its score is at least 1.
        """


# -------------------------------------------------------------------------
# Tasks (rlax_register_tasks)
# -------------------------------------------------------------------------


class Task(Protocol):
    """What the parameter server, the trainer and ``rlax eval`` need of a task."""

    def prompts(self, split: str, *, tokenizer: Encoder, seed: int) -> Iterator[Prompt]:
        """The prompts of ``split``, encoded with the policy's ``tokenizer``.

        ``"train"``: an endless stream in an order fixed by ``seed`` (a
        restarted parameter server draws it again up to its saved position).
        ``"eval"``: the finite held-out set, independent of ``seed``. Each
        ``Prompt.id`` is stable; ValueError (OSError for a missing file) for
        data the task cannot use.
        """


@runtime_checkable
class Dataset(Protocol):
    """A task with a finite dataset: what ``rlax curate`` needs besides :class:`Task`."""

    def load(self, split: str, *, tokenizer: Encoder) -> list[Prompt]:
        """Every well-formed prompt of ``split``, in dataset order."""

    def rows(self, prompts: Sequence[Prompt]) -> list[dict[str, Any]]:
        """The dataset rows of ``prompts`` (from ``load``), in order, fields as
        read: ``rlax curate`` writes them out unchanged."""

    @property
    def malformed(self) -> Sequence[Any]:
        """The rows ``load`` skipped so far, each with ``source`` (a file or
        hub name), ``index`` (the row's) and ``reason``, for the report."""


# -------------------------------------------------------------------------
# Rollout sources (the trainer's; not a plugin kind)
# -------------------------------------------------------------------------


class RolloutSource(Protocol):
    """Where the trainer's batches come from and where its weights go.

    The training loop (``core/trainer/loop.py``) holds one and never asks
    which: ``InlineRollouts`` (a sampler in the trainer's process) and
    ``RemoteRollouts`` (the parameter server's rollout queue), both in
    ``core/trainer/sources.py``. A source owns its data position: it says what
    a checkpoint records of it and resumes from it itself. With several
    trainer processes only process 0 calls ``next_batch``, ``done`` and
    ``position``; every process calls the others.
    """

    @property
    def curation(self) -> Sequence[Any]:
        """The trainer's own curation filters, run on every batch (state: ``curation_state``)."""

    def next_batch(self, version: int) -> tuple[list[Group | DroppedGroup], dict[str, float]]:
        """The next batch, for the policy of weight ``version``, and the source's metrics.

        One entry per prompt: the scored :class:`Group` when curation kept it,
        or a :class:`DroppedGroup` (its rewards, float32 ``[G]``) when a filter
        dropped it, so the reward metrics still see every sample.
        """

    def publish(self, params: Any, version: int) -> dict[str, float]:
        """Makes ``params`` the weights rollouts are generated with, as ``version``; its metrics."""

    def done(self) -> None:
        """The last batch is trained on and its weights published: acknowledge it."""

    def close(self) -> None:
        """Releases the source's connections (the run is over or stopping)."""

    def position(self) -> dict[str, Any]:
        """The data position a checkpoint records (JSON): what ``restore`` continues from."""

    def restore(self, position: dict[str, Any]) -> None:
        """Continues from a checkpoint's ``position``; called only when one was restored.

        Raises:
          SourceMismatch: another kind of source recorded ``position``.
        """

    def resume(self, params: Any, version: int) -> int:
        """Publishes the restored (or initial) ``params`` of ``version`` and serves from there.

        Returns:
          The version they were published as: ``version``, or a later one when
          versions already served must not be reused (they only grow).
        """

    def curation_state(self) -> list[dict[str, Any] | None]:
        """Each curation filter's state (None for a stateless one), for the checkpoint."""

    def load_curation_state(self, states: Sequence[dict[str, Any] | None]) -> None:
        """Puts back the filters' ``curation_state`` from a checkpoint."""


# -- Loggers (rlax_register_loggers) ---------------------------------------
class Logger(Protocol):
    """Where process 0 of the trainer sends metrics and traces; a raise is only a warning."""

    def open(self, run_dir: str, step: int) -> None:
        """Once, first: the run directory and the last step done (0, or a resume's step)."""

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Step ``step``'s row of ``metrics.jsonl``: numbers by name, ``time`` its wall clock."""

    def log_traces(self, step: int, traces: list[dict[str, Any]]) -> None:
        """The rows ``rollouts.jsonl`` got at step ``step``: one sampled group each."""

    def close(self) -> None:
        """Once, at the end of the run or at a preemption's safe point."""
