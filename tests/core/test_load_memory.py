"""One copy of the weights: loading consumes the host dict, the LoRA base loads lazily, a
worker reads no weights from its checkpoint and its pulled weights share the pull buffer."""

import pathlib

import grpc
import jax
import numpy as np
import pytest
from flax import nnx

from rlax.core.models.bundle import load_model
from rlax.core.models.config import TransformerConfig
from rlax.core.models.hf import model_from_params
from rlax.core.models.lora_wire import AdapterApplier
from rlax.core.models.transformer import Transformer
from rlax.core.param_server.client import ParamServerClient
from rlax.core.wire import WirePlan, pull_buffer
from rlax.core.worker.role import Worker
from rlax.plugins.samplers.jax_sampler import JaxSampler

QUICKSTART_BASE = pathlib.Path(__file__).resolve().parents[2] / "assets" / "quickstart-base"

CFG = TransformerConfig(
    vocab_size=32, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


def _host_params(seed: int) -> dict:
    state = nnx.to_pure_dict(nnx.state(Transformer(CFG, rngs=nnx.Rngs(seed))))
    return jax.tree.map(lambda x: np.asarray(x).copy(), state)


def test_model_from_params_consumes_the_host_dict_leaf_by_leaf():
    params = _host_params(3)
    expected = jax.tree.map(np.copy, params)
    model = model_from_params(CFG, params)
    # Before: numpy leaves. After: every leaf of the same dict is a JAX array (the host ones
    # have no holder left), and the model holds exactly the values given.
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))
    got = nnx.to_pure_dict(nnx.state(model))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_adapter_base_given_as_a_loader_loads_once_and_only_when_asked():
    calls = []
    base = nnx.state(Transformer(CFG, rngs=nnx.Rngs(0)))

    def load():
        calls.append(1)
        return base

    applier = AdapterApplier(load)
    assert calls == []  # a worker pulling whole weights never loads a second copy
    assert applier.base is base and applier.base is base
    assert calls == [1]
    assert AdapterApplier(base).base is base  # a state given directly is kept as it is


def _address(x: jax.Array) -> int:
    return x.unsafe_buffer_pointer()


def test_pull_buffers_start_on_a_page_boundary():
    for n in (1, 4095, 4096, 1 << 20):
        buf = pull_buffer(n)
        assert len(buf) == n and buf.readonly is False
        assert np.frombuffer(buf, np.uint8).ctypes.data % 4096 == 0
    assert len(pull_buffer(0)) == 0


def test_alias_shares_64_byte_aligned_tensors_and_copies_the_rest():
    # Offsets: a at 0, b at 3*64*4 = 768 (aligned), c at 768 + 5*4 = 788 (not a multiple of 64).
    tree = {
        "a": np.arange(3 * 64, dtype=np.float32).reshape(3, 64),
        "b": np.arange(5, dtype=np.float32),
        "c": np.full((4, 16), 2.0, np.float32),
    }
    plan = WirePlan.for_tree(tree)
    assert [t.offset for t in plan.tensors] == [0, 768, 788]
    buf = pull_buffer(plan.nbytes)
    buf[:] = plan.pack(tree).tobytes()
    out = plan.alias(buf)
    start = np.frombuffer(buf, np.uint8).ctypes.data
    assert (_address(out["a"]), _address(out["b"])) == (start, start + 768)  # shared
    assert _address(out["c"]) != start + 788  # copied: XLA would not take it as it is
    for name, value in tree.items():
        np.testing.assert_array_equal(np.asarray(out[name]), value)
    # Shared means shared: the next write into the buffer shows in a and b, not in c.
    np.frombuffer(buf, np.float32)[:] = -1.0
    assert float(out["a"][0, 0]) == -1.0 and float(out["b"][4]) == -1.0
    np.testing.assert_array_equal(np.asarray(out["c"]), tree["c"])


def test_alias_of_a_bfloat16_wire_casts_back_to_float32():
    tree = {"w": np.linspace(-2, 2, 64 * 4, dtype=np.float32).reshape(4, 64)}
    plan = WirePlan.for_tree(tree, "bfloat16")
    out = plan.alias(memoryview(plan.pack(tree)))
    assert out["w"].dtype == np.float32
    np.testing.assert_array_equal(
        np.asarray(out["w"]), np.asarray(plan.unpack(plan.pack(tree))["w"])
    )
    with pytest.raises(ValueError, match="plan expects 512"):
        plan.alias(bytearray(10))


