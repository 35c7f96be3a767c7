"""Run by test_handoff.py in a process with 8 fake CPU devices: the trainer's weights on
devices 0-3 (an fsdp mesh), a worker's sampler on devices 4-7 (or, colocated, on 0-3),
a real parameter server between them. Prints one JSON line of what the test asserts."""

from __future__ import annotations

import json

import jax
import numpy as np
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer
from rlax.core.parallel.mesh import make_mesh, tree_shardings
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.server import ParamServer
from rlax.core.param_server.settings import ServerSettings
from rlax.core.trainer.handoff import DeviceHandoff, OfferingSource, sampler_placement
from rlax.core.wire import WirePlan
from rlax.core.worker.role import Worker
from rlax.plugins.samplers.jax_sampler import JaxSampler

TOK = CharTokenizer("0123456789+=")
CFG = TransformerConfig(
    vocab_size=TOK.vocab_size,
    num_layers=2,
    embed_dim=32,
    num_heads=4,
    num_kv_heads=4,
    head_dim=8,
    mlp_dim=64,
)
TOKEN = "handoff-checks"


class CountingClient(ParamServerClient):
    """A client that counts the weight pulls (the host-bytes path)."""

    pulls = 0

    def pull(self, have_version: int = -1):
        self.pulls += 1
        return super().pull(have_version)


def trainer_params(model: Transformer, devices: list, scale: float) -> nnx.State:
    """The model's weights times ``scale`` on an fsdp mesh of ``devices`` (a new version)."""
    state = jax.tree.map(lambda x: x * scale, nnx.state(model))
    return jax.device_put(state, tree_shardings(state, make_mesh(None, devices)))


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(leaves(a), leaves(b), strict=True))


def case(model, settings, wire: str, sampler_devices: list) -> dict:
    """Versions 0..2 through a handoff and a server: 0 and 2 offered, 1 only pushed."""
    devices = jax.devices()
    plan = WirePlan.for_tree(nnx.state(model), wire)
    client = CountingClient(settings, retry_s=0.0, reuse_pull_buffer=False)
    sampler = JaxSampler(max_new_tokens=4)
    sampler.devices = sampler_devices
    sampler.setup(model, TOK)
    handoff = DeviceHandoff(sampler_placement(None, sampler_devices), wire)
    w = Worker(
        client,
        sampler,
        None,
        [],
        group_size=2,
        prompts_per_lease=1,
        reload_staleness=0,
        worker_id="w",
        seed=0,
        handoff=handoff,
    )
    out: dict = {}
    params = trainer_params(model, devices[:4], 1.0)
    client.push(plan, params, 0)
    handoff.offer(params, 0)
    w.maybe_reload(plan)
    handed = sampler._state
    out["v0_version"], out["v0_pulls"] = w.version, client.pulls
    out["v0_devices"] = sorted({d.id for x in jax.tree.leaves(handed) for d in x.devices()})
    out["v0_sharding_is_samplers"] = all(
        x.sharding == s
        for x, s in zip(
            jax.tree.leaves(handed),
            jax.tree.leaves(tree_shardings(handed, sampler._on_mesh.mesh)),
            strict=True,
        )
    )
    out["v0_loaded_as_handed"] = all(
        a is b for a, b in zip(jax.tree.leaves(handed), jax.tree.leaves(handoff.take(0)))
    )
    pulled = client.pull(-1)
    client.pulls -= 1  # that pull was the test's own
    reference = plan.unpack(pulled[2]) if pulled else None
    out["v0_equals_pulled"] = equal(handed, reference)
    out["v0_differs_from_trainer"] = not equal(handed, params)  # the wire's rounding, if any
    for x in jax.tree.leaves(params):
        x.delete()  # what the trainer's next step does to them (donation)
    out["alive_after_donation"] = bool(np.isfinite(leaves(handed)[0]).all())
    # Version 1 is pushed but not offered: the worker pulls bytes, as any worker does.
    params = trainer_params(model, devices[:4], 0.5)
    client.push(plan, params, 1)
    w.maybe_reload(plan)
    out["v1_version"], out["v1_pulls"] = w.version, client.pulls
    # Version 2 is published through an offering source (offer, then push): handed over.
    params = trainer_params(model, devices[:4], 0.25)
    source = OfferingSource(_Pusher(client, plan), handoff)
    metrics = source.publish(params, 2)
    w.maybe_reload(plan)
    out["v2_version"], out["v2_pulls"] = w.version, client.pulls
    out["v2_metrics"] = sorted(metrics)
    reference = plan.unpack(client.pull(-1)[2])
    out["v2_equals_pulled"] = equal(sampler._state, reference)
    out["taken"], out["refused"] = handoff.taken, handoff.refused
    client.close()
    return out


class _Pusher:
    """The publishing half of the trainer's remote source."""

    def __init__(self, client, plan):
        self.client, self.plan = client, plan

    def publish(self, params, version: int) -> dict[str, float]:
        self.client.push(self.plan, params, version)
        return {"weight_sync_s": 0.0}


def main() -> None:
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    results = {}
    for name, wire, where in (
        ("one_process", "float32", jax.devices()[4:]),
        ("one_process_bf16", "bfloat16", jax.devices()[4:]),
        ("colocated", "float32", jax.devices()[:4]),
    ):
        server = ParamServer(
            ServerSettings(address="127.0.0.1:0", token=TOKEN, max_message_mb=8, chunk_mb=1),
            iter(()),
            capacity=8,
        )
        port = server.start()
        settings = ServerSettings(address=f"127.0.0.1:{port}", token=TOKEN, max_message_mb=8)
        try:
            results[name] = case(model, settings, wire, list(where))
        finally:
            server.stop(grace=None)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
