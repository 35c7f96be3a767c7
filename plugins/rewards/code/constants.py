"""Constant expressions of literals in assert tests, folded into their values.

``assert f() == 10**9 + 7`` compares a call with a constant as surely as
``assert f() == 1000000007``; :func:`fold` computes such constants on the
trusted side (``code/plan.py`` uses it wherever it needs a literal), so a task
that writes them is not weak. It evaluates an AST of literals (as
``ast.literal_eval`` reads them, plus ``set()``) joined by unary ``+ - ~`` and
binary ``+ - * / // % ** << >> & | ^``; names, calls, attributes, comparisons
and everything else are no constant. Nothing runs but arithmetic on built-in
values, and the arithmetic is bounded before it runs: an integer result of
more than :data:`MAX_BITS` bits, a repetition (``[0] * n``, ``"ab" * n``) or a
concatenation of more than :data:`MAX_ITEMS` elements (nested containers
counted whole) and a division by zero or an overflow make the expression no
constant (the assert is then weak, as before).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_BITS", "MAX_ITEMS", "NotConstant", "fold"]

MAX_BITS = 1 << 20  # about 315,000 decimal digits
MAX_ITEMS = 1 << 20
_SEQUENCES = (str, bytes, list, tuple)
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
    ast.Invert: operator.invert,
}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}


class NotConstant(ValueError):
    """The expression is not a (bounded) constant of literals."""


def _size(value: Any) -> int:
    """Elements of ``value``, nested containers counted whole (a str or bytes is one)."""
    if type(value) in (list, tuple, set, frozenset):
        return 1 + sum(_size(v) for v in value)
    if type(value) is dict:
        return 1 + sum(_size(k) + _size(v) for k, v in value.items())
    return 1


def _number(value: Any) -> bool:
    return type(value) in (bool, int, float, complex)


def _integer_bits(value: Any) -> int:
    return abs(int(value)).bit_length() if type(value) in (bool, int) else 0


def _check_binary(op: type, left: Any, right: Any) -> None:
    """Refuses, before computing it, a result past the bounds."""
    if op is ast.Pow and type(left) in (bool, int) and type(right) in (bool, int):
        if abs(left) > 1 and right > 0 and _integer_bits(left) * right > MAX_BITS:
            raise NotConstant("power too large")
    elif op is ast.LShift and type(right) in (bool, int):
        if right > MAX_BITS or _integer_bits(left) + right > MAX_BITS:
            raise NotConstant("shift too large")
    elif op is ast.Mult:
        if type(left) in (bool, int) and type(right) in _SEQUENCES:
            left, right = right, left
        if type(left) in _SEQUENCES and type(right) in (bool, int):
            unit = len(left) if type(left) in (str, bytes) else _size(left) - 1
            if right > 0 and unit * right > MAX_ITEMS:
                raise NotConstant("repetition too large")
        elif _integer_bits(left) + _integer_bits(right) > MAX_BITS:
            raise NotConstant("product too large")


def _binary(node: ast.BinOp, depth: int) -> Any:
    op = type(node.op)
    if op not in _BINARY:
        raise NotConstant(f"operator {op.__name__}")
    left, right = _fold(node.left, depth + 1), _fold(node.right, depth + 1)
    sequences = type(left) in _SEQUENCES or type(right) in _SEQUENCES
    if sequences and op not in (ast.Add, ast.Mult):
        raise NotConstant("only + and * apply to sequences")  # no %-formatting
    if not sequences and not (_number(left) and _number(right)):
        raise NotConstant("operands must be numbers or sequences")
    _check_binary(op, left, right)
    try:
        value = _BINARY[op](left, right)
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise NotConstant(str(exc)) from None
    if _integer_bits(value) > MAX_BITS or (sequences and _size(value) > MAX_ITEMS + 1):
        raise NotConstant("result too large")
    return value


def _fold(node: ast.expr, depth: int) -> Any:
    if depth > 100:
        raise NotConstant("nested too deep")
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        operand = _fold(node.operand, depth + 1)
        if not _number(operand) or (isinstance(node.op, ast.Invert) and type(operand) is float):
            raise NotConstant("unary operators apply to numbers")
        return _UNARY[type(node.op)](operand)
    if isinstance(node, ast.BinOp):
        return _binary(node, depth)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = [_fold(e, depth + 1) for e in node.elts]
        kind = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)]
        try:
            return kind(items)
        except TypeError as exc:  # an unhashable member of a set
            raise NotConstant(str(exc)) from None
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise NotConstant("dict unpacking")
        pairs = [
            (_fold(k, depth + 1), _fold(v, depth + 1))
            for k, v in zip(node.keys, node.values)
            if k is not None
        ]
        try:
            return dict(pairs)
        except TypeError as exc:
            raise NotConstant(str(exc)) from None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "set"
        and not node.args
        and not node.keywords
    ):
        return set()
    raise NotConstant(f"{type(node).__name__} is not a constant of literals")


def fold(node: ast.expr) -> Any:
    """The value of a constant expression of literals.

    Raises:
      NotConstant: anything else, or a result past the bounds.
    """
    try:
        return _fold(node, 0)
    except (RecursionError, MemoryError):
        raise NotConstant("too large") from None
