"""The slot engine: continuous batching, shared prompts, in-flight weights, resumable rows.

A fixed number of rows (``slots``) decode together, each against its own KV
cache; when a row stops, its slot takes the next pending sample before the
next chunk of decode steps, with no recompilation (the compiled programs are
in :mod:`.engine_steps`, which also explains the ring layout of the caches).
So a long-tailed batch costs about its total tokens, not rows x its longest
row, which is what the static sampler (:mod:`.jax_sampler`, kept as the
simple reference) pays.

- **Shared prompts**: a group's prompt is prefilled once and its keys and
  values copied into the slots of all its samples.
- **Chunks**: a decode call runs up to ``chunk`` steps and returns early once
  ``refill_at`` rows have finished; between calls the engine places new rows
  (their prefill is a call of its own), checks ``interrupt`` and ``refresh``.
- **In-flight weights**: new weights from ``refresh`` apply from the next
  chunk; rows in flight keep going (their cached keys and values stay those
  of the older weights, as in PipelineRL), and each token records its version.
- **Partial rows**: on ``interrupt`` every unfinished group comes back as a
  :class:`~rlax.core.types.PartialGroup`; given back in ``partials``, each
  cut row is prefilled with its prompt and tokens so far and keeps decoding.

Per-token logprobs and kept sets are recorded as the static sampler's
(``recorded_logprobs``, :mod:`.sampling`); a resumed row keeps those of its
earlier tokens. A mixture-of-experts model's rows record each token's experts
(``Completion.routes``, routing replay): the prefill's for the prefix (each
sample of a shared prompt gets a copy), each decode step's for the token it
fed; the last token, never fed, has -1. A resumed row keeps its record, and
its new prefill routes its tokens by it (so its cache is what its earlier
tokens were computed with); the feed token's experts come from decode.

References:
  Yu et al., 2022, "Orca", OSDI (iteration-level scheduling)
  Kwon et al., 2023, https://arxiv.org/abs/2309.06180 (vLLM, paged attention)
  Piché et al., 2025, https://arxiv.org/abs/2509.19128 (PipelineRL, in-flight updates)
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, check_arguments, checked_by
from rlax.core.errors import BadSetting
from rlax.core.models.routing_replay import ROUTES_DTYPE
from rlax.core.models.tokenizer import PAD
from rlax.core.types import PARTIAL, Completion, PartialGroup, Prompt
from rlax.plugins.samplers.engine_host import Row, Table, make_ring
from rlax.plugins.samplers.jax_sampler import JaxSampler, _bucket

if TYPE_CHECKING:  # the engine's settings are read where JAX is not; it decodes where JAX is
    from flax import nnx

    from rlax.core.models.transformer import Transformer

# Rows per place and move call (fixed) and at most per prefill call (a power of two, so
# one shared prompt costs one row): refills compile nothing new once each prompt bucket
# and prefill size has been seen, as the static sampler compiles per prompt bucket.
PREFILL_ROWS, PLACE_ROWS, MOVE_ROWS = 8, 8, 4


def _batches(items: list, size: int, keep_pairs: bool = False) -> list[list]:
    """``items`` in runs of at most ``size``; with ``keep_pairs`` a swap (two moves, each
    slot the other's target) stays in one run, its reads before its writes."""
    runs: list[list] = [[]]
    i = 0
    while i < len(items):
        pair = keep_pairs and i + 1 < len(items) and items[i][:2] == items[i + 1][1::-1]
        take = items[i : i + 2] if pair else items[i : i + 1]
        if len(runs[-1]) + len(take) > size:
            runs.append([])
        runs[-1] += take
        i += len(take)
    return [r for r in runs if r]


def _tiers_fit(
    *,
    slots: int = 32,
    tiers: Sequence[Sequence[int]] = (),
    max_prompt_tokens: int = 256,
    max_new_tokens: int = 8,
    prompt_bucket: int = 8,
    **_,
) -> None:
    """BadSetting unless ``tiers`` lays out ``slots`` rows over the ring these settings size."""
    try:
        make_ring(slots, _columns(max_prompt_tokens, max_new_tokens, prompt_bucket), tiers)
    except ValueError as err:
        raise BadSetting("tiers", str(err).removeprefix("engine sampler: ")) from None


def _columns(max_prompt_tokens: int, max_new_tokens: int, prompt_bucket: int) -> int:
    """Ring columns: the longest bucketed prefix plus the whole budget fits."""
    return _bucket(max_prompt_tokens + max_new_tokens, prompt_bucket) + prompt_bucket


@checked_by(_tiers_fit)
class SlotEngine(JaxSampler):
    """Continuous-batching sampler (``samplers.engine``); a :class:`~rlax.core.contracts.Resumable`.

    Args (besides the static sampler's, which mean the same):
      slots: rows decoded together (R). More slots: more tokens per step;
        fewer: less cache memory and shorter steps. About the number of rows
        the static sampler would batch is a good start.
      chunk: decode steps per call at most (between calls: refills, notices,
        new weights).
      refill_at: a call returns once this many rows finished (0: slots / 8).
      share_prompts: prefill a group's prompt once for all its samples.
      max_prompt_tokens: the longest prompt accepted; with ``max_new_tokens``
        it sizes each slot's cache (S columns).
      tiers: ``(rows, window)`` pairs, the slots split into tiers whose rows
        read only their last ``window`` cache columns (window 0: all S); the
        rows add up to ``slots`` and the last tier reads all S. Empty: windows
        128, 256, ... below S/2 and the whole ring, rows in proportion to
        1 / sqrt(window) (each tier then costs about the same per step).
    """

    def __init__(
        self,
        *,
        slots: Annotated[int, AtLeast(1)] = 32,
        chunk: Annotated[int, AtLeast(1)] = 32,
        refill_at: Annotated[int, AtLeast(0, means="0: slots / 8")] = 0,
        share_prompts: bool = True,
        max_prompt_tokens: Annotated[int, AtLeast(1)] = 256,
        tiers: Sequence[Sequence[Annotated[int, AtLeast(0)]]] = (),
        **sampling,
    ):
        super().__init__(**sampling)
        check_arguments(SlotEngine.__init__, locals(), owner="engine sampler")
        self.slots = slots
        self.chunk = chunk
        self.refill_at = refill_at or max(1, slots // 8)
        self.share_prompts = share_prompts
        self.max_prompt_tokens = max_prompt_tokens
        self.columns = _columns(max_prompt_tokens, self.max_new_tokens, self.prompt_bucket)
        self.ring = make_ring(slots, self.columns, tiers, longest_prompt=max_prompt_tokens)
        self.step = 0  # the number of the next decode step (tier t writes column step % window)
        self.prefilled_tokens = 0  # prefix tokens prefilled, over every call (benchmarks)
        self.decoded_tokens = 0  # tokens drawn by decode steps, over every call

    def setup(self, model: Transformer, tokenizer) -> None:
        import jax
        from flax import nnx

        from rlax.plugins.samplers import engine_steps
        from rlax.plugins.samplers.sampler_mesh import SamplerMesh

        graphdef, state = nnx.split(model)
        self.tokenizer = tokenizer
        eos = (tokenizer.eos_id,) if self.stop_at_eos else ()
        self._stops = tuple(dict.fromkeys(eos + self.stop_tokens))
        self._prefill_fn = jax.jit(functools.partial(engine_steps.prefill, graphdef))
        self._place_fn = jax.jit(
            functools.partial(engine_steps.place, ring=self.ring), donate_argnums=0
        )
        self._move_fn = jax.jit(
            functools.partial(engine_steps.move, ring=self.ring), donate_argnums=0
        )
        self._decode_fn = jax.jit(
            functools.partial(
                engine_steps.decode,
                graphdef,
                ring=self.ring,
                steps=self.chunk,
                refill_at=self.refill_at,
                stop_ids=self._stops,
                top_k=self.top_k,
                top_p=self.top_p,
                method=self._method(model.cfg.vocab_size),
                recorded=self.recorded_logprobs,
            ),
            donate_argnums=1,
        )
        self._fn = self._decode_fn  # JaxSampler's "set up" marker
        self._on_mesh = SamplerMesh.of(self.mesh, self.devices)  # slots: back on it (_kept)
        self._slots = self._kept(engine_steps.empty_slots(model, self.ring))
        self._windows = np.asarray(self.ring.windows())
        self._active = np.zeros(self.slots, bool)
        self._used = np.zeros(self.slots, np.int32)
        self._cfg = model.cfg
        self._moe = model.cfg.moe is not None  # rows record their routes
        self.load_weights(state, 0)

    @property
    def compiles(self) -> int:
        """Programs compiled so far: prefill and place per bucket, decode once."""
        names = ("_prefill_fn", "_place_fn", "_move_fn", "_decode_fn")
        fns = [getattr(self, n, None) for n in names]
        return sum(f._cache_size() for f in fns if f is not None)

    def generate(self, prompts: Sequence[Prompt], n: int, *, seed: int):
        out = self.generate_groups(prompts, n, seed=seed)
        assert all(isinstance(g, tuple) for g in out)  # nothing interrupts this call
        return out

    def generate_groups(
        self,
        prompts: Sequence[Prompt],
        n: int,
        *,
        seed: int,
        partials: Sequence[PartialGroup | None] | None = None,
        interrupt: Callable[[], bool] | None = None,
        refresh: Callable[[], tuple[nnx.State, int] | None] | None = None,
        budgets: Sequence[Sequence[int]] | None = None,
    ) -> list[tuple[Completion, ...] | PartialGroup]:
        """See :class:`rlax.core.contracts.Resumable`; ``budgets[i][j]`` caps sample j of
        prompt i at that many tokens (benchmarks force lengths with it)."""
        import jax

        self._check_ready()
        done, pending = self._requests(prompts, n, partials, budgets)
        table = Table(self.ring)
        prefixes: dict[tuple, tuple[object, int, int]] = {}
        key = jax.random.key(seed)
        calls = 0
        while True:
            self._schedule(table, pending, prefixes)
            if not table.busy():
                break
            if interrupt is not None and interrupt():  # before each chunk: a notice costs none
                return self._cut(prompts, n, done, table, pending)
            calls += 1
            self._decode_once(table, done, jax.random.fold_in(key, calls))
            fresh = refresh() if refresh is not None else None
            if fresh is not None:
                self.load_weights(*fresh)
        return [tuple(done[i][j] for j in range(n)) for i in range(len(prompts))]

    # -- the host's bookkeeping ------------------------------------------------

    def _requests(self, prompts, n, partials, budgets):
        """Finished rows by (prompt, sample), and the rows still to run, in order."""
        done: list[dict[int, Completion]] = [{} for _ in prompts]
        pending: collections.deque[Row] = collections.deque()
        for i, prompt in enumerate(prompts):
            tokens = np.asarray(prompt.tokens, np.int32)
            if not 0 < len(tokens) <= self.max_prompt_tokens:
                raise ValueError(
                    f"engine sampler: prompt {prompt.id!r} has {len(tokens)} tokens; "
                    f"max_prompt_tokens is {self.max_prompt_tokens}"
                )
            partial = partials[i] if partials is not None else None
            if partial is not None and len(partial.rows) != n:
                raise ValueError(
                    f"engine sampler: partial work of {prompt.id!r} has {len(partial.rows)} "
                    f"rows for a group of {n}"
                )
            for j in range(n):
                limit = self.max_new_tokens if budgets is None else int(budgets[i][j])
                row = Row(i, j, tokens, min(limit, self.max_new_tokens))
                old = partial.rows[j] if partial is not None else None
                if old is not None and old.finish_reason != PARTIAL:
                    done[i][j] = old
                    continue
                if old is not None:
                    row.tokens, row.logprobs = old.tokens.tolist(), old.logprobs.tolist()
                    row.versions = (
                        old.versions.tolist()
                        if old.versions is not None
                        else [old.policy_version] * len(old.tokens)
                    )
                    row.floors = self._resumed_kept(old)
                    if old.routes is not None and len(old.routes) == len(row.prefix):
                        row.routes = old.routes.copy()
                pending.append(row)
        return done, pending

    def _schedule(self, table: Table, pending, prefixes) -> None:
        """Moves the rows that outgrew their window, then starts pending rows in free slots."""
        import jax.numpy as jnp

        moves = table.plan_moves(
            self._used, self._active, self._windows, self.step, margin=self.chunk
        )
        paused = sorted(table.paused)
        for batch in _batches(moves, MOVE_ROWS, keep_pairs=True):
            src, dst, ends = (np.full(MOVE_ROWS, x, np.int32) for x in (self.slots, self.slots, 0))
            src[: len(batch)], dst[: len(batch)], ends[: len(batch)] = zip(*batch)
            moved = self._move_fn(self._slots, src, dst, ends, jnp.int32(self.step))
            self._slots = self._kept(moved)
        if paused:
            active = self._slots.active.at[np.asarray(paused)].set(False)
            self._slots = self._kept(self._slots._replace(active=active))
        placed: list[tuple[int, Row, int]] = []
        waiting: collections.deque[Row] = collections.deque()
        while pending:
            row = pending.popleft()
            pb = _bucket(len(row.prefix) - 1, self.prompt_bucket)
            slot = table.free_slot(pb + 1)
            if slot is None:
                waiting.append(row)
                continue
            table.rows[slot] = row
            placed.append((slot, row, pb))
        pending.extend(waiting)
        if placed:
            self._start(placed, pending, prefixes)
        self._active = np.asarray(self._slots.active)
        self._used = np.asarray(self._slots.used)

    def _start(self, placed: list[tuple[int, Row, int]], pending, prefixes) -> None:
        """Prefills the prefixes not yet prefilled (one call per bucket) and places the rows
        (a mixture-of-experts row takes its prefix's routes)."""
        share = self.share_prompts
        fresh: dict[int, dict[tuple, Row]] = collections.defaultdict(dict)
        for _, row, pb in placed:
            k = row.share_key(share)
            if k not in prefixes:
                fresh[pb].setdefault(k, row)
        for pb, rows in fresh.items():
            for batch in _batches(list(rows.items()), PREFILL_ROWS):
                written, routes = self._prefill([r for _, r in batch], pb)
                host = None if routes is None else np.asarray(routes)
                for u, (k, _) in enumerate(batch):
                    prefixes[k] = (written, pb, u, None if host is None else host[u])
        by_buffer: dict[int, tuple[object, int, list[tuple[int, Row, int]]]] = {}
        for slot, row, _ in placed:
            written, pb, u, routes = prefixes[row.share_key(share)]
            if routes is not None:
                _prefix_routes(row, routes)
            by_buffer.setdefault(id(written), (written, pb, []))[2].append((slot, row, u))
        for written, pb, group in by_buffer.values():
            for batch in _batches(group, PLACE_ROWS):
                self._place(written, pb, batch)
        # A shared prefix is dropped once no pending row of its request needs it.
        needed = {r.share_key(share) for r in pending}
        for k in [k for k in prefixes if k not in needed]:
            del prefixes[k]

    def _prefill(self, rows: list[Row], pb: int):
        """The rows' prefixes (without their feed tokens) prefilled: (written, routes or
        None); a resumed mixture-of-experts row's tokens routed by its record."""
        u = 1 << (len(rows) - 1).bit_length()  # 1, 2, 4 or PREFILL_ROWS
        tokens = np.full((u, pb), PAD, np.int32)
        mask = np.zeros((u, pb), bool)
        replay = None
        if self._moe:
            cfg = self._cfg.moe
            assert cfg is not None
            replay = np.full((u, pb, len(self._cfg.moe_layers), cfg.experts_per_token), -1)
            replay = replay.astype(ROUTES_DTYPE)
        for i, row in enumerate(rows):
            p = row.prefix[:-1]
            if len(p):
                tokens[i, pb - len(p) :], mask[i, pb - len(p) :] = p, True
            if replay is not None and row.routes is not None and len(p):
                replay[i, pb - len(p) :] = row.routes[:-1]
            self.prefilled_tokens += len(p)
        return self._prefill_fn(self._state, tokens, mask, replay)

    def _place(self, written, pb: int, group: list[tuple[int, Row, int]]) -> None:
        import jax.numpy as jnp

        w = PLACE_ROWS
        source = np.zeros(w, np.int32)
        target = np.full(w, self.slots, np.int32)  # fillers: out of range, dropped
        valid = np.zeros((w, pb), bool)
        feed, feed_pos, count, limit = (np.zeros(w, np.int32) for _ in range(4))
        for i, (slot, row, u) in enumerate(group):
            prefix = row.prefix
            source[i], target[i] = u, slot
            valid[i, pb - (len(prefix) - 1) :] = True
            feed[i], feed_pos[i] = prefix[-1], len(prefix) - 1
            count[i], limit[i] = len(row.tokens), row.limit
            # The ring holds the prefix bucket and the tokens still to come (S's choice).
            assert pb + row.limit - len(row.tokens) <= self.columns
        self._slots = self._place_fn(
            self._slots,
            written,
            source,
            target,
            valid,
            feed,
            feed_pos,
            count,
            limit,
            jnp.int32(self.step),
        )
        self._slots = self._kept(self._slots)

    def _decode_once(self, table: Table, done, key) -> None:
        import jax.numpy as jnp

        slots, out = self._decode_fn(
            self._state, self._slots, key, jnp.float32(self.temperature), jnp.int32(self.step)
        )
        self._slots = self._kept(slots)
        n = int(out.n)
        self.step += n
        tokens, logprobs, emitted = (np.asarray(a)[:, :n] for a in out[:3])
        floors = np.asarray(out.floors)[:, :n]
        routes = np.asarray(out.routes)[:, :n] if self._moe else None
        self.decoded_tokens += int(emitted.sum())
        self._active = np.asarray(self._slots.active)
        self._used = np.asarray(self._slots.used)
        for slot, row in table.running():
            on = emitted[slot]
            row.tokens += tokens[slot, on].tolist()
            row.logprobs += logprobs[slot, on].tolist()
            row.versions += [self.version] * int(on.sum())
            row.floors += floors[slot, on].tolist()
            if routes is not None and row.routes is not None:
                _decoded_routes(row, routes[slot, on])
            if not self._active[slot] and slot not in table.paused:
                stopped = bool(row.tokens) and row.tokens[-1] in self._stops
                done[row.request][row.sample] = self._finished(row, "stop" if stopped else "length")
                table.rows[slot] = None

    def _resumed_kept(self, old: Completion) -> list[float]:
        """What ``row.floors`` holds for a resumed row's tokens: the kept sets' floors
        (-inf: none, its logprobs are the full distribution's) or, recording the full
        distribution while cutting, their log masses (0: none known)."""
        if self.cuts and not self.truncates:
            if old.sampled_logprobs is None:
                return [0.0] * len(old.tokens)
            return (old.logprobs - old.sampled_logprobs).tolist()
        if old.kept_floor is None:
            return [-np.inf] * len(old.tokens)
        return old.kept_floor.tolist()

    def _finished(self, row: Row, reason: str) -> Completion:
        versions = np.asarray(row.versions, np.int32)
        kept = np.asarray(row.floors, np.float32)  # floors, or under "full" the log masses
        masses = kept if self.cuts and not self.truncates else None
        floors = None if masses is not None else kept
        logprobs = np.asarray(row.logprobs, np.float32)
        same = len(versions) == 0 or bool(np.all(versions == versions[0]))
        return Completion(
            tokens=np.asarray(row.tokens, np.int32),
            logprobs=logprobs,
            text=self.tokenizer.decode(np.asarray(row.tokens, np.int32)),
            finish_reason=reason,
            policy_version=int(versions.min()) if len(versions) else self.version,
            versions=None if same else versions,
            kept_floor=(
                floors
                if floors is not None and (self.truncates or np.isfinite(floors).any())
                else None
            ),
            sampled_logprobs=None if masses is None else logprobs - masses,
            routes=None if row.routes is None else row.routes.copy(),
        )

    def _cut(self, prompts, n, done, table, pending) -> list[tuple[Completion, ...] | PartialGroup]:
        """The result of an interrupted call: finished groups, and partial work for the rest."""
        import jax.numpy as jnp

        for row in [r for _, r in table.running()] + list(pending):
            done[row.request][row.sample] = self._finished(row, PARTIAL)
        self._slots = self._kept(self._slots._replace(active=jnp.zeros((self.slots,), bool)))
        self._active = np.zeros(self.slots, bool)
        out: list[tuple[Completion, ...] | PartialGroup] = []
        for i in range(len(prompts)):
            rows = tuple(done[i][j] for j in range(n))
            cut = any(r.finish_reason == PARTIAL for r in rows)
            out.append(PartialGroup(rows) if cut else rows)
        return out


def _prefix_routes(row: Row, prefilled: np.ndarray) -> None:
    """``row.routes`` once its prefix is prefilled: ``prefilled`` [Pb, L, k] is the bucket's
    routing, the last len(prefix) - 1 of it the prefix's (its feed token is routed by the
    first decode step: -1 until then)."""
    m = len(row.prefix) - 1
    fresh = np.concatenate(
        [prefilled[len(prefilled) - m :], np.full((1, *prefilled.shape[1:]), -1, prefilled.dtype)]
    )
    row.routes = fresh  # a resumed row's recorded experts: the prefill replayed them


def _decoded_routes(row: Row, fed: np.ndarray) -> None:
    """``row.routes`` after a decode call fed the row ``len(fed)`` tokens (its last one and
    those drawn before the last) and drew as many: ``fed`` [n, L, k] are their experts, the
    newest drawn token's -1 (not fed yet)."""
    if not len(fed) or row.routes is None:
        return
    pending = np.full((1, *fed.shape[1:]), -1, fed.dtype)
    row.routes = np.concatenate([row.routes[:-1], fed, pending])


@hookimpl
def rlax_register_samplers():
    return {"engine": SlotEngine}
