# mypy: disable-error-code="empty-body"
"""Every hook rlax calls: the whole contract between the core and its plugins.

A plugin is a module (or any object) with functions named after these hooks
and marked with ``rlax.core.hookimpl``; an implementation may accept any
subset of a hook's arguments. Plugins are found through the entry-point group
``rlax`` (the built-ins are listed there too) and loaded by
``rlax.core.plugins.PluginManager.load``.

No hook here is ``firstresult`` or ``historic``: every registration hook's
results are collected from all plugins, and every lifecycle hook is a plain
notification to all plugins. ``docs/plugin_hooks.md`` documents each hook with
a runnable example, and what the core calls on each kind of component: the
Protocols of :mod:`rlax.core.contracts`, where each member is documented.
"""

from __future__ import annotations

from collections.abc import Callable

from rlax.core import hookspec

# -------------------------------------------------------------------------
# Registration hooks: each returns ``{component name: factory}``.
#
# A factory is a class or function whose parameters are keyword-only; every
# registered component becomes a gin configurable named after its kind, e.g.
# ``@algorithms.grpo()`` or ``rewards.arithmetic.timeout_s = 5``. A name must
# be a Python identifier and unique within its kind across all plugins.
# -------------------------------------------------------------------------


@hookspec
def rlax_register_algorithms() -> dict[str, Callable[..., object]]:
    """Register RL algorithms.

    Each factory builds a ``rlax.core.contracts.Algorithm``: the flags
    ``needs_reference`` and ``needs_critic`` (with a critic, ``value_model``:
    a ``rlax.core.contracts.Critic``, see :func:`rlax_register_critics`),
    ``advantages(rewards) -> advantages`` (float32 [M, G] -> [M, G], on the
    host) and ``loss(new_logprobs, batch) -> (loss, metrics)`` (inside the
    jitted step; ``batch`` is a dict of arrays). An algorithm may also be a
    ``rlax.core.contracts.BatchTerms`` (``batch_terms``: per-token terms of
    the whole rollout batch, for several updates per batch) and a
    ``rlax.core.contracts.Distils`` (``needs_teacher``: it learns from a teacher)
    and a ``rlax.core.contracts.UsesEntropy`` (``needs_entropy``: its loss gets
    the policy's entropy with gradient).

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each algorithm name to its factory. The gin configurable
      is ``algorithms.<name>``.
    """


@hookspec
def rlax_register_rewards() -> dict[str, Callable[..., object]]:
    """Register reward functions.

    Each factory builds a ``rlax.core.contracts.Reward``:
    ``score(prompt, completion_text) -> float | RewardResult``, where
    ``prompt`` is a ``rlax.core.types.Prompt`` and the result is a finite
    number or a ``rlax.core.types.RewardResult`` (a score and its reason).

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each reward name to its factory. The gin configurable is
      ``rewards.<name>``.
    """


@hookspec
def rlax_register_samplers() -> dict[str, Callable[..., object]]:
    """Register samplers.

    Each factory builds a ``rlax.core.contracts.Sampler``: ``setup(model,
    tokenizer)``, ``load_weights(params, version)``, ``generate(prompts, n, *,
    seed) -> list[tuple[Completion, ...]]`` (per-token logprobs in each
    ``Completion``) and the attributes ``temperature`` and ``max_new_tokens``.
    A sampler may also be a ``rlax.core.contracts.Resumable``
    (``generate_groups``: cut off by a preemption, continued from partial
    work, new weights between decode steps).

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each sampler name to its factory. The gin configurable is
      ``samplers.<name>``.
    """


@hookspec
def rlax_register_curation_filters() -> dict[str, Callable[..., object]]:
    """Register curation filters.

    Each factory builds a filter with one or more of the capabilities
    ``rlax.core.contracts.OfflineFilter`` (``offline(prompts) -> Curated``,
    for ``rlax curate``: the kept prompts and the dropped ones with reasons),
    ``rlax.core.contracts.OnlineFilter`` (``online(groups) -> groups``, each
    round of scored groups), ``rlax.core.contracts.Curriculum`` (``admit``,
    ``observe``; run by the parameter server), ``rlax.core.contracts.Refilling``
    (``extra_rounds``) and ``rlax.core.contracts.Stateful`` (``state_dict``,
    ``load_state_dict``). The core asks which with ``isinstance``.

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each filter name to its factory. The gin configurable is
      ``curation.<name>``.
    """


