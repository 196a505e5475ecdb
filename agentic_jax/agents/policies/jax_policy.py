"""A policy backed by an agentic-jax checkpoint, run in-process through the serving engine.

Messages are rendered with the ChatML template (``data/chat.py``) with the tools described in the
system message; tool calls are decoded under a JSON-schema constraint so that they always parse
and fit the tool's schema (see ``chat_model.py``).  Several agent loops may share one
:class:`JaxPolicy` from different threads: their requests are batched by one engine.
"""

from __future__ import annotations

import gin

from agentic_jax.agents.policies.base import AssistantMessage, PolicyError, Usage
from agentic_jax.agents.tools.base import tool_specs
from agentic_jax.inference.serving.chat_model import ChatModel, sampling_params
from agentic_jax.inference.serving.engine import EngineConfig


@gin.configurable(module="agents")
class JaxPolicy:
    """``checkpoint``: a training workdir or a native model directory with a tokenizer (or pass
    a loaded ``model``).  ``defaults`` are sampling keywords every call starts from."""

    def __init__(
        self,
        checkpoint: str | None = None,
        *,
        model: ChatModel | None = None,
        engine_config: EngineConfig | None = None,
        max_tool_call_tokens: int = 256,
        defaults: dict | None = None,
    ):
        if (checkpoint is None) == (model is None):
            raise ValueError("give JaxPolicy exactly one of checkpoint and model")
        self.model = model or ChatModel.from_checkpoint(
            checkpoint, engine_config, max_tool_call_tokens=max_tool_call_tokens
        )
        self.defaults = {"temperature": 0.0, "max_tokens": 256, **(defaults or {})}

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        options = {**self.defaults, **{k: v for k, v in sampling.items() if v is not None}}
        specs = tool_specs(tools)
        # A tool_choice with no tools left to choose from (all cut off) means no call, as in
        # HTTPPolicy, rather than a request error that would end the run.
        tool_choice = options.pop("tool_choice", "auto")
        if not specs:
            tool_choice = "auto"
        try:
            g = self.model.chat(
                messages, specs, tool_choice=tool_choice, params=sampling_params(**options)
            )
        except ValueError as e:  # e.g. the prompt does not fit the model's max_seq_len
            raise PolicyError(str(e)) from e
        return AssistantMessage(
            g.text, g.tool_calls, Usage(g.prompt_tokens, g.completion_tokens), g.finish_reason
        )

    def close(self) -> None:
        self.model.close()
