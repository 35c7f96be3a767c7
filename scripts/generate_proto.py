"""Regenerates core/param_server/rlax_pb2.py, rlax_pb2_grpc.py and their type stubs from rlax.proto.

Needs grpcio-tools and mypy-protobuf (``pip install grpcio-tools mypy-protobuf``).
protoc writes imports from the proto's path, so the proto is staged as
``rlax/core/param_server/rlax.proto`` to make the generated modules import each
other as ``rlax.core.param_server.rlax_pb2``. The ``.pyi`` stubs (mypy-protobuf's
``protoc-gen-mypy`` and ``protoc-gen-mypy_grpc``) are checked in beside the
modules: the generated code builds its classes at import time, so without them
a type checker sees no message class at all (``Module has no attribute``). The
two ``.py`` modules are checked in after ``ruff check --fix`` and ``ruff format``;
the stubs are kept as written (ruff skips them).

    python scripts/generate_proto.py
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parents[1] / "core" / "param_server"
GENERATED = ("rlax_pb2.py", "rlax_pb2_grpc.py", "rlax_pb2.pyi", "rlax_pb2_grpc.pyi")


def plugin(name: str) -> str:
    """``--plugin=NAME=PATH`` for a protoc plugin installed beside this Python."""
    path = pathlib.Path(sys.executable).parent / name
    if not path.is_file():
        raise SystemExit(f"generate_proto: {path} not found; pip install mypy-protobuf")
    return f"--plugin={name}={path}"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        staged = pathlib.Path(tmp) / "rlax" / "core" / "param_server"
        staged.mkdir(parents=True)
        shutil.copy(HERE / "rlax.proto", staged / "rlax.proto")
        status = protoc.main(
            [
                "protoc",
                f"-I{tmp}",
                f"--python_out={tmp}",
                f"--grpc_python_out={tmp}",
                plugin("protoc-gen-mypy"),
                f"--mypy_out={tmp}",
                plugin("protoc-gen-mypy_grpc"),
                f"--mypy_grpc_out={tmp}",
                "rlax/core/param_server/rlax.proto",
            ]
        )
        if status:
            return status
        for name in GENERATED:
            shutil.copy(staged / name, HERE / name)
    print(f"wrote {', '.join(str(HERE / name) for name in GENERATED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
