"""The slot engine in a real worker against a real parameter server: a row cut off by a
preemption notice is finished by another worker with exactly the uninterrupted tokens."""

from __future__ import annotations

from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer
from rlax.core.runtime.preemption import Preemption
from rlax.core.wire import WirePlan
from rlax.core.worker.role import Worker
from rlax.plugins.samplers.engine import SlotEngine

TOK = CharTokenizer("0123456789+=")
CFG = TransformerConfig(
    vocab_size=TOK.vocab_size,
    num_layers=2,
    embed_dim=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
)
CHUNK = 4


class LengthReward:
    def score(self, prompt, text):
        return float(len(text))


def engine(model, on_call=None):
    e = SlotEngine(
        slots=4,
        chunk=CHUNK,
        max_new_tokens=24,
        top_k=1,
        stop_at_eos=False,
        max_prompt_tokens=8,
        tiers=((2, 16), (2, 0)),
    )
    e.setup(model, TOK)
    if on_call is not None:
        decode = e._decode_once

        def counted(*args):
            decode(*args)
            on_call()

        e._decode_once = counted
    return e


def run_worker(client, sampler, name, plan, **kwargs):
    w = Worker(
        client,
        sampler,
        LengthReward(),
        [],
        group_size=3,
        prompts_per_lease=2,
        reload_staleness=0,
        worker_id=name,
        seed=7,
        deterministic=True,
        **kwargs,
    )
    return w.run_once(plan)


def take(client):
    _, groups, dropped = client.take(2, current_version=0, max_staleness=0, wait_s=0)
    assert dropped == 0
    return {g.prompt.id: [c.tokens.tolist() for c in g.completions] for g in groups}


def test_a_preempted_workers_rows_are_finished_elsewhere_with_the_same_tokens(make_ps):
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    plan = WirePlan.for_tree(state)
    reference, running = make_ps(), make_ps()
    for ps in (reference, running):
        ps.client.push(plan, state, 0)
    whole = engine(model)
    assert run_worker(reference.client, whole, "ref", plan) == 2
    expected = take(reference.client)

    stop = Preemption([], role="worker")
    calls = []
    first = engine(model, on_call=lambda: calls.append(1) or len(calls) == 2 and stop.notify("t"))
    assert run_worker(running.client, first, "w1", plan, interrupt=lambda: stop.requested) == 0
    q = running.client.stat().queue
    assert q.partial_submitted == 2 and q.partial_tokens == first.decoded_tokens > 0

    second = engine(model)
    assert run_worker(running.client, second, "w2", plan) == 2
    assert take(running.client) == expected
    # No token drawn twice: the second worker drew exactly what the first left.
    assert first.decoded_tokens + second.decoded_tokens == whole.decoded_tokens
