"""Whether the value a program sent satisfies a test, judged on the wire form itself.

The program's value is never rebuilt on the trusted side. Rebuilding is where
an answer can stall the caller: a dict or set built from keys the program chose
costs time quadratic in their number when they share a hash (ints equal modulo
2**61 - 1 do, whatever the hash seed), and a subclass's code must not run here.
Instead the wire data (:func:`~rlax.plugins.rewards.code.values.parse_line`:
JSON atoms, lists, and one-key tags parsed as ``((tag, body),)``) is walked in
step with the expected value, which is trusted:

- lists and tuples: same kind, same length, then item by item, stopping at the
  first difference;
- dicts and sets: same kind and length, then keys (members) are put in a
  canonical, totally ordered form and sorted on both sides, ``O(n log n)``;
  the canonical form equates exactly what Python's ``==`` equates among
  hashable built-ins (``1 == 1.0 == True``, ``(1,) == (1.0,)``, a set and a
  frozenset), and a NaN key equals nothing;
- atoms: Python's ``==`` between built-in values (an int sent as hex is read
  in linear time).

Each comparison visits at most as many of the program's nodes as the expected
value has (plus a few): an equal value has exactly as many, so a bigger one is
unequal without being read; depth is capped at :data:`MAX_DEPTH` and the
call's deadline is checked as it goes (:class:`Late`).
"""

from __future__ import annotations

import math
import operator
import time
from typing import Any

from rlax.plugins.rewards.code.values import MAX_DEPTH, WireError

__all__ = ["Budget", "Late", "bracket_bound", "matches"]

MAX_INT_HEX = 1 << 20  # hex digits of one int: 4 million bits
_SLACK = 16
_FIRST = operator.itemgetter(0)
_CONTAINER = object()  # _atom's answer for a list or a container tag
_PLAIN = frozenset({type(None), bool, int, float, complex, bytes})  # atoms without brackets
_JSON_ATOMS = frozenset({type(None), bool, int, float, str})
_TAGS = ("tuple", "set", "frozenset", "dict", "bytes", "complex", "int")


class Late(Exception):
    """The call's deadline passed while a value was being compared."""


class _Unequal(Exception):
    """Decided: not equal (an unhashable or NaN key, more nodes than expected)."""


class Budget:
    """What one comparison may still spend: program nodes to visit, and the deadline."""

    def __init__(self, expected: Any, deadline: float | None = None) -> None:
        self.nodes = _count(expected, 1 << 22) + _SLACK
        self.deadline = deadline

    def spend(self) -> None:
        self.nodes -= 1
        if self.nodes < 0:
            raise _Unequal("larger than the expected value")
        due = self.nodes & 1023 == 0 and self.deadline is not None
        if due and time.monotonic() > self.deadline:  # type: ignore[operator]
            raise Late


def _count(value: Any, cap: int, brackets: list[int] | None = None) -> int:
    """Nodes of a trusted value, counted up to ``cap``; adds to ``brackets[0]`` the
    ``[`` and ``{`` inside its strings."""
    count, stack = 0, [value]
    while stack and count < cap:
        item = stack.pop()
        count += 1
        kind = type(item)
        if kind in _PLAIN:
            continue
        if isinstance(item, str):
            if brackets is not None:
                brackets[0] += item.count("[") + item.count("{")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
    return count


def bracket_bound(expected: Any) -> int:
    """The most ``[`` and ``{`` that a message carrying a value equal to ``expected``
    holds: two per node (a tag's brace and its list; a dict pair's list is its key's),
    the brackets inside its strings, and the message's own. A line with more cannot
    be an equal answer, and is not parsed (parsing a million tiny containers is the
    costly part of a 4 MiB line)."""
    brackets = [0]
    nodes = _count(expected, 1 << 22, brackets)
    return 3 * nodes + brackets[0] + 256


def _tag(node: Any) -> tuple[str, Any]:
    if len(node) != 1 or type(node[0]) is not tuple or node[0][0] not in _TAGS:
        raise WireError("a tag is one key of tuple, set, frozenset, dict, bytes, complex, int")
    return node[0]


def _body(node: Any, tags: tuple[str, ...]) -> list | None:
    """The item list of a container tag among ``tags``; None for any other node."""
    if type(node) is not tuple:
        return None
    tag, body = _tag(node)
    if tag not in tags:
        return None
    if type(body) is not list:
        raise WireError(f"{tag} body must be a list")
    return body


def _atom(node: Any) -> Any:
    """The built-in atom a node stands for, or ``_CONTAINER``."""
    if type(node) in (type(None), bool, int, float, str):
        return node
    if type(node) is list:
        return _CONTAINER
    tag, body = _tag(node)
    if tag == "int" and type(body) is str and len(body) <= MAX_INT_HEX:
        try:
            return int(body, 16)  # a power-of-two base: linear, no digit limit
        except ValueError:
            raise WireError("int body must be hex") from None
    if tag == "bytes" and type(body) is str:
        try:
            return bytes.fromhex(body)
        except ValueError:
            raise WireError("bytes body must be hex") from None
    parts = type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body)
    if tag == "complex" and parts:
        return complex(body[0], body[1])
    if tag in ("tuple", "set", "frozenset", "dict"):
        return _CONTAINER
    raise WireError(f"malformed {tag}")


