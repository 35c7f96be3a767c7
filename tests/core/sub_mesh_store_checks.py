"""Run twice by test_sub_mesh_store.py in processes with 8 fake CPU devices, on one store
directory: a program of a 4-device sub-mesh (devices 4-7, as one-process placement gives
the sampler or the trainer) is compiled and stored, then read back by the next process
and run there. Prints one JSON line: the result, and whether it was read or compiled."""

from __future__ import annotations

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from rlax.core.runtime import executables


def main(directory: str) -> None:
    store = executables.start(pathlib.Path(directory))
    mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[4:])
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, PartitionSpec("x")))
    double = executables.stored("double", jax.jit(lambda a: a * 2), "double")
    got = double(x)
    out = {
        "result": [float(v) for v in got],
        "devices": sorted(d.id for d in got.devices()),
        "loaded": store.loaded,
        "written": store.written,
    }
    executables.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
