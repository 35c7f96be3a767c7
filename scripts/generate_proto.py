"""Regenerates core/param_server/rlax_pb2.py and rlax_pb2_grpc.py from rlax.proto.

Needs grpcio-tools (``pip install grpcio-tools``). protoc writes imports from
the proto's path, so the proto is staged as ``rlax/core/param_server/rlax.proto``
to make the generated modules import each other as
``rlax.core.param_server.rlax_pb2``.

    python scripts/generate_proto.py
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parents[1] / "core" / "param_server"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        staged = pathlib.Path(tmp) / "rlax" / "core" / "param_server"
        staged.mkdir(parents=True)
        shutil.copy(HERE / "rlax.proto", staged / "rlax.proto")
        status = protoc.main(
            ["protoc", f"-I{tmp}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
             "rlax/core/param_server/rlax.proto"]
        )  # fmt: skip
        if status:
            return status
        for name in ("rlax_pb2.py", "rlax_pb2_grpc.py"):
            shutil.copy(staged / name, HERE / name)
    print(f"wrote {HERE / 'rlax_pb2.py'} and {HERE / 'rlax_pb2_grpc.py'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
