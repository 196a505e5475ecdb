"""Tasks: the host-side description a generator produces, and the fixed-shape bank a jitted env reads.

A `Task` is plain Python (chat messages, the reference answer, the tables
its tools consult, a correct and a corrupted demonstration).  `TaskBank`
packs many tasks into padded arrays with a leading task axis, so that the
environment's ``reset`` only samples an index: swapping the bank, or the
sampling weights a curriculum puts next to it, never changes a traced shape
as long as the sizes stay fixed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from flax import struct

from agentic_jax.data.chat import Message, RenderedIds, render_ids
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.text.chat_markers import ChatMarkers
from agentic_jax.envs.text.strings import Text, embed


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem: prompt messages, reference answer, tool data, demonstrations.

    ``demonstration`` continues ``prompt`` correctly (assistant and tool
    turns, ending with the final answer) and earns the full reward;
    ``corrupted`` is a plausible wrong continuation (a preference pair's
    rejected side).  ``value`` is the numeric goal of arithmetic-like tasks.
    """

    prompt: tuple[Message, ...]
    answer: str
    value: int = 0
    numbers: tuple[int, ...] = ()
    facts: tuple[tuple[str, str], ...] = ()
    documents: tuple[str, ...] = ()
    demonstration: tuple[Message, ...] = ()
    corrupted: tuple[Message, ...] = ()
    seed: int = 0
    difficulty: int = 0
    family: str = ""  # which verifier applies when a bank mixes task families (`rewards.ByFamily`)
    # The opening messages of each later session of an episode that spans sessions
    # (`memory.MemoryEnv`): the context is cleared before each, only the agent's memory carries over.
    sessions: tuple[tuple[Message, ...], ...] = ()

    @property
    def milestones(self) -> tuple[str, ...]:
        """The tool results a correct solution passes through, in order: the contents of the
        demonstration's tool messages (each calculator sub-result, each hop of a lookup chain).
        A turn whose tool result is one of them has made progress (`TurnRewards.milestone`)."""
        return tuple(m.content for m in self.demonstration if m.role == "tool")

    def conversation(self, correct: bool = True) -> tuple[Message, ...]:
        return self.prompt + (self.demonstration if correct else self.corrupted)

    def render(self, tokenizer: Tokenizer, correct: bool = True) -> RenderedIds:
        """Token ids and assistant (SFT loss) mask of the prompt plus a demonstration."""
        return render_ids(self.conversation(correct), tokenizer)

    def prompt_ids(self, tokenizer: Tokenizer, markers: ChatMarkers | None = None) -> np.ndarray:
        """The prompt's ids, through ``markers``' chat template when given (a model's own)."""
        return _opening_ids(self.prompt, tokenizer, markers)

    def session_ids(
        self, index: int, tokenizer: Tokenizer, markers: ChatMarkers | None = None
    ) -> np.ndarray:
        """The prompt ids of later session ``index`` (what the context holds when it opens)."""
        return _opening_ids(self.sessions[index], tokenizer, markers)


def _opening_ids(messages, tokenizer: Tokenizer, markers: ChatMarkers | None) -> np.ndarray:
    if markers is None:
        return render_ids(messages, tokenizer, add_generation_prompt=True).ids
    return markers.prompt_ids(messages, tokenizer)


def demonstration_actions(rendered: RenderedIds, action_length: int, pad_id: int = 0) -> np.ndarray:
    """The assistant turns of a rendered demonstration as env actions, ``int32 [turns, action_length]``.

    Each maximal run of assistant-mask tokens is one action (the policy's
    tokens of one turn); replaying them in a `TextEnv` reproduces the
    rendered ids and takes the assistant mask as its policy-loss mask.
    """
    mask = np.concatenate([[0], rendered.assistant_mask, [0]])
    starts, ends = np.flatnonzero(np.diff(mask) == 1), np.flatnonzero(np.diff(mask) == -1)
    actions = np.full((len(starts), action_length), pad_id, np.int32)
    for row, (start, end) in zip(actions, zip(starts, ends)):
        if end - start > action_length:
            raise ValueError(
                f"a demonstration turn has {end - start} tokens > action_length={action_length}"
            )
        row[: end - start] = rendered.ids[start:end]
    return actions


