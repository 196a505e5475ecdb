"""Reasoning states and steps, and expanding many states by one batched decoder call.

A *state* is a transcript: the prompt's token ids and the steps generated after it.  A *step* is
one model segment that ends at a step delimiter (a newline, ``</step>``, the end of a tool call;
the delimiter stays in the step), at a stop token (the end of the turn: the state is then
terminal), or after ``max_step_tokens``.  Tree and beam search grow states level by level:
:meth:`StepModel.expand` samples ``k`` candidate steps for every live state in a single
``generate`` call, so a tree level costs one decoder call, not one per node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import gin
import jax
import numpy as np

from agentic_jax.data.tokenizer import IM_END, Tokenizer
from agentic_jax.envs.text.rewards import answer_text
from agentic_jax.inference.decoding.generate import generate, truncate_at_stop_strings
from agentic_jax.inference.decoding.prompts import PromptBatch, check_token_ids
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models import TransformerConfig
from agentic_jax.models.export import load_checkpoint
from agentic_jax.reasoning.budget import Budget

PAD_MULTIPLE = 32


@dataclasses.dataclass(frozen=True)
class State:
    """A transcript: ``tokens`` (the prompt, then the steps one after another), the steps' token
    ids, the sampled tokens' summed log-probability under the model's own softmax, and whether
    the turn (or episode) has ended.  When steps are agent turns (``TurnModel``), ``reward`` is
    the environment's return so far and ``episode`` its state for this transcript."""

    tokens: tuple[int, ...]
    prompt_length: int
    steps: tuple[tuple[int, ...], ...] = ()
    logprob: float = 0.0
    done: bool = False
    reward: float = 0.0
    episode: object = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def generated(self) -> tuple[int, ...]:
        return self.tokens[self.prompt_length :]


def root(prompt: Sequence[int] | State) -> State:
    """The state a search starts from: the prompt alone, or a given state (an episode's first
    observation from ``TurnModel.roots``, or a move already made)."""
    if isinstance(prompt, State):
        return prompt
    prompt = tuple(int(t) for t in prompt)
    if not prompt:
        raise ValueError("a reasoning state needs a non-empty prompt")
    return State(prompt, len(prompt))


