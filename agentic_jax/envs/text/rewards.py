"""Verifiers: the reward of a final answer, inside jit (``__call__``) and on the host (``host``).

A verifier sees the content of the policy's answering turn (its text before
``<|im_end|>``) and the task.  Components:

* `ExactAnswer`: the text inside ``<answer>...</answer>`` (first pair,
  whitespace-stripped) equals the task's answer.  The RLVR outcome reward.
* `ThinkAnswerFormat`: the turn is exactly ``<think>...</think>`` then
  ``<answer>...</answer>``, each tag once, only whitespace around them
  (the format reward of DeepSeek-R1-style training).
* `NumericCloseness`: partial credit ``1 / (1 + |answer - value|)`` for an
  answer that evaluates (with the calculator) to an integer.
* `CountdownAnswer`: the answer is an expression over the task's numbers,
  each used at most once, with exact divisions only, equal to the target.
* `Weighted`: ``sum(weight * component)``; its ``max_value`` is the full reward.
* `ByFamily`: the verifier of each task's family, for banks that mix families.

The two implementations share the specification, not code (one runs on
bytes in jnp, one on ``str``); the tests hold them equal.
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp

from agentic_jax.envs.text import calculator
from agentic_jax.envs.text.strings import (
    WHITESPACE,
    Text,
    count,
    equals,
    find,
    is_space,
    strip,
    substring,
)
from agentic_jax.envs.text.tasks import Task, TaskBank

_BLANK = WHITESPACE.decode()


def answer_span(content: Text, tag: str = "answer") -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(found, start, end)`` of the stripped text inside the first ``<tag>...</tag>``."""
    opening, closing = f"<{tag}>".encode(), f"</{tag}>".encode()
    open_at = find(content, opening)
    close_at = find(content, closing, open_at + len(opening))
    start, end = strip(content, open_at + len(opening), close_at)
    return (open_at >= 0) & (close_at >= 0), start, end