@hookspec
def rlax_register_tasks() -> dict[str, Callable[..., object]]:
    """Register tasks.

    Each factory builds a ``rlax.core.contracts.Task``: ``prompts(split, *,
    tokenizer, seed) -> Iterator[Prompt]``, where ``"train"`` is an endless
    stream in an order fixed by ``seed`` and ``"eval"`` the finite held-out
    set. ``rlax curate`` also needs a ``rlax.core.contracts.Dataset``
    (``load(split, *, tokenizer) -> list[Prompt]``, ``rows(prompts)``,
    ``malformed``).

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each task name to its factory. The gin configurable is
      ``tasks.<name>``.
    """


@hookspec
def rlax_register_loggers() -> dict[str, Callable[..., object]]:
    """Register loggers: where a run's metrics and rollout traces are sent.

    Each factory builds a ``rlax.core.contracts.Logger``: ``open(run_dir,
    step)``, ``log_metrics(step, metrics)`` (each step's row of
    ``metrics.jsonl``), ``log_traces(step, traces)`` (the rows of
    ``rollouts.jsonl``) and ``close()``. gin selects several at once
    (``rlax.watch.loggers``); the trainer's process 0 calls them, and a call
    that raises is a warning, never the end of the run.

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each logger name to its factory. The gin configurable is
      ``loggers.<name>``.
    """


@hookspec
def rlax_register_environments() -> dict[str, Callable[..., object]]:
    """Register multi-turn environments.

    Each factory builds a ``rlax.core.contracts.Environment``: ``limits`` (an
    ``rlax.core.episodes.EpisodeLimits``: turns, tokens per turn, tokens per
    episode, seconds per tool call) and ``start(prompt, tokenizer) ->
    Episode``, where an ``rlax.core.contracts.Episode`` answers each model turn
    with ``step(turn_text) -> Observation | None`` (token ids to append and
    their text; None ends the episode), then gives ``reward()`` and ``info``;
    an episode may open with ids of its own (``prompt_tokens``, the same for every
    episode of a prompt: its group's prompt for the trainer).
    ``@samplers.episodes(sampler=..., environment=...)`` plays them.

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each environment name to its factory. The gin
      configurable is ``environments.<name>``.
    """


@hookspec
def rlax_register_agents() -> dict[str, Callable[..., object]]:
    """Register agents: code that plays an episode through an OpenAI-compatible client.

    Each value is the agent itself: a function ``agent(client, prompt)``, or a
    class whose instances are called so (``async def`` for an
    ``openai.AsyncOpenAI`` client). ``client`` is an ``openai`` client pointed
    at the worker's endpoint with the episode's own key; ``prompt`` the task's
    ``Prompt`` (``text``, ``answer``). It returns a reward (a number), an answer
    (a string the reward plugin scores) or an
    ``rlax.core.rollout.agents.episodes.AgentResult``.
    ``@samplers.agents(sampler=..., agent=...)`` runs the episodes, token exact.

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each agent name to the agent. The gin configurable is
      ``agents.<name>``: ``@agents.<name>`` is a function agent (its keyword
      parameters bound by gin), ``@agents.<name>()`` a class agent's instance.
    """


@hookspec
def rlax_register_tool_parsers() -> dict[str, Callable[..., object]]:
    """Register tool-call parsers.

    Each factory builds a ``rlax.core.contracts.ToolParser``: ``parse(text) ->
    list[ToolCall]`` (the calls in a model turn; ValueError for a malformed
    one) and ``format_result(call, result) -> str`` (the observation's text);
    optionally ``result_framing = (before, after)``, the format's own frame
    around each result, placed as framing (its added tokens as ids).

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each parser name to its factory. The gin configurable is
      ``tool_parsers.<name>``.
    """


