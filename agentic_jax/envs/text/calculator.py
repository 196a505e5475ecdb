"""Integer calculator: ``+ - * / ( )`` over int32, in jnp (inside jit) and in Python (host side).

Semantics, identical in both implementations and checked against Python's
``eval`` in the tests:

* The grammar is Python's for these operators: unary ``+``/``-`` bind
  tighter than ``*``/``/``, which bind tighter than binary ``+``/``-``; all
  binary operators are left-associative; literals are decimal without
  leading zeros (``007`` is a syntax error, ``0`` and ``00`` are not);
  spaces are ignored.
* ``/`` is Python's floor division ``//`` (``-7 / 2 == -4``).  Whether a
  division was inexact is reported separately, for tasks such as Countdown
  whose rules only allow exact division.
* Malformed text is a syntax error (as Python rejects it before running
  anything), never an exception: the result is a value plus an error code.
* Values are int32 without ``-2**31``.  Evaluation runs in Python's order
  (operands left to right, then the operator) and reports the first error:
  a division by zero (Python's ``ZeroDivisionError``) or a literal or
  intermediate result outside ``[-2**31 + 1, 2**31 - 1]`` (overflow; Python
  would carry on with big integers).

The jnp evaluator is the two-stack (Dijkstra shunting-yard) algorithm run
as a fixed number of steps of a state machine over the bytes: each step
either consumes a byte, finishes a number or applies one operator, so
``3 * max_bytes + 2`` steps always suffice and the loop has static length.
Applying operators as they are popped is exactly postfix order, i.e.
Python's evaluation order.
"""

from __future__ import annotations

import ast
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

OK, SYNTAX, DIV_ZERO, OVERFLOW, TOO_LONG = range(5)
ERROR_MESSAGES = (
    "",
    "error: invalid expression",
    "error: division by zero",
    "error: integer overflow",
    "error: expression too long",
)
INT_MAX = 2**31 - 1
ALLOWED = frozenset("0123456789+-*/() ")

# Operator codes on the operator stack; precedence is indexed by code.
_NONE, _ADD, _SUB, _MUL, _DIV, _POS, _NEG, _OPEN = range(8)
_PRECEDENCE = np.asarray((0, 1, 1, 2, 2, 3, 3, 0), np.int32)
_END = -1  # the byte read past the end of the expression


class Evaluation(NamedTuple):
    """Result of evaluating one expression (arrays in jnp, Python ints on the host)."""

    value: jax.Array | int  # 0 unless error == OK
    error: jax.Array | int  # OK, SYNTAX, DIV_ZERO, OVERFLOW or TOO_LONG
    inexact: jax.Array | bool  # some division had a remainder
    literals: (
        jax.Array | tuple[int, ...]
    )  # the literals in order, none on error ([max_bytes], -1 padded in jnp)


class _State(NamedTuple):
    pos: jax.Array
    values: jax.Array
    num_values: jax.Array
    ops: jax.Array
    num_ops: jax.Array
    number: jax.Array  # the literal being read
    in_number: jax.Array
    leading_zero: jax.Array
    expect_operand: jax.Array
    syntax: jax.Array  # malformed: wins over any evaluation error, so scanning goes on after those
    error: jax.Array  # the first evaluation error
    done: jax.Array
    inexact: jax.Array
    literals: jax.Array
    num_literals: jax.Array


def _arith(op, a, b):
    """``a op b`` in wrapping int32 with (result, error, inexact); exact overflow tests per operator."""
    int_min = jnp.int32(-INT_MAX - 1)
    total, difference, product = a + b, a - b, a * b
    quotient = a // jnp.where(b == 0, 1, b)
    results = jnp.stack([jnp.int32(0), total, difference, product, quotient, a, -a])
    overflow = jnp.stack(
        [
            False,
            ((a ^ total) & (b ^ total)) < 0,  # the sign flipped away from both operands
            ((a ^ b) & (a ^ difference)) < 0,
            (a != 0)
            & (
                product // jnp.where(a == 0, 1, a) != b
            ),  # floor-div check is exact (no false positives)
            False,
            False,
            False,
        ]
    )
    result = results[op]
    error = jnp.where(overflow[op] | (result == int_min), OVERFLOW, OK)
    error = jnp.where((op == _DIV) & (b == 0), DIV_ZERO, error)
    return result, error, (op == _DIV) & (b != 0) & (quotient * b != a)