def demonstration_batch(
    tasks: Sequence[Task], tokenizer: Tokenizer, length: int, correct: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Supervised rows: ``ids`` and assistant ``mask``, int32 ``[len(tasks), length]``, right-padded with 0.

    ``correct=False`` renders the corrupted continuations, so the two calls
    give a preference batch (chosen, rejected) over the same prompts.
    """
    ids, mask = np.zeros((len(tasks), length), np.int32), np.zeros((len(tasks), length), np.int32)
    for row, task in enumerate(tasks):
        rendered = task.render(tokenizer, correct)
        if len(rendered.ids) > length:
            raise ValueError(f"a demonstration has {len(rendered.ids)} tokens > length={length}")
        ids[row, : len(rendered.ids)], mask[row, : len(rendered.ids)] = (
            rendered.ids,
            rendered.assistant_mask,
        )
    return ids, mask


@struct.dataclass
class Table:
    """Key -> value pairs per task (the lookup tool): keys as bytes, values as tokens."""

    keys: jax.Array  # uint8 [N, K, key_bytes]
    key_length: jax.Array  # int32 [N, K]; -1 marks an empty slot
    values: jax.Array  # int32 [N, K, value_tokens]
    value_length: jax.Array  # int32 [N, K]


@struct.dataclass
class Corpus:
    """Documents per task (the search tool): tokens and hashed n-gram embeddings."""

    tokens: jax.Array  # int32 [N, D, doc_tokens]
    length: jax.Array  # int32 [N, D]
    embedding: jax.Array  # float32 [N, D, dim]; zero rows for empty slots
    count: jax.Array  # int32 [N]


@struct.dataclass
class TaskBank:
    """``N`` tasks as padded arrays; index a row with ``bank.row(i)`` (jit-able)."""

    prompt: jax.Array  # int32 [N, prompt_tokens]
    prompt_length: jax.Array  # int32 [N]
    answer: jax.Array  # uint8 [N, answer_bytes]
    answer_length: jax.Array  # int32 [N]
    value: jax.Array  # int32 [N]
    numbers: jax.Array  # int32 [N, M]
    num_numbers: jax.Array  # int32 [N]
    family: jax.Array  # int32 [N]: index of the task's family in ``build_bank(families=...)``
    table: Table
    corpus: Corpus
    milestones: jax.Array  # int32 [N, M, milestone_tokens]: `Task.milestones`, tokenized
    milestone_length: jax.Array  # int32 [N, M]; -1 marks an empty slot
    sessions: jax.Array  # int32 [N, S, session_tokens]: `Task.sessions`' prompts, tokenized
    session_length: jax.Array  # int32 [N, S]; -1 marks an empty slot (a task with fewer sessions)

    @property
    def size(self) -> int:
        return self.prompt.shape[0]

    def row(self, index) -> TaskBank:
        return jax.tree.map(lambda x: x[index], self)


def _size(need: int, given: int | None, what: str) -> int:
    if given is None:
        return max(need, 1)
    if need > given:
        raise ValueError(f"{what} needs {need} > {given}")
    return given


def _pad(rows: Sequence[Sequence], width: int | None, dtype, what: str) -> np.ndarray:
    out = np.zeros((len(rows), _size(max(map(len, rows)), width, what)), dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _pad_groups(
    groups: Sequence[Sequence[Sequence]], slots: int | None, width: int | None, dtype, what: str
):
    """Pads lists of sequences to ``[N, slots, width]``; lengths ``[N, slots]`` are -1 on empty slots."""
    slots = _size(max(map(len, groups)), slots, f"{what} (entries)")
    width = _size(max((len(item) for g in groups for item in g), default=0), width, what)
    out = np.zeros((len(groups), slots, width), dtype)
    lengths = np.full((len(groups), slots), -1, np.int32)
    for i, g in enumerate(groups):
        for j, item in enumerate(g):
            out[i, j, : len(item)] = item
            lengths[i, j] = len(item)
    return out, lengths


def _embed_documents(tasks: Sequence[Task], shape: tuple[int, int], dim: int) -> np.ndarray:
    """`strings.embed` of every document, in one vmapped call (the same function the search tool runs)."""
    data, length = _pad_groups(
        [[list(d.encode()) for d in t.documents] for t in tasks],
        shape[1],
        None,
        np.uint8,
        "documents",
    )
    flat = jax.vmap(lambda d, n: embed(Text(d, n), dim))(
        data.reshape(-1, data.shape[-1]), length.reshape(-1)
    )
    return np.where(length[..., None] >= 0, np.asarray(flat).reshape(shape + (dim,)), 0.0).astype(
        np.float32
    )


def build_bank(
    tasks: Sequence[Task],
    tokenizer: Tokenizer,
    *,
    prompt_tokens: int | None = None,
    answer_bytes: int | None = None,
    max_numbers: int | None = None,
    max_facts: int | None = None,
    key_bytes: int | None = None,
    value_tokens: int | None = None,
    max_documents: int | None = None,
    doc_tokens: int | None = None,
    embedding_dim: int = 64,
    families: Sequence[str] = (),
    max_milestones: int | None = None,
    milestone_tokens: int | None = None,
    max_sessions: int | None = None,
    session_tokens: int | None = None,
    markers: ChatMarkers | None = None,
) -> TaskBank:
    """Packs ``tasks`` for a jitted env; each size defaults to the largest need (fix them to reuse a jit).

    ``families`` numbers the task families of a mixed bank (each task's
    ``family`` must be among them); without it every task is family 0.
    ``markers``: render the prompts through a model's own chat template (`ChatMarkers`).
    """
    if not tasks:
        raise ValueError("a task bank needs at least one task")
    unknown = {t.family for t in tasks} - set(families)
    if families and unknown:
        raise ValueError(f"task families {sorted(unknown)} are not among {list(families)}")
    prompts = [t.prompt_ids(tokenizer, markers) for t in tasks]
    answers = [list(t.answer.encode()) for t in tasks]
    keys, key_length = _pad_groups(
        [[list(k.encode()) for k, _ in t.facts] for t in tasks],
        max_facts,
        key_bytes,
        np.uint8,
        "fact keys",
    )
    # Fact values and documents are tool output: plain text, as the host env encodes it.
    values, value_length = _pad_groups(
        [[tokenizer.encode(v, special=False) for _, v in t.facts] for t in tasks],
        max_facts,
        value_tokens,
        np.int32,
        "fact values",
    )
    docs, doc_length = _pad_groups(
        [[tokenizer.encode(d, special=False) for d in t.documents] for t in tasks],
        max_documents,
        doc_tokens,
        np.int32,
        "documents",
    )
    # Milestones are tool output too: tokenized as the tool messages that show them.
    milestones, milestone_length = _pad_groups(
        [[tokenizer.encode(m, special=False) for m in t.milestones] for t in tasks],
        max_milestones,
        milestone_tokens,
        np.int32,
        "milestones",
    )
    sessions, session_length = _pad_groups(
        [[t.session_ids(i, tokenizer, markers) for i in range(len(t.sessions))] for t in tasks],
        max_sessions,
        session_tokens,
        np.int32,
        "later sessions",
    )
    return TaskBank(
        prompt=_pad(prompts, prompt_tokens, np.int32, "prompt"),
        prompt_length=np.asarray([len(p) for p in prompts], np.int32),
        answer=_pad(answers, answer_bytes, np.uint8, "answer"),
        answer_length=np.asarray([len(a) for a in answers], np.int32),
        value=np.asarray([t.value for t in tasks], np.int32),
        numbers=_pad([t.numbers for t in tasks], max_numbers, np.int32, "numbers"),
        num_numbers=np.asarray([len(t.numbers) for t in tasks], np.int32),
        family=np.asarray(
            [list(families).index(t.family) if families else 0 for t in tasks], np.int32
        ),
        table=Table(keys, key_length, values, value_length),
        corpus=Corpus(
            docs,
            doc_length,
            _embed_documents(tasks, docs.shape[:2], embedding_dim),
            np.asarray([len(t.documents) for t in tasks], np.int32),
        ),
        milestones=milestones,
        milestone_length=milestone_length,
        sessions=sessions,
        session_length=session_length,
    )