@gin.configurable(module="reasoning")
@dataclasses.dataclass
class StepModel:
    """A model that proposes steps: parameters, config, tokenizer and what ends a step.

    ``stop_token_ids`` end the turn (default: the tokenizer's EOS and ``<|im_end|>``), which
    makes the state terminal; so does a transcript that reaches ``max_seq_len``.
    """

    params: object
    config: TransformerConfig
    tokenizer: Tokenizer
    delimiters: tuple[str, ...] = ("\n",)
    max_step_tokens: int = 32
    stop_token_ids: tuple[int, ...] | None = None

    def __post_init__(self):
        self.delimiters = tuple(self.delimiters)
        if any(not isinstance(d, str) or not d for d in self.delimiters):
            raise ValueError(f"step delimiters must be non-empty strings, got {self.delimiters!r}")
        if self.max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1, got {self.max_step_tokens}")
        if self.stop_token_ids is None:
            ends = [self.tokenizer.eos_id, self._token(IM_END)]
            self.stop_token_ids = tuple(t for t in ends if t is not None)
        self.stop_token_ids = tuple(self.stop_token_ids)

    @classmethod
    def from_checkpoint(cls, path, **options) -> StepModel:
        """The model of a training workdir or a model directory with its tokenizer."""
        config, params, tokenizer = load_checkpoint(path)
        return cls(params, config, tokenizer, **options)

    def _token(self, token: str) -> int | None:
        try:
            return self.tokenizer.token_id(token)
        except KeyError:
            return None

    def text(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def answer(self, state: State, tag: str = "answer") -> str | None:
        """The ``<tag>...</tag>`` answer in the state's generated text, or None."""
        return answer_text(self.text(state.generated), tag)

    def expand(
        self,
        states: Sequence[State],
        k: int,
        *,
        key,
        temperature: float = 1.0,
        budget: Budget | None = None,
        context: Sequence[int] = (),
    ) -> list[list[State]]:
        """``k`` sampled next steps for each live state, from one ``generate`` call.

        Terminal states get no children.  With a ``budget`` only the candidates it can afford
        (at ``max_step_tokens`` each) are sampled, states in order; each sampled step is one
        model call and its kept tokens (up to and including the delimiter) are charged.
        ``context`` (token ids, e.g. a rendered message of LATS reflections) is put before every
        state's tokens to condition the sampling, and is part of no state.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        budget = Budget() if budget is None else budget
        context = tuple(int(t) for t in context)
        children: list[list[State]] = [[] for _ in states]
        live = [i for i, s in enumerate(states) if not s.done]
        if not live:
            return children
        room = self.config.max_seq_len - len(context) - max(len(states[i].tokens) for i in live)
        max_tokens = min(self.max_step_tokens, room)
        if max_tokens < 1:
            raise ValueError(
                f"a live state (with {len(context)} context tokens) already fills the model's "
                f"max_seq_len={self.config.max_seq_len}"
            )
        rows = [i for i in live for _ in range(k)][: budget.affordable(len(live) * k, max_tokens)]
        if not rows:
            return children
        sampling = SamplingParams(
            temperature=temperature,
            max_tokens=max_tokens,
            stop_token_ids=self.stop_token_ids,
            stop_strings=self.delimiters,
        )
        pad_id = self.tokenizer.pad_id or 0
        # Equal prompts (a state's k candidates, copies of one root) share one prefill.
        unique: dict[tuple[int, ...], int] = {}
        fork = [unique.setdefault(context + states[i].tokens, len(unique)) for i in rows]
        prompts = list(unique)
        check_token_ids(prompts, self.config.vocab_size)
        # Pad prompts to a multiple of PAD_MULTIPLE so that a growing tree reuses a few
        # compilations, and both batches to powers of two (the extra rows are dropped below).
        longest = max(len(p) for p in prompts)
        width = min(
            -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE, self.config.max_seq_len - max_tokens
        )
        padded = prompts + [prompts[0]] * ((1 << (len(prompts) - 1).bit_length()) - len(prompts))
        result = generate(
            self.params,
            self.config,
            PromptBatch.from_lists(padded, pad_id=pad_id, length=max(width, longest)),
            sampling=sampling,
            key=key,
            pad_id=pad_id,
            fork=np.asarray(fork + [0] * ((1 << (len(fork) - 1).bit_length()) - len(fork))),
        )
        result = truncate_at_stop_strings(result, self.tokenizer, sampling, pad_id)
        tokens = np.asarray(result.tokens)[: len(rows)]
        lengths = np.asarray(result.lengths)[: len(rows)]
        logprobs = np.asarray(result.raw_logprobs)[: len(rows)].sum(axis=1)
        budget.charge(len(rows), int(lengths.sum()), sum(map(len, prompts)))
        for row, i in enumerate(rows):
            step = tuple(int(t) for t in tokens[row, : lengths[row]])
            parent = states[i]
            transcript = parent.tokens + step
            ended = bool(step) and step[-1] in self.stop_token_ids
            children[i].append(
                State(
                    transcript,
                    parent.prompt_length,
                    parent.steps + (step,),
                    parent.logprob + float(logprobs[row]),
                    ended or len(transcript) >= self.config.max_seq_len,
                )
            )
        return children

    def complete(
        self,
        states: Sequence[State],
        *,
        key,
        temperature: float = 1.0,
        max_steps: int = 16,
        budget: Budget | None = None,
    ) -> list[State]:
        """Each state extended step by step (one batched call per step) until it is terminal,
        has ``max_steps`` more steps, or the budget is spent."""
        states = list(states)
        for depth in range(max_steps):
            children = self.expand(
                states,
                1,
                key=jax.random.fold_in(key, depth),
                temperature=temperature,
                budget=budget,
            )
            if not any(children):
                break
            states = [c[0] if c else s for s, c in zip(states, children)]
        return states