def _step(expression, length, s: _State, _) -> tuple[_State, None]:
    """One transition: finish a literal, apply the top operator, or consume one byte.

    The cases are exclusive and tried in this order: idle (finished or
    malformed), finish a literal, a digit, a space, "(", a unary sign, a
    missing operand, apply the top operator (before a binary operator of no
    higher precedence, ")" or the end), push a binary operator, ")" or the
    end, a stray byte.  Every field is then updated once with ``where``.
    """
    byte = expression[jnp.minimum(s.pos, expression.shape[0] - 1)].astype(jnp.int32)
    char = jnp.where(s.pos < length, byte, _END)
    is_digit = (char >= ord("0")) & (char <= ord("9"))
    binary = jnp.select(
        [char == ord("+"), char == ord("-"), char == ord("*"), char == ord("/")],
        [_ADD, _SUB, _MUL, _DIV],
        _NONE,
    )
    top = s.ops[jnp.maximum(s.num_ops - 1, 0)]
    closing, at_end = (char == ord(")")) | (char == _END), char == _END
    precedence = jnp.asarray(_PRECEDENCE)
    outranks = (
        (s.num_ops > 0)
        & (top != _OPEN)
        & (closing | ((binary != _NONE) & (precedence[top] >= precedence[binary])))
    )

    live = ~(s.done | s.syntax)
    finish = live & s.in_number & ~is_digit
    live = live & ~finish
    digit = live & is_digit
    space = live & (char == ord(" "))
    opening = live & (char == ord("("))
    sign = live & s.expect_operand & ((binary == _ADD) | (binary == _SUB))
    missing = live & s.expect_operand & ~sign & (closing | (binary != _NONE))
    apply = live & ~s.expect_operand & outranks
    push_binary = live & ~s.expect_operand & (binary != _NONE) & ~outranks
    close = live & ~s.expect_operand & closing & ~outranks
    stray = live & ~(is_digit | space | opening | closing | (binary != _NONE))

    # A digit extends (or starts) the literal.
    value = char - ord("0")
    number = jnp.where(s.in_number, s.number, 0)
    digit_syntax = (~s.expect_operand & ~s.in_number) | (
        s.in_number & s.leading_zero & (value != 0)
    )  # "1 2", "07"
    digit_overflow = number > (INT_MAX - value) // 10
    # Applying the top operator pops its operands and pushes the result.
    unary_op = top >= _POS
    b = s.values[jnp.maximum(s.num_values - 1, 0)]
    a = jnp.where(unary_op, b, s.values[jnp.maximum(s.num_values - 2, 0)])
    result, arith_error, inexact = _arith(top, a, b)
    # ")" needs a "(" on top; the end needs none.
    has_open = (s.num_ops > 0) & (top == _OPEN)

    slot = jnp.where(finish, s.num_values, s.num_values - 1 - ~unary_op)
    pushed = jnp.where(
        opening, _OPEN, jnp.where(sign, jnp.where(binary == _ADD, _POS, _NEG), binary)
    )
    push = opening | sign | push_binary
    error = jnp.where(digit & digit_overflow, OVERFLOW, jnp.where(apply, arith_error, OK))
    new = _State(
        pos=s.pos + (digit | space | opening | sign | push_binary | close),
        values=s.values.at[slot].set(
            jnp.where(finish, s.number, jnp.where(apply, result, s.values[slot]))
        ),
        num_values=s.num_values + finish - (apply & ~unary_op),
        ops=s.ops.at[s.num_ops].set(jnp.where(push, pushed, s.ops[s.num_ops])),
        num_ops=s.num_ops + push - apply - (close & has_open & ~at_end),
        number=jnp.where(digit, number * 10 + value, s.number),
        in_number=(s.in_number | digit) & ~finish,
        leading_zero=jnp.where(digit & ~s.in_number, value == 0, s.leading_zero),
        expect_operand=(s.expect_operand | push) & ~finish,
        syntax=s.syntax
        | (digit & digit_syntax)
        | (opening & ~s.expect_operand)
        | missing
        | stray
        | (close & (has_open == at_end)),
        error=jnp.where(s.error == OK, error, s.error),
        done=s.done | (close & at_end),
        inexact=s.inexact | (apply & inexact),
        literals=s.literals.at[s.num_literals].set(
            jnp.where(finish, s.number, s.literals[s.num_literals])
        ),
        num_literals=s.num_literals + finish,
    )
    return new, None


def evaluate(expression: jax.Array, length: jax.Array) -> Evaluation:
    """Evaluates the first ``length`` bytes of ``expression`` (uint8 ``[max_bytes]``); jit/vmap-able.

    ``length > max_bytes`` (the text did not fit) gives TOO_LONG.
    """
    size = expression.shape[0]
    zero, no, stack = jnp.int32(0), jnp.bool_(False), jnp.zeros((size + 1,), jnp.int32)
    state = _State(
        pos=zero,
        values=stack,
        num_values=zero,
        ops=stack,
        num_ops=zero,
        number=zero,
        in_number=no,
        leading_zero=no,
        expect_operand=jnp.bool_(True),
        syntax=no,
        error=jnp.int32(OK),
        done=no,
        inexact=no,
        literals=stack - 1,
        num_literals=zero,
    )
    state, _ = jax.lax.scan(
        functools.partial(_step, expression, jnp.minimum(length, size)),
        state,
        None,
        length=3 * size + 2,
    )
    error = jnp.where(length > size, TOO_LONG, jnp.where(state.syntax, SYNTAX, state.error))
    ok = error == OK
    return Evaluation(
        jnp.where(ok, state.values[0], 0),
        error,
        state.inexact & ok,
        jnp.where(ok, state.literals[:size], -1),
    )


class _HostError(Exception):
    def __init__(self, code: int):
        self.code = code


def _checked(value: int) -> int:
    if abs(value) > INT_MAX:
        raise _HostError(OVERFLOW)
    return value


def evaluate_text(expression: str, max_bytes: int) -> Evaluation:
    """The same calculator on the host, by walking Python's own parse tree."""
    if len(expression.encode()) > max_bytes:
        return Evaluation(0, TOO_LONG, False, ())
    if not set(expression) <= ALLOWED:
        return Evaluation(0, SYNTAX, False, ())
    try:
        tree = ast.parse(expression.strip(" ").replace("/", "//"), mode="eval").body
    except SyntaxError:
        return Evaluation(0, SYNTAX, False, ())
    literals, inexact = [], []

    def walk(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
            return _checked(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and isinstance(
            node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)
        ):
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.FloorDiv):
                if b == 0:
                    raise _HostError(DIV_ZERO)
                inexact.append(a % b != 0)
                return _checked(a // b)
            return _checked({ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(node.op)])
        raise _HostError(SYNTAX)  # "2**3", "(1)(2)": valid Python but not this calculator

    try:
        value = walk(tree)
    except _HostError as e:
        return Evaluation(0, e.code, False, ())
    return Evaluation(value, OK, any(inexact), tuple(literals))