def test_a_client_reuses_its_pull_buffer_unless_told_not_to(ps):
    tree = {"w": np.ones((64, 64), np.float32)}
    plan = WirePlan.for_tree(tree)
    ps.client.push(plan, tree, 0)
    fresh = ParamServerClient(ps.settings, retry_s=0.0, reuse_pull_buffer=False)
    try:
        for client, same in ((ps.client, True), (fresh, False)):
            first, second = client.pull(-1)[2], client.pull(-1)[2]
            address = [np.frombuffer(b, np.uint8).ctypes.data for b in (first, second)]
            assert (address[0] == address[1]) is same
    finally:
        fresh.close()


def test_an_architecture_only_load_has_shapes_and_the_tokenizer_but_no_arrays():
    full, bare = load_model(QUICKSTART_BASE), load_model(QUICKSTART_BASE, weights=False)
    assert bare.config == full.config and bare.info == full.info
    assert bare.tokenizer.encode("12+34=").tolist() == full.tokenizer.encode("12+34=").tolist()
    leaves = jax.tree.leaves(nnx.state(bare.model))
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert [(x.shape, x.dtype) for x in leaves] == [
        (x.shape, x.dtype) for x in jax.tree.leaves(nnx.state(full.model))
    ]


def test_a_sampler_set_up_without_weights_refuses_to_generate_until_it_gets_them():
    full, bare = load_model(QUICKSTART_BASE), load_model(QUICKSTART_BASE, weights=False)
    prompt = next(iter(_prompts(full.tokenizer)))
    sampler = JaxSampler(max_new_tokens=4)
    sampler.setup(bare.model, bare.tokenizer)
    with pytest.raises(RuntimeError, match="no weights yet"):
        sampler.generate([prompt], 2, seed=0)
    reference = JaxSampler(max_new_tokens=4)
    reference.setup(full.model, full.tokenizer)
    sampler.load_weights(nnx.state(full.model), 5)
    got, want = sampler.generate([prompt], 2, seed=0)[0], reference.generate([prompt], 2, seed=0)[0]
    assert [c.tokens.tolist() for c in got] == [c.tokens.tolist() for c in want]
    assert {c.policy_version for c in got} == {5}


def _prompts(tokenizer):
    from rlax.core.types import Prompt

    yield Prompt("p0", "12+34=", tokenizer.encode("12+34=", bos=True), "46")


class _FailingPull:
    """A client whose server is at version 3 and whose pulls fail mid-way (or find nothing)."""

    def __init__(self, outcome, reuse_pull_buffer=True):
        self.outcome, self.reuse_pull_buffer = outcome, reuse_pull_buffer

    def stat(self):
        return type("Stat", (), {"version": 3})()

    def pull(self, have_version):
        if self.outcome is None:
            return
        raise self.outcome


class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


def test_a_worker_whose_pull_into_its_weights_fails_holds_no_version():
    """A reused pull buffer is the worker's weights: once a pull into it has begun they are
    gone, so a failed pull leaves version -1 (the next round pulls before generating)."""
    worker = Worker(
        _FailingPull(_Unavailable()),
        None,
        None,
        [],
        group_size=2,
        prompts_per_lease=1,
        reload_staleness=0,
        worker_id="w",
        seed=0,
    )
    worker.version = 1
    with pytest.raises(grpc.RpcError):
        worker.maybe_reload(plan=None)
    assert worker.version == -1
    # A pull that receives nothing (the server had nothing newer after all) changes nothing.
    worker = Worker(
        _FailingPull(None),
        None,
        None,
        [],
        group_size=2,
        prompts_per_lease=1,
        reload_staleness=0,
        worker_id="w",
        seed=0,
    )
    worker.version = 1
    worker.maybe_reload(plan=None)
    assert worker.version == 1
    # With a buffer of its own for each pull (in-flight reloads), a failed pull leaves the
    # weights in use, and their version, as they were.
    worker = Worker(
        _FailingPull(_Unavailable(), reuse_pull_buffer=False),
        None,
        None,
        [],
        group_size=2,
        prompts_per_lease=1,
        reload_staleness=0,
        worker_id="w",
        seed=0,
    )
    worker.version = 1
    with pytest.raises(grpc.RpcError):
        worker.maybe_reload(plan=None)
    assert worker.version == 1
    # In-flight reloads with a client that reuses its buffer are refused at once.
    with pytest.raises(ValueError, match="in-flight reloads need a client made with"):
        Worker(
            _FailingPull(None),
            None,
            None,
            [],
            group_size=2,
            prompts_per_lease=1,
            reload_staleness=0,
            worker_id="w",
            seed=0,
            reload_in_flight=True,
        )
