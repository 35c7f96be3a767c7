"""Whole compiled programs kept across restarts (:mod:`rlax.core.runtime.executables`).

A restarted process reading them back is ``test_compile_cache.py``'s (the train step
loaded, nothing traced, the same losses). Here: a program is read back only under the
key of everything it is a function of -- a change to any part compiles anew -- and an
entry that cannot be read back is compiled again, never trusted.
"""

from __future__ import annotations

import os
import threading

import gin
import jax
import numpy as np
import optax
import pytest
from flax import nnx
from toy_groups import toy_batch

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.runtime import compile_cache, executables
from rlax.core.runtime.compile_cache import CompileCacheSettings
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.plugins.algorithms.grpo import grpo

CFG = TransformerConfig(
    vocab_size=9, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)
TRACE = "/jax/core/compile/jaxpr_trace_duration"


@pytest.fixture
def store(tmp_path):
    """The store as a role has it: beside a persistent compilation cache of its own."""
    with compile_cache.session():
        compile_cache.start(CompileCacheSettings(path=str(tmp_path / "cache")), None)
        store = executables.active()
        assert store is not None and store.directory == tmp_path / "cache" / "executables"
        yield store
    assert executables.active() is None  # off with the cache


@pytest.fixture
def traced():
    """The functions traced from now on (JAX's own event)."""
    events: list[str] = []
    listener = lambda event, _, **__: events.append(event) if event == TRACE else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    yield events
    jax.monitoring.unregister_event_duration_listener(listener)


def trainer(algorithm=None, optimizer=None) -> Trainer:
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    return Trainer(model, algorithm or grpo(), optimizer or optax.sgd(0.1))


def step(t: Trainer, batch=None):
    metrics = t.step(batch or toy_batch(seed=1))
    return metrics, jax.tree.leaves(jax.device_get(t.state.params))


def test_a_new_trainer_calls_the_stored_step_without_tracing_it(store, traced):
    first, first_params = step(trainer())
    assert store.written == 1 and store.loaded == 0 and traced  # compiled once, stored
    entries = sorted(store.directory.iterdir())
    assert [p.name.split("-")[0] for p in entries] == ["train_step"]

    fresh = trainer()  # a new jax.jit function: it would trace the step again
    traced.clear()
    again, again_params = step(fresh)
    assert store.loaded == 1 and store.written == 1 and traced == []
    assert again == first  # the same program: the same numbers, bit for bit
    for a, b in zip(first_params, again_params, strict=True):
        np.testing.assert_array_equal(a, b)


def test_without_the_store_the_function_is_the_jitted_one():
    jitted = jax.jit(lambda x: x + 1)
    assert executables.active() is None and executables.stored("f", jitted, "") is jitted


def test_a_changed_closure_or_batch_shape_is_another_program(store, traced):
    """What the step closes over (the algorithm's settings) and the batch's shapes are in
    the key: a trainer that differs in either compiles its own program and gets the
    numbers a trainer without the store gets."""
    step(trainer())
    rows = batch_arrays(toy_batch(seed=1))  # 6 rows
    variants = {
        "kl_beta": (lambda: trainer(grpo(kl_beta=0.5)), None),
        "batch": (trainer, {k: np.concatenate([v, v]) for k, v in rows.items()}),  # 12 rows
    }
    for name, (make, batch) in variants.items():
        made = make()
        traced.clear()
        with_store, _ = step(made, batch)
        assert store.loaded == 0 and traced, name  # never the first trainer's program
        executables.stop()
        without, _ = step(make(), batch)
        executables._store = store  # back on for the next variant
        assert with_store == without, name
    assert store.written == 3


def test_every_part_of_the_key_changes_it(store, tmp_path, monkeypatch):
    gin.clear_config()  # another test's configuration, left locked, out of the way
    t = trainer()
    placed = t.device_batch(toy_batch(seed=1))
    s = t.state
    args = (s.params, s.critic, s.opt_state, t.ref_params, placed)
    base = store.key("train_step", t.closure(), args)
    assert store.key("train_step", t.closure(), args) == base  # a function of its parts

    keys = {
        "name": store.key("fixed_anchors", t.closure(), args),
        "closure": store.key("train_step", trainer(grpo(kl_beta=0.5)).closure(), args),
        # Another optimiser's state (adam's moments): its arguments differ. (The constants
        # inside an optax transformation, e.g. its learning rate, are not visible to the
        # key: a role's come from the gin configuration, which is.)
        "optimizer": store.key(
            "train_step", t.closure(), (*args[:2], optax.adam(0.1).init(s.params), *args[3:])
        ),
        "dtype": store.key(
            "train_step",
            t.closure(),
            jax.tree.map(lambda x: x.astype("bfloat16") if x.dtype == "float32" else x, args),
        ),
    }
    # The process's parts: a new store (the fingerprint is taken once per process) after
    # each change.
    fresh = lambda: executables.Store(tmp_path / "other").key("train_step", t.closure(), args)
    assert fresh() == base
    gin.parse_config("LEARNING_RATE = 0.5")  # the run's configuration
    try:
        keys["gin"] = fresh()
    finally:
        gin.clear_config()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    keys["xla_flags"] = fresh()
    monkeypatch.delenv("XLA_FLAGS")
    code = tmp_path / "plugin.py"
    code.write_text("x = 1\n")
    monkeypatch.setattr(executables, "_code_roots", lambda: (set(), {str(code)}))
    stamped = fresh()
    os.utime(code, ns=(0, 1))  # the code changed (its modification time)
    keys["code"] = fresh()
    assert stamped != base
    assert len({base, stamped, *keys.values()}) == len(keys) + 2, (base, stamped, keys)


