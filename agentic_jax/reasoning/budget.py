"""The compute a test-time method may spend, counted the same way for every method."""

from __future__ import annotations

import dataclasses

import gin


@gin.configurable(module="reasoning")
@dataclasses.dataclass
class Budget:
    """A limit on sampled sequences (``model_calls``: one call samples one step or solution for
    one state) and on generated tokens; ``None`` is no limit.

    Methods ask :meth:`affordable` before each batched expansion, with the worst case of the
    calls they would make, so they stop *at* the budget, never past it; :meth:`charge` records
    what an expansion really spent.  The same counters give every method one x-axis in the
    test-time scaling curves.  ``prompt_tokens_spent`` counts the prompt tokens prefilled: once
    per distinct prompt of a batched expansion (a state's candidates, and copies of one root,
    share one prefill and its KV cache), so that compute is ``flops_per_token`` times the
    prefilled and generated tokens together.
    """

    model_calls: int | None = None
    tokens: int | None = None
    calls_spent: int = 0
    tokens_spent: int = 0
    prompt_tokens_spent: int = 0

    def __post_init__(self):
        for name in ("model_calls", "tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"Budget.{name} must be a positive integer or None, got {value!r}")

    def affordable(self, calls: int, tokens_per_call: int) -> int:
        """How many of ``calls`` sampled sequences of up to ``tokens_per_call`` tokens fit."""
        fit = calls
        if self.model_calls is not None:
            fit = min(fit, self.model_calls - self.calls_spent)
        if self.tokens is not None:
            fit = min(fit, (self.tokens - self.tokens_spent) // max(tokens_per_call, 1))
        return max(fit, 0)

    def charge(self, calls: int, tokens: int, prompt_tokens: int = 0) -> None:
        self.calls_spent += calls
        self.tokens_spent += tokens
        self.prompt_tokens_spent += prompt_tokens
        over = (self.model_calls is not None and self.calls_spent > self.model_calls) or (
            self.tokens is not None and self.tokens_spent > self.tokens
        )
        if over:
            raise RuntimeError(
                f"budget overrun: spent {self.calls_spent} calls and {self.tokens_spent} tokens "
                f"of {self.model_calls} and {self.tokens}; a method charged what it did not ask for"
            )
