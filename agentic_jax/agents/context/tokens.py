"""Counting tokens for budgets when the exact tokenizer may be unknown.

Budgets (context windows, token and cost limits) need a count before a policy sees the text.  With
the model's tokenizer the count is exact; for a remote model the usual estimate of four characters
per token errs on the safe side for English and code.  Each message also pays for its role header
and end marker, and an assistant turn for its tool calls' JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable

from agentic_jax.data.chat import Message
from agentic_jax.data.tokenizer import Tokenizer

TokenCounter = Callable[[str], int]
MESSAGE_OVERHEAD = 4  # <|im_start|>, the role, its newline and <|im_end|>


def approx_tokens(text: str) -> int:
    """About one token per four characters (never 0 for non-empty text)."""
    return math.ceil(len(text) / 4)


def tokenizer_counter(tokenizer: Tokenizer) -> TokenCounter:
    """The exact count under ``tokenizer``."""
    return lambda text: len(tokenizer.encode(text))


def message_tokens(message: Message, count: TokenCounter = approx_tokens) -> int:
    calls = sum(
        count(json.dumps({"name": c.name, "arguments": c.arguments})) + 2
        for c in message.tool_calls
    )
    return MESSAGE_OVERHEAD + count(message.content) + calls


def messages_tokens(messages: Iterable[Message], count: TokenCounter = approx_tokens) -> int:
    return sum(message_tokens(m, count) for m in messages)
