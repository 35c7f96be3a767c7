"""The typed wire format between the trusted side and the sandboxed program.

A value crosses the sandbox boundary as JSON in which every container other
than a list is a one-key tag::

    None, True, 3, 2.5, "s", [..]         as themselves
    {"tuple": [..]}  {"set": [..]}  {"frozenset": [..]}
    {"dict": [[key, value], ..]}  {"bytes": "hex"}  {"complex": [re, im]}
    {"int": "hex"}                        an int of more than 256 bits

:func:`encode` writes test arguments for the harness; :func:`parse_line`
reads what the program sent back, bounded, as plain JSON data in which an
object is a tuple of pairs; ``code/equality.py`` compares that data with
the expected value node by node, by exact type (``type(x) is``), without
rebuilding it. Nothing the program defined (a class with an ``__eq__`` that
always says yes, a patched ``json``) survives the crossing: the harness sends
a subclass of a built-in type as its data, and the trusted side sees only
JSON. The harness holds a copy of the encoder (it must run alone in the
sandbox).
"""

from __future__ import annotations

import gc
import json
import sys
from typing import Any

__all__ = ["WireError", "encode", "fields", "parse_line"]

MAX_DEPTH = 64
INT_BITS = 256  # a larger int travels as hex (the harness's rule too)
_ATOMS = (type(None), bool, int, float, str)


class WireError(ValueError):
    """A value the wire format cannot carry, or a malformed message from the program."""


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` (built-in types only) as JSON-ready tagged data.

    Raises:
      WireError: a type outside the format, or nesting deeper than ``MAX_DEPTH``.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if kind is int and value.bit_length() > INT_BITS:
        return {"int": format(value, "x")}
    if kind in _ATOMS:
        return value
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise WireError(
        f"type {kind.__name__} cannot cross the sandbox boundary (valid: None, bool, int, "
        "float, str, list, tuple, dict, set, frozenset, bytes, complex)"
    )


def _bounded_int(text: str) -> int:
    if len(text) > _MAX_DIGITS + 1:  # decimal conversion is quadratic: refuse before it
        raise ValueError(f"an int of more than {_MAX_DIGITS} digits (large ints travel as hex)")
    return int(text)


def parse_line(line: str) -> Any:
    """One JSON line from the program, parsed without rebuilding anything it chose.

    A JSON object becomes a tuple of its ``(key, value)`` pairs, never a dict,
    so its keys are not hashed into a table here (``code/equality.py`` reads
    the tags); a decimal int has at most 4,300 digits (larger ones travel as
    ``{"int": hex}``); nesting past the recursion limit is refused. The cyclic
    garbage collector is paused while the line is parsed: a million small
    containers would otherwise trigger it again and again (a 4 MiB line of
    ``[]`` took 1.0 s with it, 0.15 s without).

    Raises:
      WireError: not JSON, or past those limits.
    """
    limit = sys.get_int_max_str_digits()
    decoder = _DECODER if 0 < limit <= _MAX_DIGITS else _BOUNDED_DECODER
    collecting = gc.isenabled()
    gc.disable()
    try:
        return decoder.decode(line)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON within the limits: {str(exc)[:80]}") from None
    finally:
        if collecting:
            gc.enable()


def fields(message: Any) -> dict[str, Any] | None:
    """A parsed top-level message as a dict of its (at most four) string keys, else None."""
    if type(message) is not tuple or len(message) > 4:
        return None
    if any(type(key) is not str for key, _ in message):
        return None
    return dict(message)


_MAX_DIGITS = 4300  # Python's default int-to-str limit
_DECODER = json.JSONDecoder(object_pairs_hook=tuple)
_BOUNDED_DECODER = json.JSONDecoder(object_pairs_hook=tuple, parse_int=_bounded_int)
