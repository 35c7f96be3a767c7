"""The JAX sampler: jitted prefill + decode against a KV cache.

One compiled program per (row bucket, prompt bucket, prompt rows) does the whole
job: a prefill of the left-padded prompts writes the KV cache, then a
``lax.while_loop`` decodes one token per step against it and stops as soon as
every row has produced a stop token (or the budget is spent). Prompts are
left-padded to a multiple of ``prompt_bucket`` and the batch to a power of two
rows, so steady-state sampling never recompiles (``compiles`` counts the
programs built). Groups are batched: each prompt is repeated ``n`` times. When
a batch's distinct prompts fill fewer rows than its samples, each is prefilled
once and its keys and values are copied into its samples' rows
(:meth:`JaxSampler.pad_prompts`); a row's numbers are then those of a prefill
over fewer rows, equal up to float rounding. On the packing benchmark's 8
prompts x 8 samples of 64 tokens the prefill was 0.10 s of a 0.57 s call; the
call is now 0.48 s.

The KV cache is the sampler's own buffer, donated to each call and handed
back by it, not scratch memory of the program: a call's scratch is released
by XLA's threads after its results are ready, so the next call could find the
last one's cache not yet freed and take a second (seen on the CPU: +0.13 GB,
one SmolLM2 cache, in one run of three). One cache is kept, for the last
shape used.

Token choice (temperature, top-k, top-p) is :mod:`.sampling`; each generated
token comes with its log-probability under the distribution it was drawn from
(``recorded_logprobs="truncated"``: top-k / top-p's kept set, whose floor
travels in :attr:`~rlax.core.types.Completion.kept_floor`) or under the full
softmax(logits / temperature) (``"full"``). The trainer recomputes the same
distribution, so the two agree and the trainer reports what mismatch remains.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, OneOf, Range, check_arguments
from rlax.core.models.tokenizer import PAD
from rlax.core.parallel.mesh import MeshConfig
from rlax.core.types import Completion, Prompt
from rlax.plugins.samplers.sampling import METHODS, RECORDED

if TYPE_CHECKING:  # a sampler's settings are read where JAX is not; it samples where JAX is
    import jax
    from flax import nnx

    from rlax.core.models.transformer import KVCache, Transformer
    from rlax.plugins.samplers.sampler_mesh import SamplerMesh

# Above this vocabulary size the sampler draws by inverse CDF and computes the
# prefill's logits at the last position only (smaller ones keep their exact
# historical samples, which the quickstart's results depend on).
_LARGE_VOCAB = 4096


# Why a temperature of 0 is refused, and what to set instead.
GREEDY_HINT = "for greedy decoding set method='greedy'"


def _bucket(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def _row_bucket(n: int) -> int:
    """Next power of two >= n (at least 8): few distinct batch shapes."""
    return max(8, 1 << (n - 1).bit_length())


class JaxSampler:
    """KV-cache sampler for :class:`rlax.core.models.transformer.Transformer`.

    Args:
      max_new_tokens: generation budget per completion.
      temperature: softmax temperature (logprobs are of the tempered distribution).
      top_k: draw only from the k most likely tokens (0 = off).
      top_p: draw only from the smallest set of most likely tokens whose
        probability reaches p (1.0 = off).
      recorded_logprobs: which distribution the recorded logprobs are under
        when top-k / top-p cut (:mod:`.sampling`): ``"truncated"``, the one
        each token was drawn from, with each position's kept set travelling to
        the trainer (which truncates its own distribution the same way, so the
        importance ratio compares like with like); or ``"full"``, the full
        tempered distribution (the trainer's too): the ratio then compares
        distributions the token was not drawn from. Without top-k / top-p the
        two are the same.
      prompt_bucket: prompts are left-padded to a multiple of this length.
      stop_tokens: ids that end a completion besides the tokenizer's eos.
      stop_at_eos: whether the tokenizer's eos ends a completion (benchmarks
        turn it off to generate exactly ``max_new_tokens``).
      method: how a token is chosen (:mod:`.sampling`): ``"gumbel"``,
        ``"inverse_cdf"``, ``"auto"`` (inverse CDF for vocabularies larger
        than 4096, where per-entry noise dominates a decode step), or
        ``"greedy"``: the most likely token (argmax), whatever the seed, with
        its logprob under softmax(logits / temperature). A temperature of 0 is
        refused, not read as greedy: the trainer recomputes logprobs at the
        sampler's temperature.
      mesh: sample over a mesh of this process's devices (:mod:`.sampler_mesh`: the
        trainer's sharding rules); None: one device. ``devices`` (an attribute, set
        before :meth:`setup`) puts the mesh on those devices (with mesh None: tensor
        parallel over them, a sub-mesh one-process placement gives the sampler).
    """

    def __init__(
        self,
        *,
        max_new_tokens: Annotated[int, AtLeast(1)] = 8,
        temperature: Annotated[float, Range(gt=0, means=GREEDY_HINT)] = 1.0,
        top_k: Annotated[int, AtLeast(0, means="0: off")] = 0,
        top_p: Annotated[float, Range(gt=0, le=1, means="1: off")] = 1.0,
        prompt_bucket: Annotated[int, AtLeast(1)] = 8,
        stop_tokens: Sequence[Annotated[int, AtLeast(0)]] = (),
        stop_at_eos: bool = True,
        method: Annotated[str, OneOf("auto", *METHODS)] = "auto",
        recorded_logprobs: Annotated[str, OneOf(*RECORDED)] = "truncated",
        mesh: MeshConfig | None = None,
    ):
        check_arguments(JaxSampler.__init__, locals(), owner="jax sampler")
        self.mesh, self.devices = mesh, None
        self._on_mesh: SamplerMesh | None = None  # made by setup when mesh is set
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = float(top_p)
        self.prompt_bucket = prompt_bucket
        self.stop_tokens = tuple(int(t) for t in stop_tokens)
        self.stop_at_eos = stop_at_eos
        self.method = method
        self.recorded_logprobs = recorded_logprobs
        self._fn: jax.stages.Wrapped | None = None  # jit of decode.generate, bound by setup
        self._state: nnx.State | None = None
        self._abstract = False  # the state holds shapes only (an abstract model's)
        self.version = -1
        self.prefilled_tokens = 0  # prompt positions prefilled so far (buckets included)

    def setup(self, model: Transformer, tokenizer) -> None:
        """Binds the model architecture and tokenizer; weights come via load_weights.

        ``model`` may be abstract (``nnx.eval_shape``, as a worker's is): then
        nothing can be generated until :meth:`load_weights` brings arrays.
        """
        import jax
        from flax import nnx

        from rlax.plugins.samplers import decode
        from rlax.plugins.samplers.sampler_mesh import SamplerMesh

        graphdef, state = nnx.split(model)
        self.tokenizer = tokenizer
        eos = (tokenizer.eos_id,) if self.stop_at_eos else ()
        self._stops = tuple(dict.fromkeys(eos + self.stop_tokens))
        self._fn = jax.jit(
            functools.partial(
                decode.generate,
                graphdef,
                max_new_tokens=self.max_new_tokens,
                stop_ids=self._stops,
                top_k=self.top_k,
                top_p=self.top_p,
                method=self._method(model.cfg.vocab_size),
                last_logits_only=model.cfg.vocab_size > _LARGE_VOCAB,
                recorded=self.recorded_logprobs,
            ),
            donate_argnums=1,  # the cache (cleared in the program, so kept though unread)
            keep_unused=True,
        )
        self._cfg = model.cfg
        self._on_mesh = SamplerMesh.of(self.mesh, self.devices)
        self._cache: KVCache | None = None  # the last call's, handed to the next of its shape
        self.load_weights(state, 0)

    def _method(self, vocab_size: int) -> str:
        if self.method != "auto":
            return self.method
        return "inverse_cdf" if vocab_size > _LARGE_VOCAB else "gumbel"

    @property
    def compiles(self) -> int:
        """How many programs were compiled (one per row and prompt bucket seen)."""
        # jax's stubs type jit's result as stages.Wrapped, which omits the runtime _cache_size.
        return 0 if self._fn is None else self._fn._cache_size()  # type: ignore[attr-defined]

    def load_weights(self, state: nnx.State, version: int) -> None:
        import jax

        self.version = version
        self._abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(state))
        if self._on_mesh is not None and not self._abstract:
            state = self._on_mesh.weights(state)
        self._state = state

    def _kept(self, tree):
        """An array kept between calls, back on its mesh layout (as it is without a mesh)."""
        return tree if self._on_mesh is None else self._on_mesh.place(tree)

    def _check_ready(self) -> jax.stages.Wrapped:
        """The compiled program; RuntimeError unless set up with weights (not just shapes)."""
        name = type(self).__name__
        if self._fn is None:
            raise RuntimeError(f"{name}: setup(model, tokenizer) must be called first")
        if self._abstract:
            raise RuntimeError(
                f"{name}: no weights yet: it was set up with an abstract model; "
                "call load_weights(params, version) first"
            )
        return self._fn

    def pad_prompts(
        self, prompts: Sequence[Prompt], n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The prompts to prefill, left-padded, and each row's: tokens and mask [U, P] and
        rows_of [B]. Each prompt once (U: its row bucket) when that is fewer rows than its
        ``n`` samples' (B); else each repeated ``n`` times (U = B, rows_of the identity).
        One program per (U, P, B) seen: in steady state (the same prompts per call and
        samples per prompt), one."""
        rows = len(prompts) * n
        b = _row_bucket(rows)
        # The prompts' own bucket (a power of two, at least 8, as rows): batches of up to 8
        # rows, whatever their prompts and samples, stay one program (test_sampling).
        u = _row_bucket(len(prompts))
        shared = u < b
        u = u if shared else b
        prefilled = list(prompts) if shared else [x for x in prompts for _ in range(n)]
        p = _bucket(max(len(x.tokens) for x in prompts), self.prompt_bucket)
        tokens = np.full((u, p), PAD, np.int32)
        mask = np.zeros((u, p), bool)
        for i, prompt in enumerate(prefilled):
            length = len(prompt.tokens)
            tokens[i, p - length :] = prompt.tokens
            mask[i, p - length :] = True
        # Bucket filler prompts: one token, ignored on output.
        mask[len(prefilled) :, -1] = True
        rows_of = np.arange(b, dtype=np.int32)
        if shared:  # n rows a prompt; filler rows take a filler prompt if there is one
            rows_of //= n
            rows_of[rows:] = len(prompts) if len(prompts) < u else 0
        return tokens, mask, rows_of

    def generate(
        self, prompts: Sequence[Prompt], n: int, *, seed: int
    ) -> list[tuple[Completion, ...]]:
        """Samples ``n`` completions for each prompt; one tuple per prompt."""
        import jax
        import jax.numpy as jnp

        fn = self._check_ready()
        tokens, mask, rows_of = self.pad_prompts(prompts, n)
        self.prefilled_tokens += tokens.size
        out_tok, out_logp, out_floor, cache, routes = fn(
            self._state,
            self._cache_for(len(rows_of), tokens.shape[1]),
            tokens,
            mask,
            rows_of,
            jax.random.key(seed),
            jnp.float32(self.temperature),
        )
        self._cache = self._kept(cache)
        out_tok, out_logp = np.asarray(out_tok), np.asarray(out_logp)
        kept = np.asarray(out_floor)  # floors, or under "full" the kept log masses
        floors = kept if self.truncates else None
        masses = kept if self.cuts and not self.truncates else None
        completions = [
            tuple(
                self._completion(
                    out_tok[i * n + j],
                    out_logp[i * n + j],
                    None if floors is None else floors[i * n + j],
                    None if masses is None else masses[i * n + j],
                )
                for j in range(n)
            )
            for i in range(len(prompts))
        ]
        if self._cfg.moe is None:
            return completions
        return _with_routes(completions, prompts, n, *(np.asarray(r) for r in routes))

    @property
    def cuts(self) -> bool:
        """Whether tokens are drawn from a truncated distribution (top-k / top-p)."""
        return (bool(self.top_k) or self.top_p < 1.0) and self.method != "greedy"

    @property
    def truncates(self) -> bool:
        """Whether the recorded logprobs are under a truncated distribution (kept sets travel)."""
        return self.cuts and self.recorded_logprobs == "truncated"

    def _cache_for(self, rows: int, prompt_len: int) -> KVCache:
        """The kept cache if it has this shape, else a new one (the old one is let go first)."""
        from rlax.core.models.transformer import init_cache

        slots = prompt_len + self.max_new_tokens
        cache, self._cache = self._cache, None
        if cache is not None and cache[0]["v"].shape[0] == rows and cache[0]["v"].shape[2] == slots:
            return cache
        del cache
        return self._kept(init_cache(self._cfg, rows, slots))

    def _completion(
        self,
        toks: np.ndarray,
        logps: np.ndarray,
        floors: np.ndarray | None = None,
        masses: np.ndarray | None = None,
    ) -> Completion:
        stops = np.flatnonzero(np.isin(toks, self._stops))
        length = int(stops[0]) + 1 if len(stops) else len(toks)
        return Completion(
            tokens=toks[:length].copy(),
            logprobs=logps[:length].copy(),
            text=self.tokenizer.decode(toks[:length]),
            finish_reason="stop" if len(stops) else "length",
            policy_version=self.version,
            kept_floor=None if floors is None else floors[:length].copy(),
            # Recorded full while cutting: the drawn distribution's are logprob - log mass.
            sampled_logprobs=None if masses is None else logps[:length] - masses[:length],
        )


def _with_routes(
    completions: list[tuple[Completion, ...]],
    prompts: Sequence[Prompt],
    n: int,
    prompt_routes: np.ndarray,  # [B, P, R, k]
    routes: np.ndarray,  # [B, C, R, k]
) -> list[tuple[Completion, ...]]:
    """Each completion with its row's experts: its prompt's tokens' then its own (R3)."""
    out = []
    for i, (prompt, group) in enumerate(zip(prompts, completions, strict=True)):
        start = prompt_routes.shape[1] - len(prompt.tokens)
        out.append(
            tuple(
                dataclasses.replace(
                    c,
                    routes=np.concatenate(
                        [prompt_routes[i * n + j, start:], routes[i * n + j, : len(c.tokens)]]
                    ),
                )
                for j, c in enumerate(group)
            )
        )
    return out


@hookimpl
def rlax_register_samplers():
    return {"jax": JaxSampler}