@hookspec
def rlax_register_weight_lanes() -> dict[str, Callable[..., object]]:
    """Register weight lanes: ways of carrying weight bytes between a client and a server.

    Each factory builds a ``rlax.core.contracts.WeightLane`` as configured;
    every parameter-server client calls ``open(link) -> WeightLane | None``
    with its ``rlax.core.contracts.LaneLink`` (settings, gRPC channel, token
    metadata, ``call``, ``onward``), then ``push(header, pieces, sizes) ->
    PushReply``, ``pull(have_version, buffer) -> (version, tensors, buffer) |
    None`` and ``close()`` on what it returned. A lane that cannot carry a
    transfer raises ``rlax.core.contracts.StepAside`` before reading it, and the
    next lane of ``rlax.ps_settings.weight_lanes`` carries it. A lane the
    server takes part in is also a ``rlax.core.contracts.HasServerHalf``:
    ``serve(host) -> LaneServer | None``, and every parameter server that
    lists the lane mounts what it returns (gRPC handlers, methods behind the
    token, start and stop, ``Stat`` figures). The factory's keyword parameters are the lane's
    settings. The built-ins are ``split``, ``relay``, ``bulk`` and ``grpc``.

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each lane name to its factory. The gin configurable is
      ``weight_lanes.<name>``; ``rlax.ps_settings.weight_lanes`` lists names.
    """


@hookspec
def rlax_register_critics() -> dict[str, Callable[..., object]]:
    """Register critics: the value models an algorithm with a critic trains beside the policy.

    Each factory builds a ``rlax.core.contracts.Critic``: ``build(policy, rngs)
    -> nnx.Module`` (a fresh critic module for the policy; the trainer trains
    its parameters with the policy's and checkpoints them together) and
    ``values(module, policy, hidden, tokens, attention_mask) -> values``
    (float32 [B, T], inside the jitted step, given the policy's final hidden
    states [B, T, D] of the same forward pass). An algorithm that
    ``needs_critic`` gives one as its ``value_model``
    (``algorithms.ppo.value_model = @critics.separate()``). The built-ins are
    ``head`` and ``separate``.

    Called once per plugin when the plugin manager loads; not firstresult, not
    historic.

    Returns:
      A dict mapping each critic name to its factory. The gin configurable is
      ``critics.<name>``.
    """


# -------------------------------------------------------------------------
# Lifecycle hooks: notifications from a running experiment.
#
# Loggers, dashboards and alerts are plugins of this kind. Each is called on
# every plugin that implements it; return values are ignored.
# -------------------------------------------------------------------------


@hookspec
def rlax_on_step_end(step: int, metrics: dict[str, float]) -> None:
    """The trainer finished an optimisation step.

    Not firstresult, not historic; return values are ignored.

    Steps are numbered from 1, and one number names a step everywhere: step
    ``k`` is the k-th update (after it ``trainer.state.step == k``), the row
    of ``metrics.jsonl`` whose ``"step"`` is ``k``, the progress bar's ``k``
    and the checkpoint :func:`rlax_on_checkpoint` reports after it. (A step
    whose batch kept no group updates nothing but still counts.)

    Args:
      step: the number of the step just finished (the first step is 1).
      metrics: scalar metrics of that step by name, e.g. ``{"loss": 0.31}``
        (``metrics["step"] == step``). Plugins must not mutate it.
    """


@hookspec
def rlax_on_weights_published(version: int) -> None:
    """The trainer published a new weight version to the parameter server.

    Not firstresult, not historic; return values are ignored.

    Args:
      version: the weight version now current (it only ever increases).
    """


@hookspec
def rlax_on_checkpoint(step: int, path: str) -> None:
    """A checkpoint was written completely.

    Not firstresult, not historic; return values are ignored.

    Args:
      step: the number of the last step the checkpoint holds, the ``step``
        that :func:`rlax_on_step_end` reported for it (a run resumed from it
        continues with ``step + 1``); for the final policy, the last step.
      path: the checkpoint's directory (``RUN/train_state/<step>`` or the
        exported ``RUN/checkpoint``).
    """


@hookspec
def rlax_on_preemption(role: str, reason: str) -> None:
    """A process was asked to stop and is about to stop at a safe point.

    Not firstresult, not historic; return values are ignored. The process
    then exits with status 75 (``rlax.core.cli.EXIT_PREEMPTED``).

    Args:
      role: the role of the process: ``"trainer"``, ``"worker"`` or
        ``"param_server"``.
      reason: what asked it to stop, e.g. ``"SIGTERM"`` or a notice file's path.
    """
