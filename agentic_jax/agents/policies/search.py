"""A policy whose every turn is the result of a test-time search over the turn's steps.

The harness runs the tools between turns, so the search runs inside one turn: its steps are
segments of the turn (``StepModel.delimiters``: lines, the end of a tool call), valued by a
scorer (a process reward model through ``reasoning.token_scorer``), and the best state that
``search`` finds becomes the turn, its tool calls parsed from the text.  ``search`` is any
function with ``reasoning.step_beam_search``'s signature: step beam search, DVTS
(``subtrees=N, width=1``), Tree-of-Thoughts (``reasoning.depth_first_search``) or MCTS
(``reasoning.tree_search``), with its options bound by gin or ``functools.partial``.  The
turn's usage is everything the search prefilled and sampled, so a token budget charges what
the search cost, not the length of the turn it kept.
"""

from __future__ import annotations

import itertools

import gin
import jax

from agentic_jax.agents.policies.base import AssistantMessage, PolicyError, Usage
from agentic_jax.agents.tools.base import tool_specs
from agentic_jax.data.chat import parse_assistant, render_ids, with_tools
from agentic_jax.reasoning import Budget, StepModel, step_beam_search
from agentic_jax.reasoning.search import Scorer


@gin.configurable(module="agents")
class SearchPolicy:
    """Turns chosen by ``search(model, prompt, score, key=..., budget=...)`` under a budget of
    ``tokens`` sampled tokens per turn.  ``model`` is a ``StepModel``, or a checkpoint path
    (a training workdir or model directory) to build one from with ``delimiters``.  A request's
    ``seed`` makes its turn reproducible; other sampling keywords are the search's own."""

    def __init__(
        self,
        model: StepModel | str,
        score: Scorer,
        search=step_beam_search,
        *,
        tokens: int | None = 1024,
        delimiters: tuple[str, ...] = ("\n",),
    ):
        if isinstance(model, str):
            model = StepModel.from_checkpoint(model, delimiters=delimiters)
        self.model, self.score, self.search, self.tokens = model, score, search, tokens
        self._seeds = itertools.count()
        Budget(tokens=tokens)  # checks the limit now, not at the first turn

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        tokenizer = self.model.tokenizer
        try:
            prompt = render_ids(
                with_tools(messages, tool_specs(tools)),
                tokenizer,
                add_generation_prompt=True,
                add_bos=tokenizer.bos_id is not None,
            ).ids.tolist()
        except ValueError as e:
            raise PolicyError(str(e)) from e
        if len(prompt) >= self.model.config.max_seq_len:
            raise PolicyError(
                f"the prompt has {len(prompt)} tokens; the model's max_seq_len is "
                f"{self.model.config.max_seq_len}"
            )
        seed = sampling.get("seed")
        key = jax.random.key(next(self._seeds) if seed is None else seed)
        budget = Budget(tokens=self.tokens)
        best = self.search(self.model, prompt, self.score, key=key, budget=budget).best
        if budget.tokens_spent == 0:
            raise PolicyError(
                f"the search sampled nothing: its budget of {self.tokens} tokens per turn "
                "does not pay for one expansion (width x expansions x the step's token limit)"
            )
        ends = set(self.model.stop_token_ids)
        turn = [t for t in best.generated if t not in ends]
        text = tokenizer.decode(turn, skip_special_tokens=False)
        try:
            message = parse_assistant(text)
        except ValueError as e:
            raise PolicyError(f"the searched turn does not parse: {e}") from e
        usage = Usage(budget.prompt_tokens_spent, budget.tokens_spent)
        finish = "tool_calls" if message.tool_calls else ("stop" if best.done else "length")
        return AssistantMessage(message.content, message.tool_calls, usage, finish)