def answer_text(content: str, tag: str = "answer") -> str | None:
    """Host version of `answer_span`: the stripped inner text, or None."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    open_at = content.find(opening)
    close_at = content.find(closing, open_at + len(opening)) if open_at >= 0 else -1
    return content[open_at + len(opening) : close_at].strip(_BLANK) if close_at >= 0 else None


def _answer(content: Text, size: int) -> tuple[jax.Array, Text]:
    found, start, end = answer_span(content)
    return found, substring(content, start, end, size)


class Reward:
    """A verifier; ``max_value`` is what a correct, well-formatted answer earns."""

    max_value: float = 1.0

    def __call__(self, content: Text, task: TaskBank) -> jax.Array:
        raise NotImplementedError

    def host(self, content: str, task: Task) -> float:
        raise NotImplementedError


class ExactAnswer(Reward):
    def __call__(self, content, task):
        found, answer = _answer(content, task.answer.shape[0])
        return (found & equals(answer, Text(task.answer, task.answer_length))).astype(jnp.float32)

    def host(self, content, task):
        return float(answer_text(content) == task.answer)


class ThinkAnswerFormat(Reward):
    TAGS = ("<think>", "</think>", "<answer>", "</answer>")

    def __call__(self, content, task):
        end = jnp.minimum(content.length, content.data.shape[0])
        once = jnp.all(jnp.stack([count(content, t.encode()) == 1 for t in self.TAGS]))
        starts = [find(content, t.encode()) for t in self.TAGS]
        ends = [s + len(t) for s, t in zip(starts, self.TAGS)]
        ordered = (starts[0] < starts[1]) & (starts[1] < starts[2]) & (starts[2] < starts[3])
        gaps = (
            is_space(content, 0, starts[0])
            & is_space(content, ends[1], starts[2])
            & is_space(content, ends[3], end)
        )
        return (content.fits & once & ordered & gaps).astype(jnp.float32)

    def host(self, content, task):
        inner = "(?:(?!</?think>|</?answer>).)*"
        blank = f"[{re.escape(_BLANK)}]*"
        pattern = f"{blank}<think>{inner}</think>{blank}<answer>{inner}</answer>{blank}"
        return float(re.fullmatch(pattern, content, re.DOTALL) is not None)


class NumericCloseness(Reward):
    def __init__(self, max_bytes: int = 48):
        self.max_bytes = max_bytes

    def __call__(self, content, task):
        found, answer = _answer(content, self.max_bytes)
        result = calculator.evaluate(answer.data, answer.length)
        # Subtract in int32: float32 operands are rounded beyond 2**24 (an answer off by one would score as
        # off by 0 or 8); only a difference that overflows int32 is taken in float32, where it is huge anyway.
        value, target = result.value, jnp.asarray(task.value, jnp.int32)
        difference = value - target
        overflow = ((value ^ target) & (value ^ difference)) < 0
        distance = jnp.where(
            overflow,
            jnp.abs(value.astype(jnp.float32) - target.astype(jnp.float32)),
            jnp.abs(difference.astype(jnp.float32)),
        )
        return jnp.where(found & (result.error == calculator.OK), 1.0 / (1.0 + distance), 0.0)

    def host(self, content, task):
        answer = answer_text(content)
        result = calculator.evaluate_text(answer, self.max_bytes) if answer is not None else None
        if result is None or result.error != calculator.OK:
            return 0.0
        return 1.0 / (1.0 + abs(float(result.value) - float(task.value)))


def _uses_only(literals: jax.Array, numbers: jax.Array, num_numbers: jax.Array) -> jax.Array:
    """Each literal (-1 padded) matched to a distinct available number, greedily in order."""

    def match(used, literal):
        free = (numbers == literal) & ~used & (jnp.arange(numbers.shape[0]) < num_numbers)
        slot = jnp.argmax(free)
        ok = (literal < 0) | jnp.any(free)
        return used.at[slot].set(used[slot] | ((literal >= 0) & jnp.any(free))), ok

    _, ok = jax.lax.scan(match, jnp.zeros(numbers.shape, bool), literals)
    return jnp.all(ok)


class CountdownAnswer(Reward):
    def __init__(self, max_bytes: int = 48):
        self.max_bytes = max_bytes

    def __call__(self, content, task):
        found, answer = _answer(content, self.max_bytes)
        result = calculator.evaluate(answer.data, answer.length)
        legal = (result.error == calculator.OK) & ~result.inexact & (result.value == task.value)
        return (found & legal & _uses_only(result.literals, task.numbers, task.num_numbers)).astype(
            jnp.float32
        )

    def host(self, content, task):
        answer = answer_text(content)
        result = calculator.evaluate_text(answer, self.max_bytes) if answer is not None else None
        if (
            result is None
            or result.error != calculator.OK
            or result.inexact
            or result.value != task.value
        ):
            return 0.0
        return float(not collections.Counter(result.literals) - collections.Counter(task.numbers))


class Weighted(Reward):
    """``sum(weight * reward)`` over ``(weight, reward)`` pairs."""

    def __init__(self, *terms: tuple[float, Reward]):
        if not terms:
            raise ValueError("Weighted needs at least one (weight, reward) term")
        self.terms = terms
        self.max_value = sum(w * r.max_value for w, r in terms)

    def __call__(self, content, task):
        return sum(w * r(content, task) for w, r in self.terms).astype(jnp.float32)

    def host(self, content, task):
        return sum(w * r.host(content, task) for w, r in self.terms)


class ByFamily(Reward):
    """Each task's own family's verifier (``Task.family``), for one env over a mix of task families.

    The bank must be built with ``families=tuple(rewards)`` (`TextEnv` does
    this); ``max_value`` is the largest of the families' full rewards.
    """

    def __init__(self, rewards: dict[str, Reward]):
        if not rewards:
            raise ValueError("ByFamily needs at least one family")
        self.rewards = dict(rewards)
        self.families = tuple(self.rewards)
        self.max_value = max(r.max_value for r in self.rewards.values())

    def __call__(self, content, task):
        values = jnp.stack([r(content, task) for r in self.rewards.values()])
        return values[task.family].astype(jnp.float32)

    def host(self, content, task):
        return self.rewards[task.family].host(content, task)
