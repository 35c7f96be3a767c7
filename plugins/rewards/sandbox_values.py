"""The typed wire format between the trusted side and the sandboxed program.

A value crosses the sandbox boundary as JSON in which every container other
than a list is a one-key tag::

    None, True, 3, 2.5, "s", [..]         as themselves
    {"tuple": [..]}  {"set": [..]}  {"frozenset": [..]}
    {"dict": [[key, value], ..]}  {"bytes": "hex"}  {"complex": [re, im]}
    {"int": "hex"}                        an int of more than 256 bits

:func:`encode` writes test arguments for the harness; :func:`decode` reads
what the program sent back. Decoding checks every node with ``type(x) is``
against exactly these types and rebuilds plain built-in values, so nothing the
program defined (a class with an ``__eq__`` that always says yes, an ``int``
subclass, a patched ``json``) survives the crossing: the comparison in
:func:`matches` runs on built-in values in the trusted process. The harness
holds a copy of the encoder (it must run alone in the sandbox).
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["WireError", "decode", "encode", "matches", "parse_line"]

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


def _decode_tag(tag: str, body: Any, depth: int) -> Any:
    if tag in ("tuple", "set", "frozenset"):
        if type(body) is not list:
            raise WireError(f"{tag} body must be a list")
        items = [decode(v, depth + 1) for v in body]
        try:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        except TypeError as exc:  # unhashable members of a set
            raise WireError(f"bad {tag}: {exc}") from None
    if tag == "dict":
        if type(body) is not list or any(type(p) is not list or len(p) != 2 for p in body):
            raise WireError("dict body must be a list of [key, value] pairs")
        try:
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
        except TypeError as exc:
            raise WireError(f"bad dict: {exc}") from None
    if tag == "bytes" and type(body) is str:
        try:
            return bytes.fromhex(body)
        except ValueError:
            raise WireError("bytes body must be hex") from None
    if tag == "int" and type(body) is str:
        try:
            return int(body, 16)
        except ValueError:
            raise WireError("int body must be hex") from None
    complex_body = type(body) is list and len(body) == 2
    if tag == "complex" and complex_body and all(type(x) in (int, float) for x in body):
        return complex(body[0], body[1])
    raise WireError(f"bad tag {tag!r} (valid: tuple, set, frozenset, dict, bytes, complex)")


def decode(data: Any, depth: int = 0) -> Any:
    """The built-in value that tagged JSON data ``data`` stands for.

    Raises:
      WireError: any node of another type, an unknown or malformed tag, or
        nesting deeper than ``MAX_DEPTH``.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    kind = type(data)
    if kind in _ATOMS:
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is dict and len(data) == 1:
        ((tag, body),) = data.items()
        return _decode_tag(tag, body, depth)
    raise WireError(f"node of type {kind.__name__} is not in the wire format")


def parse_line(line: str) -> Any:
    """One JSON message from the program, parsed strictly (no recursion blow-up)."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON: {str(exc)[:80]}") from None


def matches(
    value: Any, expected: Any, check: str = "eq", tol: tuple[float, float] = (1e-9, 0.0)
) -> bool:
    """Whether a decoded ``value`` satisfies ``expected`` under ``check``.

    Args:
      value: what the program returned, decoded (built-in types only).
      expected: the test's expected value (trusted, built-in types only).
      check: ``"eq"`` (``value == expected``), ``"is"`` (for None, True,
        False), ``"truthy"``, ``"falsy"``, or
        ``"isclose"`` (``math.isclose`` with ``tol = (rel_tol, abs_tol)``).
    """
    if check == "eq":
        return bool(value == expected)
    if check == "is":  # None / True / False, decoded: the singletons themselves
        return value is expected
    if check == "truthy":
        return bool(value)
    if check == "falsy":
        return not value
    if check == "isclose":
        numbers = (int, float)
        if type(value) not in numbers or type(expected) not in numbers:
            return False
        return math.isclose(value, expected, rel_tol=tol[0], abs_tol=tol[1])
    raise ValueError(f"unknown check {check!r} (valid: eq, is, truthy, falsy, isclose)")
