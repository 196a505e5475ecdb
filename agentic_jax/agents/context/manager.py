"""Context management: fitting a growing agent run into a fixed token window.

The window is split between the system prompt, retrieved context, the conversation history and
the reply (:class:`ContextBudget`).  History takes what the system prompt and retrieval leave, so
unused shares are not wasted.  Three mechanisms keep history inside it:

1. **Truncation of long tool outputs** (head and tail kept, the middle replaced by a marker):
   one verbose tool must not push everything else out.
2. **Summarisation of old turns** once the prompt passes ``compact_at`` (75%) of the window: all
   but the most recent turns become a summary, written by a ``Summarizer`` (an extractive one by
   default, or the policy itself, :func:`policy_summarizer`).
3. **Model-invoked compaction** (:func:`compaction_tool`), as in self-compacting agents: the model
   itself replaces the turns so far with its own summary, which it writes best right after a
   sub-task is resolved, and worst in the middle of a derivation whose intermediate values it
   still needs.  The tool states that rubric, and refuses unless the model asserts the sub-task
   is resolved.

Facts *pinned* as must-keep (:meth:`ContextManager.pin`, or the compaction tool's ``keep``) are
repeated verbatim in the system message after every compaction; summaries may lose anything else.
If even the pinned facts and the newest message cannot fit, the newest message is truncated: the
prompt never exceeds the window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import gin

from agentic_jax.agents.context.tokens import TokenCounter, approx_tokens, messages_tokens
from agentic_jax.agents.policies.base import Policy
from agentic_jax.agents.tools.base import Tool, ToolError, tool
from agentic_jax.data.chat import Message

Summarizer = Callable[[Sequence[Message], str | None], str]


class ContextOverflow(ValueError):
    """The system prompt and pinned facts alone do not fit the window."""


@gin.configurable(module="agents")
@dataclasses.dataclass(frozen=True)
class ContextBudget:
    """Token shares of ``window``: ``system``, ``retrieved`` and ``generation`` (kept free for the
    reply) are fractions; history gets the rest.  ``max_tool_output`` caps one tool output,
    ``keep_recent`` messages are never summarised."""

    window: int = 4096
    system: float = 0.15
    retrieved: float = 0.25
    generation: float = 0.2
    compact_at: float = 0.75
    max_tool_output: int = 512
    keep_recent: int = 4

    def __post_init__(self):
        if self.system + self.retrieved + self.generation >= 1:
            raise ValueError("system + retrieved + generation shares must leave room for history")

    def tokens(self, share: float) -> int:
        return int(self.window * share)


def truncate(text: str, max_tokens: int, count: TokenCounter = approx_tokens) -> str:
    """``text`` cut to at most ``max_tokens``, keeping its head and tail around a marker."""
    if count(text) <= max_tokens:
        return text
    keep = len(text) * max_tokens // max(count(text), 1)
    while keep > 0:
        cut = len(text) - keep
        head, tail = text[: keep // 2], text[len(text) - keep // 2 :]
        marked = f"{head}\n[... {cut} characters cut ...]\n{tail}"
        if count(marked) <= max_tokens:
            return marked
        keep = keep * 3 // 4
    marker = "[... cut ...]"
    return marker if count(marker) <= max_tokens else ""


def extractive_summary(messages: Sequence[Message], previous: str | None) -> str:
    """One short line per message (what was asked, called, returned and said)."""

    def brief(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= 160 else text[:157] + "..."

    lines = [previous] if previous else []
    for m in messages:
        calls = "; ".join(f"called {c.name}({c.arguments})" for c in m.tool_calls)
        lines.append(f"{m.role}: " + " ".join(p for p in (brief(m.content), calls) if p))
    return "\n".join(lines)


def policy_summarizer(policy: Policy, max_tokens: int = 256) -> Summarizer:
    """A summariser that asks ``policy`` for the summary (abstractive, like a human would)."""

    def summarize(messages: Sequence[Message], previous: str | None) -> str:
        transcript = extractive_summary(messages, previous)
        reply = policy.respond(
            [
                Message(
                    "system",
                    "Summarise this agent transcript for your future self: keep goals, "
                    "decisions, numbers and results; drop chatter. Be brief.",
                ),
                Message("user", transcript),
            ],
            max_tokens=max_tokens,
            temperature=0.0,
        )
        return reply.text.strip() or transcript

    return summarize


class ContextManager:
    """Builds each prompt from the system prompt, retrieved text and history within the budget."""

    def __init__(
        self,
        budget: ContextBudget = ContextBudget(),
        count: TokenCounter = approx_tokens,
        summarize: Summarizer = extractive_summary,
    ):
        self.budget, self.count, self.summarize = budget, count, summarize
        self.pinned: list[str] = []
        self.summary: str | None = None
        self.offset = 0  # history before this index lives in the summary
        self._requested: tuple[str, list[str]] | None = None
        self.compactions = 0

    def new_history(self) -> None:
        """Starts over on a new conversation (a plan's next step, a new attempt): the summary
        goes, the pinned facts stay."""
        self.summary, self.offset, self._requested = None, 0, None

    def pin(self, *facts: str) -> None:
        """Marks facts as must-keep: they survive every compaction verbatim."""
        self.pinned += [f for f in facts if f not in self.pinned]

    def request_compaction(self, summary: str, keep: Sequence[str] = ()) -> None:
        """The model's own compaction; applied at the next :meth:`build`."""
        self._requested = summary, list(keep)

    def _memory(self, system: str) -> str:
        parts = [system]
        if self.summary:
            parts.append("# Summary of earlier turns\n" + self.summary)
        if self.pinned:
            parts.append("# Facts to keep\n" + "\n".join(f"- {f}" for f in self.pinned))
        return "\n\n".join(p for p in parts if p)

    def _safe_cut(self, history: Sequence[Message], index: int) -> int:
        """A cut that orphans no tool result: moved back to the assistant turn whose calls the
        results answer, or, if that would not advance past ``offset``, forward past them."""
        index = min(max(index, self.offset), len(history))
        back = index
        while self.offset < back < len(history) and history[back].role == "tool":
            back -= 1
        if back > self.offset and (back == len(history) or history[back].role != "tool"):
            return back
        while index < len(history) and history[index].role == "tool":
            index += 1
        return index

    def _fold(self, history: Sequence[Message], upto: int) -> bool:
        """Summarises ``history[offset:upto]``, cut safely; whether anything was folded.  The
        newest message, and with it the call it answers, is never folded: that would leave a
        prompt of the system message alone, the result the model just got reduced to a line
        of summary (:meth:`build` truncates it instead)."""
        upto = self._safe_cut(history, min(upto, len(history) - 1))
        if not self.offset < upto < len(history):
            return False
        self.summary = self.summarize(history[self.offset : upto], self.summary)
        self.offset = upto
        self.compactions += 1
        return True

    def _visible(self, history: Sequence[Message]) -> list[Message]:
        cap = self.budget.max_tool_output
        return [
            dataclasses.replace(m, content=truncate(m.content, cap, self.count))
            if m.role == "tool"
            else m
            for m in history[self.offset :]
        ]

    def build(
        self,
        system: str,
        history: Sequence[Message],
        retrieved: Sequence[str] = (),
        reserved: int = 0,
    ) -> list[Message]:
        """The prompt for the next model call.  Its token count (``messages_tokens`` with this
        manager's counter) plus ``reserved`` (e.g. the tool schemas a backend adds) never exceeds
        ``window`` minus the generation share; :class:`ContextOverflow` if that is impossible."""
        b, count = self.budget, self.count
        if self._requested is not None:  # the model compacted: fold everything it has seen
            summary, keep = self._requested
            self._requested = None
            self.offset = self._safe_cut(history, len(history))
            self.summary = summary
            self.pin(*keep)
            self.compactions += 1
        available = b.window - b.tokens(b.generation) - reserved
        system = truncate(system, b.tokens(b.system), count)
        docs, room = [], b.tokens(b.retrieved)
        for doc in retrieved:
            piece = truncate(doc, room - 4, count) if room > 4 else ""
            if not piece:
                break
            docs.append(piece)
            room -= count(piece) + 4
        if docs:
            system += "\n\n# Retrieved context\n" + "\n\n".join(docs)

        def prompt() -> list[Message]:
            return [Message("system", self._memory(system)), *self._visible(history)]

        if messages_tokens(prompt(), count) > b.compact_at * available:
            self._fold(history, len(history) - b.keep_recent)
        while messages_tokens(prompt(), count) > available and self._fold(
            history, self.offset + max(1, (len(history) - self.offset) // 2)
        ):
            pass
        messages = prompt()
        over = messages_tokens(messages, count) - available
        if over > 0 and self.summary:  # the summary itself grew too long
            self.summary = truncate(self.summary, max(count(self.summary) - over - 4, 0), count)
            messages = prompt()
            over = messages_tokens(messages, count) - available
        # Huge newest messages (one, or a call with its results): cut their text, newest first.
        for i in range(len(messages) - 1, 0, -1):
            if over <= 0:
                break
            text = messages[i].content
            messages[i] = dataclasses.replace(
                messages[i], content=truncate(text, max(count(text) - over - 4, 0), count)
            )
            over = messages_tokens(messages, count) - available
        if over > 0:
            raise ContextOverflow(
                f"the prompt needs {over + available} tokens; the window leaves {available}"
            )
        return messages


def compaction_tool(context: ContextManager) -> Tool:
    """The ``compact_context`` tool: the model replaces the turns so far with its own summary."""

    def compact_context(summary: str, subtask_resolved: bool, keep: list[str] | None = None) -> str:
        """Replace the conversation so far with your summary, freeing context for what comes next.
        Compact right after a sub-task is resolved (its result is known and its details are no
        longer needed). Do NOT compact in the middle of a derivation or calculation whose
        intermediate values you still need, or just to tidy up.

        Args:
            summary: what you need to continue: the goal, decisions made and results so far.
            subtask_resolved: true only if the sub-task you are summarising is finished.
            keep: facts that must survive verbatim (numbers, names, constraints).
        """
        if not subtask_resolved:
            raise ToolError(
                "not compacted: compact only once a sub-task is resolved; keep "
                "working and compact when it is done"
            )
        context.request_compaction(summary, keep or ())
        return "compacted: earlier turns are replaced by your summary"

    return tool(compact_context, timeout_s=None)