def test_an_entry_that_cannot_be_read_back_is_dropped_and_compiled_again(store, traced, caplog):
    first, _ = step(trainer())
    (entry,) = store.directory.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])  # truncated
    fresh = trainer()
    traced.clear()
    again, _ = step(fresh)
    assert store.loaded == 0 and traced and again == first
    assert "could not be read back" in caplog.text and not entry.exists()


def test_a_program_read_back_from_the_persistent_cache_is_never_stored(store, traced):
    """On XLA:CPU such an executable serializes without its kernels: stored, it would be
    read back and fail when called. So it is not stored, and every later trainer compiles
    (from the cache) and gets the right numbers."""
    first, _ = step(trainer())
    (entry,) = store.directory.iterdir()
    entry.unlink()
    for _ in range(2):
        again, _ = step(trainer())  # the step from JAX's cache: a hit, not stored
        assert again == first and store.written == 1 and store.loaded == 0
        assert list(store.directory.iterdir()) == []


def test_describe_drops_object_addresses():
    def f():
        pass

    assert "0x" not in executables.describe((f, object)) and "f" in executables.describe(f)


def _prefetch_threads_done() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("rlax-prefetch"):
            thread.join()


def _two_variants(store) -> dict[str, tuple]:
    """Two batch variants (6 and 12 rows) stored by two trainers: {file name: (batch,
    the metrics of a fresh trainer's step on it)}."""
    rows = batch_arrays(toy_batch(seed=1))  # 6 rows
    variants = {}
    for batch in (rows, {k: np.concatenate([v, v]) for k, v in rows.items()}):
        before = {p.name for p in store.directory.glob("*.exe")}
        metrics, _ = step(trainer(), batch)
        (name,) = {p.name for p in store.directory.glob("*.exe")} - before
        variants[name] = (batch, metrics)
    return variants


def test_prefetch_reads_every_stored_variant_once_in_the_background(store, traced):
    """A restarted trainer prefetches its stored programs when it is built: each batch
    variant met later is called without tracing and without reading it again, with the
    numbers the process that compiled it got."""
    variants = _two_variants(store)
    assert store.written == 2 and store.loaded == 0
    fresh = trainer()
    assert fresh.prefetch_programs() == 2
    _prefetch_threads_done()
    assert store.loaded == 2
    fresh = [trainer() for _ in variants]  # each a new jax.jit function
    traced.clear()
    for t, (batch, metrics) in zip(fresh, variants.values(), strict=True):
        assert step(t, batch)[0] == metrics
    assert traced == [] and store.loaded == 2  # read once each, in the background


def test_a_variant_needed_before_the_prefetch_reaches_it_is_read_by_the_caller(
    store, traced, monkeypatch
):
    """The background reader holds its first program; the caller needs the second, reads
    it itself, and the reader skips it: each variant is read exactly once."""
    variants = _two_variants(store)
    reading, release = threading.Event(), threading.Event()
    load = store._load

    def held(path):
        if threading.current_thread().name.startswith("rlax-prefetch"):
            reading.set()
            release.wait()
        return load(path)

    monkeypatch.setattr(store, "_load", held)
    assert trainer().prefetch_programs() == 2
    assert reading.wait(60)
    first, second = sorted(variants)  # the reader goes in file-name order
    fresh = [trainer(), trainer()]
    traced.clear()
    batch, metrics = variants[second]
    assert step(fresh[0], batch)[0] == metrics and store.loaded == 1
    release.set()
    _prefetch_threads_done()
    batch, metrics = variants[first]
    assert step(fresh[1], batch)[0] == metrics
    assert traced == [] and store.loaded == 2


def test_stopping_the_store_ends_its_background_reads(store, monkeypatch):
    """The store stops while its reader holds the first variant: ``stop`` returns only once
    that read has ended, the variant not reached is never read, and no reader is left (one
    inside XLA at a role's exit, or beside the next in-process test, is neither's)."""
    _two_variants(store)
    reading, release = threading.Event(), threading.Event()
    load = store._load

    def held(path):
        reading.set()
        assert release.wait(60)
        return load(path)

    monkeypatch.setattr(store, "_load", held)
    assert trainer().prefetch_programs() == 2
    assert reading.wait(60)
    stopping = threading.Thread(target=executables.stop)
    stopping.start()
    stopping.join(0.5)
    assert stopping.is_alive()  # waits for the read under way
    release.set()
    stopping.join(60)
    assert not stopping.is_alive() and executables.active() is None
    assert store.loaded == 1  # the second variant was dropped, not read
    assert not [t for t in threading.enumerate() if t.name.startswith("rlax-prefetch")]
