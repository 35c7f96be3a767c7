"""Test helpers: a sampler that answers from a script, and a spy that records each turn."""

from __future__ import annotations

import numpy as np

from rlax.core.types import Completion


class ScriptedSampler:
    """Each call answers every prompt with the next text of ``script`` (the stop id after it).

    Logprobs are -0.25 per token, so a test can tell them from the observations' 0.
    """

    temperature = 1.0

    def __init__(self, script, *, max_new_tokens=8, version=3):
        self.script = list(script)
        self.max_new_tokens = max_new_tokens
        self.version = version
        self.calls = []

    def setup(self, model, tokenizer):
        self.tokenizer = tokenizer

    def load_weights(self, params, version):
        self.version = version

    def generate(self, prompts, n, *, seed):
        self.calls.append([p.tokens.copy() for p in prompts])
        text = self.script[len(self.calls) - 1]
        ids = np.append(self.tokenizer.encode(text), self.tokenizer.eos_id).astype(np.int32)
        ids = ids[: self.max_new_tokens]
        stopped = ids[-1] == self.tokenizer.eos_id
        c = Completion(
            ids,
            np.full(len(ids), -0.25, np.float32),
            text,
            "stop" if stopped else "length",
            self.version,
        )
        return [tuple(c for _ in range(n)) for _ in prompts]


class Spy:
    """Wraps a sampler; records the prompt ids of every turn and what came back."""

    def __init__(self, inner):
        self.inner = inner
        self.turns = []  # (prompt ids, Completion) per row and turn

    temperature = property(lambda self: self.inner.temperature)
    max_new_tokens = property(lambda self: self.inner.max_new_tokens)

    def setup(self, model, tokenizer):
        self.inner.setup(model, tokenizer)

    def load_weights(self, params, version):
        self.inner.load_weights(params, version)

    def generate(self, prompts, n, *, seed):
        out = self.inner.generate(prompts, n, seed=seed)
        for p, cs in zip(prompts, out):
            self.turns += [(p.tokens.copy(), c) for c in cs]
        return out
