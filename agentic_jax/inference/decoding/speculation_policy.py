"""When speculative decoding pays, from Leviathan et al. 2023's cost model plus a batch term.

With per-token acceptance rate ``a`` and ``gamma`` drafts, a round emits on average

    E[tokens] = (1 - a ** (gamma + 1)) / (1 - a)            (gamma + 1 when a = 1)

and costs ``gamma`` draft steps (each ``c`` target steps) plus one target pass over ``gamma + 1``
tokens per row.  Leviathan et al. price that pass as one decode step, which holds while decoding is
memory-bound.  A batch of ``B`` rows is memory-bound up to about ``ridge_batch`` tokens per step
(the accelerator's FLOP/byte ratio for the weights: a few hundred on current GPUs and TPUs); past
it a step costs in proportion to its tokens.  So, relative to plain decoding,

    speedup = E[tokens] * max(1, B / R) / (gamma c + max(1, B (gamma + 1) / R))

which falls towards ``E[tokens] / (gamma + 1)`` < 1 at large batch: the verifier then pays for
every rejected draft.  Short outputs amortise neither the draft's prefill nor the last round's
wasted drafts, so below ``min_output_tokens`` the advice is not to speculate.
"""

from __future__ import annotations

import dataclasses


def expected_tokens_per_step(acceptance_rate: float, gamma: int) -> float:
    """Mean tokens emitted per target pass (Leviathan et al. 2023, eq. 1)."""
    a = acceptance_rate
    return gamma + 1.0 if a >= 1.0 else (1.0 - a ** (gamma + 1)) / (1.0 - a)


def expected_speedup(
    acceptance_rate: float,
    gamma: int,
    draft_cost: float,
    *,
    batch: int = 1,
    ridge_batch: float = 256,
) -> float:
    """Throughput of speculative over plain decoding under the module's cost model."""
    plain = max(1.0, batch / ridge_batch)
    verify = max(1.0, batch * (gamma + 1) / ridge_batch)
    return expected_tokens_per_step(acceptance_rate, gamma) * plain / (gamma * draft_cost + verify)


@dataclasses.dataclass(frozen=True)
class SpeculationAdvice:
    speculate: bool
    gamma: int  # the best draft length (0 when not speculating)
    speedup: float  # predicted at that gamma
    reason: str


def advise_speculation(
    *,
    acceptance_rate: float,
    draft_cost: float,
    batch: int = 1,
    output_tokens: int = 256,
    max_gamma: int = 8,
    ridge_batch: float = 256,
    min_speedup: float = 1.1,
    min_output_tokens: int = 16,
) -> SpeculationAdvice:
    """Whether to speculate and with how many drafts, for a measured or expected acceptance rate.

    ``draft_cost``: one draft step's time over one target decode step (0 for prompt lookup).
    """
    if not 0 <= acceptance_rate <= 1 or draft_cost < 0 or batch < 1:
        raise ValueError("need 0 <= acceptance_rate <= 1, draft_cost >= 0 and batch >= 1")
    gamma, speedup = max(
        (
            (
                g,
                expected_speedup(
                    acceptance_rate, g, draft_cost, batch=batch, ridge_batch=ridge_batch
                ),
            )
            for g in range(1, max_gamma + 1)
        ),
        key=lambda x: x[1],
    )
    if output_tokens < min_output_tokens:
        return SpeculationAdvice(
            False,
            0,
            1.0,
            f"outputs of {output_tokens} tokens are too short "
            f"to amortise drafting (< {min_output_tokens})",
        )
    if speedup < min_speedup:
        why = (
            f"a batch of {batch} makes verification compute-bound"
            if batch * 2 > ridge_batch
            else f"acceptance {acceptance_rate:.2f} does not pay for drafts costing "
            f"{draft_cost:.2f} target steps each"
        )
        return SpeculationAdvice(
            False, 0, 1.0, f"best predicted speedup {speedup:.2f}x at gamma={gamma}: {why}"
        )
    return SpeculationAdvice(True, gamma, speedup, f"predicted {speedup:.2f}x at gamma={gamma}")
