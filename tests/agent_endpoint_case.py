"""A scripted sampler for endpoint tests (imported as ``agent_endpoint_case``): each call's
reply is the next text of a script (then ``default``), stop id after it, logprob -0.25 a
token; it records each call's prompt ids and seed, and may sleep before answering."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
from chatml_case import chatml_tokenizer

from rlax.core.types import Completion

TOK = chatml_tokenizer()
MODEL = "tiny"


class ScriptSampler:
    """See the module docstring. ``delays``: seconds to sleep per call, in order."""

    temperature, top_p, max_new_tokens = 1.0, 1.0, 128

    def __init__(self, script=(), *, default: str = "ok", version: int = 2):
        self.script, self.default, self.version = list(script), default, version
        self.delays: list[float] = []
        self.calls: list[tuple[np.ndarray, Completion, int]] = []
        self.lock = threading.Lock()

    def generate(self, prompts, n, *, seed):
        with self.lock:
            delay = self.delays.pop(0) if self.delays else 0.0
            text = self.script.pop(0) if self.script else self.default
        if delay:
            time.sleep(delay)
        ids = np.append(TOK.encode(text), TOK.eos_id).astype(np.int32)
        lp = np.full(len(ids), -0.25, np.float32)
        out = []
        for p in prompts:
            c = Completion(ids, lp, text, "stop", self.version)
            with self.lock:
                self.calls.append((np.asarray(p.tokens).copy(), c, seed))
            out.append((c,) * n)
        return out


def junk(rng: random.Random, depth: int = 0):
    """A random JSON value: every type, huge ints and strings, nested junk."""
    kind = rng.randrange(11 if depth < 3 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63, -(2**64), 10**30, rng.randrange(-9, 99)])
    if kind == 3:
        return rng.choice([0.0, -0.5, 1e308, 1.5, 1e-300])
    if kind == 4:
        return rng.choice(["", "x", "auto", "none", "text", MODEL, "\u0000\ud7ff"])
    if kind == 5:
        return "y" * rng.choice([1000, 100_000])
    if kind == 6:
        return {"type": rng.choice(["text", "function", "json_schema"])}
    if kind == 7:
        return [{"role": rng.choice(["user", "assistant", "tool", "x"]), "content": "c"}]
    if kind == 8:
        return [junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 9:
        return {str(junk(rng, depth + 1))[:20]: junk(rng, depth + 1) for _ in range(3)}
    return {"type": "function", "function": {"name": "f", "parameters": junk(rng, depth + 1)}}
