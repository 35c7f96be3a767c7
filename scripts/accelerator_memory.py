"""Each role's memory for the Qwen2.5 models of 0.5 to 32 B parameters, per device size.

Writes the tables of docs/accelerators.md (between its ``memory-table`` markers) from the
models' architectures, so the page is computed, not typed::

    python scripts/accelerator_memory.py            # print the tables
    python scripts/accelerator_memory.py --write    # put them into docs/accelerators.md

The architectures are the models' Hugging Face ``config.json`` values (Qwen/Qwen2.5-*),
as :class:`rlax.core.models.config.TransformerConfig`; parameters are counted by its
``num_params`` (tests/test_accelerator_memory.py checks the counts against Qwen's).

What each role holds (:func:`role_bytes`; the assumptions are the constants below):

- trainer: fp32 parameters, fp32 gradients and Adam's two moments (16 bytes a parameter),
  split over its devices (fsdp), plus one device's activations: with ``remat='block'`` each
  layer's bf16 input for its microbatch of tokens, and one block's internals recomputed.
- sampler: bf16 weights split over its devices (tensor parallel), and the KV cache of its
  slots (bf16 keys and values of every layer), split by key/value heads only where the
  devices divide them (``plugins/samplers/sampler_mesh.py``), else whole on every device.
- parameter server: host memory, not a device: the newest version and the one being
  assembled, in the wire dtype (bf16).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

from rlax.core.models.config import TransformerConfig

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "accelerators.md"
BEGIN, END = "<!-- memory-table: begin -->", "<!-- memory-table: end -->"

GB = 10**9
TRAIN_BYTES_PER_PARAM = 4 + 4 + 8  # fp32 parameters, gradients, Adam's mu and nu
SAMPLE_BYTES_PER_PARAM = 2  # bf16 weights
KV_BYTES = 2  # bf16 keys and values
ACT_BYTES = 2  # bf16 activations
WIRE_BYTES = 2  # bf16 on the wire
TOKENS_PER_DEVICE = 8192  # the trainer's microbatch on one device, in tokens
SLOTS, CONTEXT = 32, 4096  # the sampler's rows and each row's tokens (prompt + completion)
USABLE = 0.9  # of a device's memory, what a role may fill (the rest: XLA's own buffers)
DEVICE_GB = (16, 32, 80, 141)  # TPU v5e, TPU v6e, H100 80GB, H200
MAX_DEVICES = 256


def qwen2_5(layers: int, d: int, heads: int, kv: int, f: int, vocab: int, tied: bool):
    """A Qwen2.5 architecture (head dim ``d / heads``, q/k/v bias)."""
    return TransformerConfig(
        vocab_size=vocab,
        num_layers=layers,
        embed_dim=d,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=d // heads,
        mlp_dim=f,
        rope_theta=1_000_000.0,
        tie_embeddings=tied,
        qkv_bias=True,
    )


# name -> (architecture, the parameter count Qwen publishes on the model card)
MODELS: dict[str, tuple[TransformerConfig, float]] = {
    "Qwen2.5-0.5B": (TransformerConfig.qwen2_5_0_5b(), 0.49e9),
    "Qwen2.5-1.5B": (qwen2_5(28, 1536, 12, 2, 8960, 151936, True), 1.54e9),
    "Qwen2.5-3B": (qwen2_5(36, 2048, 16, 2, 11008, 151936, True), 3.09e9),
    "Qwen2.5-7B": (qwen2_5(28, 3584, 28, 4, 18944, 152064, False), 7.61e9),
    "Qwen2.5-14B": (qwen2_5(48, 5120, 40, 8, 13824, 152064, False), 14.7e9),
    "Qwen2.5-32B": (qwen2_5(64, 5120, 40, 8, 27648, 152064, False), 32.5e9),
}


@dataclasses.dataclass(frozen=True)
class RoleBytes:
    """Bytes a role holds: split over its devices, and on every device whole."""

    split: int
    whole: int = 0

    def per_device(self, devices: int) -> float:
        return self.split / devices + self.whole


def trainer_bytes(cfg: TransformerConfig) -> RoleBytes:
    """Optimizer state split over fsdp devices; one microbatch's activations per device."""
    saved = cfg.num_layers * TOKENS_PER_DEVICE * cfg.embed_dim * ACT_BYTES
    block = TOKENS_PER_DEVICE * (4 * cfg.embed_dim + 3 * cfg.mlp_dim) * ACT_BYTES
    return RoleBytes(TRAIN_BYTES_PER_PARAM * cfg.num_params(), saved + block)


def kv_cache_bytes(cfg: TransformerConfig) -> int:
    """The sampler's whole KV cache: keys and values of every layer, slot and position."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * SLOTS * CONTEXT * KV_BYTES


def sampler_per_device(cfg: TransformerConfig, devices: int) -> float:
    """Weights split over ``devices``; the cache split by heads only where they divide."""
    cache = kv_cache_bytes(cfg)
    cache_split = cfg.num_kv_heads % devices == 0
    weights = SAMPLE_BYTES_PER_PARAM * cfg.num_params() / devices
    return weights + (cache / devices if cache_split else cache)


def devices_needed(per_device, device_gb: float) -> int | None:
    """The fewest devices (a power of two) on which ``per_device(n)`` fits, or None."""
    n = 1
    while n <= MAX_DEVICES:
        if per_device(n) <= USABLE * device_gb * GB:
            return n
        n *= 2
    return None


def role_bytes(cfg: TransformerConfig) -> dict[str, float]:
    """Each role's total bytes (the trainer's and sampler's on one device, unsplit)."""
    return {
        "trainer": trainer_bytes(cfg).per_device(1),
        "sampler": sampler_per_device(cfg, 1),
        "param_server": 2 * WIRE_BYTES * cfg.num_params(),
    }


def _cell(n: int | None) -> str:
    return "—" if n is None else str(n)


def tables() -> str:
    """The markdown tables of docs/accelerators.md."""
    lines = [
        "| model | parameters | trainer | sampler (weights + KV cache) | parameter server (host) |",
        "|---|---|---|---|---|",
    ]
    for name, (cfg, _) in MODELS.items():
        b = role_bytes(cfg)
        lines.append(
            f"| {name} | {cfg.num_params() / 1e9:.2f} B | {b['trainer'] / GB:.0f} GB "
            f"| {b['sampler'] / GB:.1f} GB ({kv_cache_bytes(cfg) / GB:.1f} GB cache) "
            f"| {b['param_server'] / GB:.1f} GB |"
        )
    head = " | ".join(f"{gb} GB" for gb in DEVICE_GB)
    lines += ["", f"| devices: trainer / sampler | {head} |", "|---|" + "---|" * len(DEVICE_GB)]
    for name, (cfg, _) in MODELS.items():
        cells = []
        for gb in DEVICE_GB:
            t = devices_needed(trainer_bytes(cfg).per_device, gb)
            s = devices_needed(lambda n, c=cfg: sampler_per_device(c, n), gb)
            cells.append(f"{_cell(t)} / {_cell(s)}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def written(doc: str) -> str:
    """``doc`` with its tables between the markers replaced by :func:`tables`."""
    before, rest = doc.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    return f"{before}{BEGIN}\n{tables()}\n{END}{after}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"update {DOC.name}")
    if parser.parse_args().write:
        DOC.write_text(written(DOC.read_text()))
    else:
        print(tables())


if __name__ == "__main__":
    main()