def _canon_atom(value: Any) -> tuple:
    kind = type(value)
    if kind is int or kind is bool:  # the common keys first, by exact type
        return (0, value, 0)
    if kind is str:
        return (1, value)
    if value is None:
        return (3,)
    if isinstance(value, str):
        return (1, value)
    if isinstance(value, bytes):
        return (2, value)
    if isinstance(value, complex):
        if math.isnan(value.real) or math.isnan(value.imag):
            raise _Unequal("NaN")
        return (0, value.real, value.imag)
    if isinstance(value, bool | int | float):
        if isinstance(value, float) and math.isnan(value):  # equal to nothing, not even itself
            raise _Unequal("NaN")
        return (0, value, 0)
    raise _Unequal(f"no canonical form for {type(value).__name__}")


def _canon(node: Any, depth: int, budget: Budget) -> tuple:
    """The canonical form of a hashable wire value (a dict key, a set member)."""
    budget.spend()
    kind = type(node)
    if kind is int or kind is bool:  # the common keys first
        return (0, node, 0)
    if kind is str:
        return (1, node)
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    if type(node) is tuple and (body := _body(node, ("tuple", "frozenset"))) is not None:
        items = [_canon(item, depth + 1, budget) for item in body]
        return (4, tuple(items)) if node[0][0] == "tuple" else (5, tuple(sorted(items)))
    atom = _atom(node)
    if atom is _CONTAINER:
        raise _Unequal("an unhashable key")
    return _canon_atom(atom)


def _canon_trusted(value: Any) -> tuple:
    if isinstance(value, tuple):
        return (4, tuple(_canon_trusted(v) for v in value))
    if isinstance(value, frozenset):
        return (5, tuple(sorted(_canon_trusted(v) for v in value)))
    return _canon_atom(value)


def _equal_dict(node: Any, expected: dict, depth: int, budget: Budget) -> bool:
    body = _body(node, ("dict",))
    if body is None or len(body) != len(expected):
        return False
    if any(type(pair) is not list or len(pair) != 2 for pair in body):
        raise WireError("dict body must be a list of [key, value] pairs")
    sent = sorted(((_canon(k, depth + 1, budget), v) for k, v in body), key=_FIRST)
    wanted = sorted(((_canon_trusted(k), v) for k, v in expected.items()), key=_FIRST)
    for (key, value), (want_key, want) in zip(sent, wanted, strict=True):
        if key != want_key or not _equal(value, want, depth + 1, budget):
            return False
    return True


def _equal_set(node: Any, expected: set | frozenset, depth: int, budget: Budget) -> bool:
    body = _body(node, ("set", "frozenset"))
    if body is None or len(body) != len(expected):
        return False
    sent = sorted(_canon(item, depth + 1, budget) for item in body)
    return sent == sorted(_canon_trusted(item) for item in expected)


def _equal(node: Any, expected: Any, depth: int, budget: Budget) -> bool:
    budget.spend()
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    if type(expected) in _JSON_ATOMS and type(node) in _JSON_ATOMS:
        return bool(node == expected)  # built-in atoms on both sides
    if isinstance(expected, dict):
        return _equal_dict(node, expected, depth, budget)
    if isinstance(expected, set | frozenset):
        return _equal_set(node, expected, depth, budget)
    if isinstance(expected, list | tuple):
        items = node if type(node) is list else None
        if isinstance(expected, tuple):
            items = _body(node, ("tuple",))
        if items is None or len(items) != len(expected):
            return False
        return all(_equal(n, e, depth + 1, budget) for n, e in zip(items, expected, strict=True))
    atom = _atom(node)
    return atom is not _CONTAINER and bool(atom == expected)


def _truth(node: Any) -> bool:
    atom = _atom(node)
    if atom is not _CONTAINER:
        return bool(atom)
    if type(node) is list:
        return bool(node)
    body = _tag(node)[1]
    if type(body) is not list:
        raise WireError("a container tag's body must be a list")
    return bool(body)


def matches(
    node: Any,
    expected: Any,
    check: str = "eq",
    tol: tuple[float, float] = (1e-9, 0.0),
    deadline: float | None = None,
) -> bool:
    """Whether the wire value ``node`` satisfies ``expected`` under ``check``.

    Args:
      node: the program's value as ``parse_line`` gave it (never rebuilt).
      expected: the test's expected value (trusted).
      check: ``"eq"`` (Python's ``==`` on the value the node stands for),
        ``"is"`` (None, True, False), ``"truthy"``, ``"falsy"``, or
        ``"isclose"`` (``math.isclose`` with ``tol = (rel_tol, abs_tol)``).
      deadline: a ``time.monotonic()`` past which the comparison stops.

    Raises:
      WireError: a malformed node. Late: the deadline passed.
    """
    if check == "eq":
        try:
            return _equal(node, expected, 0, Budget(expected, deadline))
        except _Unequal:
            return False
    if check == "is":  # None / True / False: JSON's singletons, or nothing
        return node is expected
    if check in ("truthy", "falsy"):
        return _truth(node) is (check == "truthy")
    if check == "isclose":
        value, numbers = _atom(node), (int, float)
        if type(value) not in numbers or type(expected) not in numbers:
            return False
        try:
            return math.isclose(value, expected, rel_tol=tol[0], abs_tol=tol[1])
        except OverflowError:  # an int too large for a float
            return False
    raise ValueError(f"unknown check {check!r} (valid: eq, is, truthy, falsy, isclose)")
