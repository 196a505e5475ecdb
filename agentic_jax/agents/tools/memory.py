"""Memory as tools the agent calls: MemGPT's paging between the context window and a store.

MemGPT (Packer, Wooders, Lin, Fang, Patil, Stoica & Gonzalez 2023, *MemGPT: Towards LLMs as
Operating Systems*, arXiv:2310.08560) treats the context window as main memory and a database
as disk, and lets the model move information between them by function calls, as an operating
system pages between RAM and disk.  Its main context holds a *core memory* block (what the agent
must always see: who the user is, the task's standing facts), editable by
``core_memory_append`` and ``core_memory_replace`` and bounded in size, because every character
of it is paid in every prompt; everything else lives in external storage that the model
searches and inserts into.  Here:

* **core memory** is the pinned facts of the agent's :class:`~agentic_jax.agents.context.
  manager.ContextManager` (seen through :class:`~agentic_jax.memory.working.WorkingMemory`):
  repeated verbatim in the system message of every prompt and kept by every compaction, at
  most ``core_limit`` characters in all (MemGPT's limits are in characters too); a change that
  would pass the limit is refused with a :class:`~agentic_jax.agents.tools.base.ToolError`
  that says how full the block is and how to make room;
* **external memory** is a :class:`~agentic_jax.memory.store.MemoryStore` (or a shared space's
  :class:`~agentic_jax.memory.permissions.AgentStore`, every call checked and audited), written
  through the write policy (redaction, importance, near-duplicates) and read through the read
  policy (relevance, recency, importance within a token budget);
* **paging**: ``page_out`` moves a core-memory entry to the store (written by the write policy,
  so paging out what is already stored finds the stored record instead of copying it) and frees
  its room; ``page_in`` brings a stored memory into core memory; ``memory_search``,
  ``memory_insert`` and ``memory_update`` work on the store without touching core memory.
  ``memory_update`` does not overwrite: the old memory is invalidated (it stays in the store's
  history, bi-temporally) and the corrected one written with a link to it.

The model names stored memories by short handles (``m1``, ``m2``, ... in the order this
toolkit first shows them), not 32-character ids it would have to copy exactly; a full id works
too.  The user whose memories these are, and in a shared space the agent's identity, come from
the configuration (:class:`MemoryConfig`), never from the model's arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

import gin
import pydantic

from agentic_jax.agents.context.manager import ContextManager
from agentic_jax.agents.tools.base import Tool, ToolError, tool
from agentic_jax.memory.embed import HashingEmbedder
from agentic_jax.memory.permissions import AgentStore, PermissionDenied, SharedSpace
from agentic_jax.memory.read import MemoryReader
from agentic_jax.memory.records import MemoryRecord, new_id
from agentic_jax.memory.store import MemoryStore
from agentic_jax.memory.working import WorkingMemory
from agentic_jax.memory.write import MemoryWriter

MEMORY_TOOLS = (
    "memory_search",
    "memory_insert",
    "memory_update",
    "core_memory_append",
    "core_memory_replace",
    "page_in",
    "page_out",
)
MAX_K = 20
# The first search imports JAX and compiles the top-k; later calls take milliseconds.
TIMEOUT_S = 120.0
Text = Annotated[str, pydantic.Field(min_length=1)]


def _refusals_as_tool_errors(fn: Callable[..., str]) -> Callable[..., str]:
    """``fn`` with a denied permission turned into a refusal the model reads."""

    def call(**arguments) -> str:
        try:
            return fn(**arguments)
        except PermissionDenied as e:
            raise ToolError(str(e)) from None

    return call


class MemoryTools:
    """The memory tools of one agent (module docstring): ``store`` (a store or a shared space's
    agent view) written by ``writer`` and read by ``reader`` for ``user``; core memory in
    ``context``'s pinned facts, at most ``core_limit`` characters."""

    def __init__(
        self,
        store: MemoryStore | AgentStore,
        writer: MemoryWriter,
        reader: MemoryReader,
        context: ContextManager,
        *,
        user: str,
        core_limit: int = 2000,
    ):
        if core_limit < 1:
            raise ValueError(f"core_limit must be positive, got {core_limit}")
        self.store, self.writer, self.reader, self.context = store, writer, reader, context
        self.working = WorkingMemory(context, user=user)
        self.user, self.core_limit = user, core_limit
        self._ids: dict[str, str] = {}  # handle -> record id
        self._handles: dict[str, str] = {}  # record id -> handle

    # Handles and core memory.

    def handle(self, id: str) -> str:
        """The short name the model sees for record ``id``."""
        if id not in self._handles:
            self._handles[id] = f"m{len(self._handles) + 1}"
            self._ids[self._handles[id]] = id
        return self._handles[id]

    def _record(self, name: str) -> MemoryRecord:
        record = self.store.get(self._ids.get(name, name))
        if record is None or record.user != self.user:
            raise ToolError(f"no stored memory {name!r}; memory_search shows their ids")
        return record

    def usage(self) -> str:
        used = sum(map(len, self.context.pinned))
        return f"core memory holds {used} of {self.core_limit} characters"

    def _make_room(self, extra: int) -> None:
        used = sum(map(len, self.context.pinned))
        if used + extra > self.core_limit:
            raise ToolError(
                f"core memory is full: it holds {used} of {self.core_limit} characters and this "
                f"needs {extra} more; page_out an entry or shorten one with core_memory_replace "
                f"first"
            )

    def _entry(self, text: str) -> int:
        """The index of the one core-memory entry containing ``text``."""
        found = [i for i, fact in enumerate(self.context.pinned) if text in fact]
        if len(found) != 1:
            problem = "no entry contains" if not found else f"{len(found)} entries contain"
            raise ToolError(f"core memory: {problem} {text!r}; quote the entry you mean exactly")
        return found[0]

    # The tools.

    def memory_search(
        self, query: Text, k: Annotated[int, pydantic.Field(ge=1, le=MAX_K)] = 5
    ) -> str:
        """Search your long-term memory (outside the context) for memories about a query; shows
        each with its id, best first.

        Args:
            query: what to look for, in words.
            k: how many memories to show at most.
        """
        recalls = self.reader.read(query, user=self.user)[:k]
        if not recalls:
            return f"no memory matches {query!r}"
        return "\n".join(
            f"[{self.handle(r.record.id)}] ({r.record.type}) {r.record.text}" for r in recalls
        )

    def memory_insert(self, text: Text, type: Literal["semantic", "episodic"] = "semantic") -> str:
        """Store a memory in long-term memory (it does not enter the context): a fact to keep
        (semantic) or an event that happened (episodic).

        Args:
            text: the memory, self-contained (who, what, when).
            type: semantic for a fact, episodic for an event.
        """
        event = {"event_time": self.store.clock()} if type == "episodic" else {}
        result = self.writer.write(
            MemoryRecord(text=text, user=self.user, type=type, source="memory_insert", **event)
        )
        if result.action == "added":
            return f"stored as {self.handle(result.id)}"
        return f"already stored as {self.handle(result.id)} ({result.action})"

    def memory_update(self, id: str, text: Text) -> str:
        """Correct a stored memory: the old version stops holding (it stays in the history)
        and the new text replaces it.

        Args:
            id: the memory's id as memory_search shows it (m1, m2, ...).
            text: the corrected memory, in full.
        """
        old = self._record(id)
        now = self.store.clock()
        with self.store.transaction():
            self.store.invalidate(old.id, now)
            result = self.writer.write(
                dataclasses.replace(
                    old,
                    id=new_id(),
                    text=text,
                    embedding=None,
                    importance=None,
                    created_at=None,
                    accessed_at=None,
                    source="memory_update",
                    links=(*old.links, old.id),
                    valid_from=now,
                    valid_to=None,
                    expired_at=None,
                )
            )
        return f"updated: {id} no longer holds; the memory is now {self.handle(result.id)}"

    def core_memory_append(self, text: Text) -> str:
        """Add an entry to your core memory, the block shown in every prompt; it is small, so
        keep only what you need at every step.

        Args:
            text: the entry to add.
        """
        if text in self.context.pinned:
            return f"already in core memory; {self.usage()}"
        self._make_room(len(text))
        self.context.pin(text)
        return f"appended; {self.usage()}"

    def core_memory_replace(self, old: Text, new: Text) -> str:
        """Replace text in one core-memory entry (to correct or shorten it).

        Args:
            old: text of the entry to change, quoted exactly.
            new: the text that replaces it.
        """
        i = self._entry(old)
        entry = self.context.pinned[i]
        changed = entry.replace(old, new)
        self._make_room(len(changed) - len(entry))
        self.context.pinned[i] = changed
        return f"replaced; {self.usage()}"

    def page_out(self, text: Text) -> str:
        """Move a core-memory entry to long-term memory, freeing its room in the context; bring
        it back later with page_in.

        Args:
            text: text of the core-memory entry to move out, quoted exactly.
        """
        i = self._entry(text)
        entry = self.context.pinned[i]
        result = self.writer.write(MemoryRecord(text=entry, user=self.user, source="page_out"))
        del self.context.pinned[i]
        return f"paged out as {self.handle(result.id)}; {self.usage()}"

    def page_in(self, id: str) -> str:
        """Bring a stored memory into core memory, where every later prompt shows it.

        Args:
            id: the memory's id as memory_search shows it (m1, m2, ...).
        """
        record = self._record(id)
        if record.text in self.context.pinned:
            return f"{id} is already in core memory; {self.usage()}"
        self._make_room(len(record.text))
        self.working.hold([record])
        self.store.touch([record.id])
        return f"paged in {self.handle(record.id)}: {record.text}; {self.usage()}"

    def tools(self, names: Sequence[str] = MEMORY_TOOLS) -> list[Tool]:
        """The tools called ``names``, in that order."""
        unknown = sorted(set(names) - set(MEMORY_TOOLS))
        if unknown:
            raise KeyError(f"unknown memory tools {unknown}; memory tools: {list(MEMORY_TOOLS)}")
        made = []
        for name in names:
            described = tool(getattr(self, name), timeout_s=TIMEOUT_S)
            if name == "core_memory_append":
                described = dataclasses.replace(
                    described,
                    description=f"{described.description} At most {self.core_limit} "
                    f"characters in all.",
                )
            made.append(dataclasses.replace(described, fn=_refusals_as_tool_errors(described.fn)))
        return made


