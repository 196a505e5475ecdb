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
ERROR_MESSAGES = ("", "error: invalid expression", "error: division by zero", "error: integer overflow",
                  "error: expression too long")
INT_MAX = 2 ** 31 - 1
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
    literals: jax.Array | tuple[int, ...]  # the literals in order ([max_bytes] padded with -1 in jnp)


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


def _fail(state: _State, code) -> _State:
    return state._replace(error=jnp.where(state.error == OK, code, state.error))


def _malformed(state: _State, flag=True) -> _State:
    return state._replace(syntax=state.syntax | flag)


def _arith(op, a, b):
    """``a op b`` in wrapping int32 with (result, error, inexact); exact overflow tests per operator."""
    int_min = jnp.int32(-INT_MAX - 1)
    total, difference, product = a + b, a - b, a * b
    safe_b = jnp.where(b == 0, 1, b)
    quotient = a // safe_b
    results = jnp.stack([jnp.int32(0), total, difference, product, quotient, a, -a])
    overflow = jnp.stack([
        False,
        ((a ^ total) & (b ^ total)) < 0,  # the sign flipped away from both operands
        ((a ^ b) & (a ^ difference)) < 0,
        (a != 0) & (product // jnp.where(a == 0, 1, a) != b),  # floor-div check is exact (no false positives)
        False, False, False])
    result = results[op]
    error = jnp.where(overflow[op] | (result == int_min), OVERFLOW, OK)
    error = jnp.where((op == _DIV) & (b == 0), DIV_ZERO, error)
    return result, error, (op == _DIV) & (b != 0) & (quotient * b != a)


def _apply_top(state: _State) -> _State:
    op = state.ops[state.num_ops - 1]
    unary = op >= _POS
    b = state.values[state.num_values - 1]
    a = jnp.where(unary, b, state.values[state.num_values - 2])
    result, error, inexact = _arith(op, a, b)
    num_values = state.num_values - jnp.where(unary, 0, 1)
    state = state._replace(values=state.values.at[num_values - 1].set(result), num_values=num_values,
                           num_ops=state.num_ops - 1, inexact=state.inexact | inexact)
    return _fail(state, error)


def _push_number(state: _State) -> _State:
    return state._replace(values=state.values.at[state.num_values].set(state.number),
                          num_values=state.num_values + 1,
                          literals=state.literals.at[state.num_literals].set(state.number),
                          num_literals=state.num_literals + 1, in_number=False, expect_operand=False)


def _read_digit(state: _State, digit) -> _State:
    misplaced = ~state.expect_operand & ~state.in_number  # "1 2" or ")2"
    bad_zero = state.in_number & state.leading_zero & (digit != 0)
    number = jnp.where(state.in_number, state.number, 0)
    overflow = number > (INT_MAX - digit) // 10
    started = state._replace(number=number * 10 + digit, in_number=True, pos=state.pos + 1,
                             leading_zero=jnp.where(state.in_number, state.leading_zero, digit == 0))
    return _fail(_malformed(started, misplaced | bad_zero), jnp.where(overflow, OVERFLOW, OK))


def _push_op(state: _State, op, expect_operand) -> _State:
    return state._replace(ops=state.ops.at[state.num_ops].set(op), num_ops=state.num_ops + 1,
                          expect_operand=expect_operand, pos=state.pos + 1)


def _close(state: _State, char) -> _State:
    """Consumes ``)`` or the end once no operator above the matching ``(`` is left to apply."""
    top = state.ops[jnp.maximum(state.num_ops - 1, 0)]
    has_open = (state.num_ops > 0) & (top == _OPEN)
    at_end = char == _END
    state = state._replace(num_ops=state.num_ops - jnp.where(at_end, 0, has_open), pos=state.pos + 1,
                           done=at_end)
    return _malformed(state, has_open == at_end)  # ")" needs "(", the end needs none


def _step(expression, length, state: _State, _) -> tuple[_State, None]:
    byte = expression[jnp.minimum(state.pos, expression.shape[0] - 1)].astype(jnp.int32)
    char = jnp.where(state.pos < length, byte, _END)
    is_digit = (char >= ord("0")) & (char <= ord("9"))
    binary = jnp.select([char == ord("+"), char == ord("-"), char == ord("*"), char == ord("/")],
                        [_ADD, _SUB, _MUL, _DIV], _NONE)
    top = state.ops[jnp.maximum(state.num_ops - 1, 0)]
    closing = (char == ord(")")) | (char == _END)
    reduce = (state.num_ops > 0) & (top != _OPEN) & (
        closing | ((binary != _NONE) & (jnp.asarray(_PRECEDENCE)[top] >= jnp.asarray(_PRECEDENCE)[binary])))
    unary = state.expect_operand & ((binary == _ADD) | (binary == _SUB))
    branches = [
        lambda s: s,  # finished or malformed: idle
        _push_number,
        lambda s: _read_digit(s, char - ord("0")),
        lambda s: s._replace(pos=s.pos + 1),  # space
        lambda s: _malformed(_push_op(s, _OPEN, True), ~s.expect_operand),
        lambda s: _push_op(s, jnp.where(binary == _ADD, _POS, _NEG), True),
        _malformed,  # an operator or ")" where an operand must come, or a stray byte
        _apply_top,
        lambda s: _push_op(s, binary, True),
        lambda s: _close(s, char),
    ]
    branch = jnp.select([
        state.done | state.syntax,
        state.in_number & ~is_digit,
        is_digit,
        char == ord(" "),
        char == ord("("),
        unary,
        state.expect_operand & (closing | (binary != _NONE)),
        reduce,
        binary != _NONE,
        closing,
    ], list(range(len(branches))), 6)
    return jax.lax.switch(branch, branches, state), None


def evaluate(expression: jax.Array, length: jax.Array) -> Evaluation:
    """Evaluates the first ``length`` bytes of ``expression`` (uint8 ``[max_bytes]``); jit/vmap-able.

    ``length > max_bytes`` (the text did not fit) gives TOO_LONG.
    """
    size = expression.shape[0]
    zeros = jnp.zeros((size + 1,), jnp.int32)
    state = _State(jnp.int32(0), zeros, jnp.int32(0), zeros, jnp.int32(0), jnp.int32(0), jnp.bool_(False),
                   jnp.bool_(False), jnp.bool_(True), jnp.bool_(False), jnp.int32(OK), jnp.bool_(False), jnp.bool_(False),
                   jnp.full((size + 1,), -1, jnp.int32), jnp.int32(0))
    state, _ = jax.lax.scan(functools.partial(_step, expression, jnp.minimum(length, size)), state, None,
                            length=3 * size + 2)
    error = jnp.where(length > size, TOO_LONG, jnp.where(state.syntax, SYNTAX, state.error))
    return Evaluation(jnp.where(error == OK, state.values[0], 0), error, state.inexact & (error == OK),
                      state.literals[:size])


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
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
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
