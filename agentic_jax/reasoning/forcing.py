"""Budget forcing: controlling how long a model reasons by editing its trace (s1).

Muennighoff et al. 2025, "s1: Simple test-time scaling" (arXiv:2501.19393): when the model ends
its turn before ``min_tokens``, the end is removed and a continuation cue ("Wait,") appended, so
it keeps reasoning (and often corrects itself); when the trace reaches ``max_tokens``, it is cut
there and an answer cue appended, and the model gets ``answer_tokens`` more to give the answer.
The two bounds turn one model into a family of compute levels for the scaling curves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import gin
import jax

from agentic_jax.reasoning.budget import Budget
from agentic_jax.reasoning.steps import State, StepModel, root


def _append(state: State, tokens: Sequence[int], *, drop_last: bool = False) -> State:
    kept = state.tokens[:-1] if drop_last else state.tokens
    return dataclasses.replace(state, tokens=kept + tuple(tokens), done=False)


@gin.configurable(module="reasoning", denylist=["model", "prompts", "key", "budget"])
def budget_forcing(
    model: StepModel,
    prompts: Sequence[Sequence[int]],
    *,
    key,
    min_tokens: int = 0,
    max_tokens: int = 256,
    continue_cue: str = "Wait,",
    answer_cue: str = "<answer>",
    answer_tokens: int = 16,
    temperature: float = 0.0,
    budget: Budget | None = None,
) -> list[State]:
    """One completion per prompt: its turn cannot end before ``min_tokens`` generated tokens
    (cues count; unless the context runs out), its reasoning is cut at ``max_tokens`` (a cue
    may overshoot it by its own length), and after the answer cue it gets ``answer_tokens``.

    Each round is one batched decoder call over the unfinished prompts.  A state's ``steps`` are
    the model's own segments; the cues are in ``tokens`` but not in any step.
    """
    if not 0 <= min_tokens < max_tokens:
        raise ValueError(f"need 0 <= min_tokens < max_tokens, got {min_tokens} and {max_tokens}")
    encode = model.tokenizer.encode
    cue, answer = encode(continue_cue), encode(answer_cue)
    if not cue or not answer:
        raise ValueError("the continuation and answer cues must encode to at least one token")
    whole = dataclasses.replace(model, delimiters=())
    room = model.config.max_seq_len
    states = [root(p) for p in prompts]
    answer_from: list[int | None] = [None] * len(states)  # where the answer cue ends, once forced
    for round_ in range(max_tokens + answer_tokens + 1):
        live = [i for i, s in enumerate(states) if not s.done]
        if not live:
            break
        cap = min(
            answer_tokens - (len(states[i].generated) - answer_from[i])
            if answer_from[i] is not None
            else max_tokens - len(states[i].generated)
            for i in live
        )
        children = dataclasses.replace(whole, max_step_tokens=max(cap, 1)).expand(
            [states[i] for i in live],
            1,
            key=jax.random.fold_in(key, round_),
            temperature=temperature,
            budget=budget,
        )
        if not any(children):
            break
        for i, kids in zip(live, children):
            if not kids:
                continue
            state, length = kids[0], len(kids[0].generated)
            ended = state.done and state.tokens[-1] in model.stop_token_ids
            if answer_from[i] is not None:
                if length - answer_from[i] >= answer_tokens:
                    state = dataclasses.replace(state, done=True)
            elif ended and length < min_tokens and len(state.tokens) + len(cue) < room:
                state = _append(state, cue, drop_last=True)
            elif not state.done and length >= max_tokens and len(state.tokens) + len(answer) < room:
                state = _append(state, answer)
                answer_from[i] = len(state.generated)
            elif not state.done and length >= max_tokens:
                state = dataclasses.replace(state, done=True)  # no room left for an answer
            states[i] = state
    return states