@dataclasses.dataclass
class AgentMemory:
    """An opened :class:`MemoryConfig`: the store file, what the agent may reach of it
    (``view``: the store, or its view as the configured agent of a shared space), and the
    policies over it."""

    config: MemoryConfig
    store: MemoryStore
    view: MemoryStore | AgentStore
    writer: MemoryWriter
    reader: MemoryReader

    def tools(self, context: ContextManager) -> list[Tool]:
        """The configured tools, with core memory in ``context`` (given the configured initial
        entries)."""
        context.pin(*self.config.core)
        return MemoryTools(
            self.view,
            self.writer,
            self.reader,
            context,
            user=self.config.user,
            core_limit=self.config.core_limit,
        ).tools(self.config.tools)

    def close(self) -> None:
        self.store.close()


@gin.configurable(module="agents")
@dataclasses.dataclass
class MemoryConfig:
    """An agent's memory, from gin (``agents.AgentConfig.memory = @agents.MemoryConfig()``).

    The store is ``<root>/<space>.db`` (its other settings from ``memory.MemoryStore.*``
    bindings); the memories are ``user``'s.  ``agent`` names the agent in a shared space: its
    calls are then checked against the space's access list (``acl``, agent to level, founds the
    list of a new space) and audited (``memory.permissions``); ``None`` uses the store directly.
    ``embed`` maps texts to vectors (default: feature hashing, no model); ``writer`` and
    ``reader`` are built as ``writer(view, embed)`` and ``reader(view, embed)`` (their settings
    from ``memory.MemoryWriter.*`` and ``memory.MemoryReader.*``).  ``tools`` are memory tool
    names (:data:`MEMORY_TOOLS`); ``core`` are core memory's initial entries (MemGPT's persona
    and user blocks), at most ``core_limit`` characters with what the agent adds."""

    root: str = "runs/memory"
    space: str = "default"
    user: str = "user"
    agent: str | None = None
    acl: Mapping[str, str] | None = None
    embed: Callable[[list[str]], Any] = dataclasses.field(default_factory=HashingEmbedder)
    writer: Callable[..., MemoryWriter] = MemoryWriter
    reader: Callable[..., MemoryReader] = MemoryReader
    tools: Sequence[str] = MEMORY_TOOLS
    core: Sequence[str] = ()
    core_limit: int = 2000

    def open(self) -> AgentMemory:
        store = MemoryStore(self.root, self.space)
        if self.agent is None:
            if self.acl is not None:
                raise ValueError("an access list needs the agent's name (MemoryConfig.agent)")
            view = store
        else:
            view = SharedSpace(store, self.acl).agent(self.agent)
        return AgentMemory(
            self, store, view, self.writer(view, self.embed), self.reader(view, self.embed)
        )
