"""Reading gin files: ``include`` resolved beside the including file, in the working
directory, then among rlax's packaged configs; files read as UTF-8, refused naming the
byte that is not."""

from __future__ import annotations

import contextlib
import os
import pathlib
import tokenize
from collections.abc import Iterator
from typing import IO

from rlax.core import gin_state
from rlax.core.config.finder import find_packaged
from rlax.core.errors import ConfigError

__all__ = ["include_resolution"]


_INCLUDING_DIRS: list[str] = []  # directory of each gin file being parsed, innermost last


def _resolve(path: str) -> str | None:
    """An ``include``: the including file's folder, the working directory, the packaged configs."""
    if os.path.isabs(path):
        return path if os.path.isfile(path) else None
    if _INCLUDING_DIRS:
        candidate = os.path.join(_INCLUDING_DIRS[-1], path)
        if os.path.isfile(candidate):
            return candidate
    if os.path.isfile(path):
        return path
    return find_packaged(path)


def _check_utf8(path: str) -> None:
    """ConfigError naming the file, line and column of the first byte that is not UTF-8."""
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError:
        return  # open() below says what is wrong
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}); "
            "gin files are read as UTF-8: save it as UTF-8"
        ) from None


@contextlib.contextmanager
def _open_gin_file(path: str) -> Iterator[IO[str]]:
    resolved = _resolve(path) or path
    _check_utf8(resolved)
    with open(resolved, encoding="utf-8") as f:
        _INCLUDING_DIRS.append(os.path.dirname(resolved))
        try:
            yield f
        except tokenize.TokenError as exc:  # e.g. an unclosed bracket: gin gives no file
            raise SyntaxError(exc.args[0], (resolved, exc.args[1][0], 0, "")) from exc
        finally:
            _INCLUDING_DIRS.pop()


@contextlib.contextmanager
def include_resolution() -> Iterator[None]:
    """Puts rlax's gin file reader first while parsing (gin has no public API for order)."""
    with gin_state.first_file_reader((_open_gin_file, lambda path: _resolve(path) is not None)):
        yield
