"""The token ids a `TextEnv` reads and writes around the policy's turns, in a model's own chat
template and tool-call format (`data.chat_template`, `data.tool_formats`).

A jitted environment cannot render a template: it finds a call between two marker tokens and
writes a tool message as fixed token sequences around the result's ids.  `ChatMarkers` derives
them from the template itself: it renders a conversation whose tool result is a placeholder and
cuts the text around it, so the tool message is exactly what the template renders::

    ... </tool_call><|im_end|>  |  head  |  result  |  tail (ends with the generation prompt)

With this project's tokenizer and template that is today's ``\\n<|im_start|>tool\\n
<tool_result>\\n`` / ``\\n</tool_result><|im_end|>\\n<|im_start|>assistant\\n``; with a
Qwen2.5-style template it is ``\\n<|im_start|>user\\n<tool_response>\\n`` /
``\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from agentic_jax.data.chat import Message, MessageLike, split_tools
from agentic_jax.data.chat_template import ChatTemplate, chat_template, template_tool_format
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.data.tool_formats import ToolCall, ToolCallFormat, tool_call_format

PLACEHOLDER = "TOOL-RESULT-PLACEHOLDER"


def _marker_id(tokenizer: Tokenizer, marker: str, fmt: ToolCallFormat) -> int:
    token_id = tokenizer.added_ids.get(marker) if marker else None
    if token_id is None or tokenizer.encode(marker) != [token_id]:
        raise ValueError(
            f"the {fmt.name!r} tool-call format's marker {marker!r} is not a single token of this "
            "tokenizer; a text environment finds calls between two marker tokens"
        )
    return token_id


def _observation_text(template: ChatTemplate, tokenizer: Tokenizer) -> tuple[str, str, str]:
    """(the token text ending an assistant turn, the text from there to a tool result, the text
    after the result up to the next assistant turn), cut from the template's own rendering."""
    call = Message("assistant", "", (ToolCall("tool", {"argument": "x"}),))
    turn = template.render([Message("user", "?"), call]).rstrip()
    full = template.render(
        [Message("user", "?"), call, Message("tool", PLACEHOLDER)], add_generation_prompt=True
    )
    ends = [t for t in tokenizer.added_ids if turn.endswith(t)]
    if not ends or not full.startswith(turn) or full.count(PLACEHOLDER) != 1:
        raise ValueError(
            "the chat template does not end an assistant turn with a token of its own and "
            "render the tool result after it; a text environment cannot write its tool messages"
        )
    before, _, after = full[len(turn) :].partition(PLACEHOLDER)
    return max(ends, key=len), before, after


@dataclasses.dataclass(frozen=True)
class ChatMarkers:
    """What a `TextEnv` needs of a chat template and tool-call format: the call's ``open``/
    ``close`` token ids (-1 for an env without tools), the id ending an assistant turn, the ids
    that stop a turn (it and EOS), and the ids ``head`` / ``tail`` around a tool result."""

    template: ChatTemplate
    tool_format: ToolCallFormat
    open_id: int
    close_id: int
    end_of_turn_id: int
    stop_ids: tuple[int, ...]
    head: tuple[int, ...]
    tail: tuple[int, ...]

    @classmethod
    def build(
        cls,
        tokenizer: Tokenizer,
        template: ChatTemplate | None = None,
        tool_format: ToolCallFormat | str | None = None,
        calls: bool = True,
    ) -> ChatMarkers:
        """The markers of ``template`` (default ``chat_template(tokenizer)``, gin) and
        ``tool_format`` (default: the template's); ``calls=False`` for an env without tools,
        whose model need not have single-token call markers."""
        template = chat_template(tokenizer) if template is None else template
        if isinstance(tool_format, str):
            tool_format = tool_call_format(tool_format)
        elif tool_format is None:
            tool_format = template_tool_format(template)
        end, head, tail = _observation_text(template, tokenizer)
        end_id = tokenizer.added_ids[end]
        open_id, close_id = (
            (_marker_id(tokenizer, m, tool_format) for m in (tool_format.open, tool_format.close))
            if calls
            else (-1, -1)
        )
        stops = (end_id, tokenizer.eos_id)
        return cls(
            template,
            tool_format,
            open_id,
            close_id,
            end_id,
            tuple(dict.fromkeys(i for i in stops if i is not None)),
            tuple(tokenizer.encode(head)),
            tuple(tokenizer.encode(tail)),
        )

    def prompt_ids(self, messages: Sequence[MessageLike], tokenizer: Tokenizer) -> np.ndarray:
        """Ids of a task's opening ``messages`` and the generation prompt, through the template;
        a tool section ``chat.with_tools`` wrote into the system message goes to the template
        as its ``tools``."""
        messages, specs = split_tools(messages)
        ids = self.template.encode(messages, tokenizer, specs or None, add_generation_prompt=True)
        return np.asarray(ids, np.int32)


def tool_message_template(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """Token ids around a tool message's content in ``chat_template(tokenizer)`` and the reply
    prompt after it (with this project's tokenizer, as ``chat.render_ids`` spells them)."""
    markers = ChatMarkers.build(tokenizer, calls=False)
    return list(markers.head), list(markers.tail)
