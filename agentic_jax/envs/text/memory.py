"""Memory in RL: episodes that span sessions, where only what the agent stored carries over.

A conversational agent meets the same user again after its context is gone; what it did not
write down is lost.  `MemoryEnv` makes that a training signal.  An episode is several
*sessions* (`Task.prompt`, then each of `Task.sessions`); the policy's answering turn ends a
session, the context is **cleared** and the next session's prompt opens a fresh one.  The only
thing that survives is the agent's memory: a fixed-size slot buffer in the env state, written
and read by two tools the policy calls like any other (MemGPT's memory operations as function
calls, Packer et al. 2023, arXiv:2310.08560)::

    remember(text)   store the text in the next slot (a ring: the oldest is overwritten)
    recall(query)    the top-k stored texts by the hashed-trigram dot product of `Search`

`MultiSessionRecall` states a fact in session 1 ("my locker code is 4821"), fills the sessions
between with other facts and small talk, and asks for it in the last one: the answer is
nowhere in the final context, so only a policy that stored the fact and recalls it can earn the
verifier's reward.  Memory-augmented RL in this sense (the memory as part of the environment
state, reads and writes as actions whose worth is learned from reward) follows Wayne et al.
2018 (MERLIN, arXiv:1803.10760) and, for language agents, MemGPT's tool interface.

**Rewards per turn** (`TurnRewards`, the machinery of every tool turn): the last session's
answering turn earns the verifier's reward; earlier sessions' answers earn 0 (they are small
talk).  A *useful write*, the first write of the episode whose text contains the answer,
earns ``useful_write`` on the writing turn itself: the credit lands on the action that made
the later answer possible, not on a later turn it would have to be carried back to.  A *useful
read*, the first recall in the last session whose result contains the answer, earns
``useful_read``.  Each is paid once per episode, so neither writing the fact ten times nor
recalling it ten times pays more.  A write of a text already stored is not stored again (its
message says so) and earns nothing.

**Training rows.**  Every session stays in ``tokens`` (the episode's training row) while the
policy generates from ``tokens[context_start:length]``; the rollout (`post_training.rollout`)
records which session each token belongs to, and the learner computes log-probabilities with
those as segment ids, so each session's tokens are scored in exactly the context they were
sampled in, and the session-1 write and the session-4 answer are one episode for credit.

The memory lives in jnp, so there is no host twin (`HostTextEnv`): a recalled text is spelled
in single-byte tokens (decoding to exactly the stored text; not the tokenizer's canonical
spelling of it, which jit cannot compute for arbitrary text).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs import spaces
from agentic_jax.envs.text.env import TextEnv, TextEnvState, _write
from agentic_jax.envs.text.generators import FORMAT, Generator, task_prompt
from agentic_jax.envs.text.rewards import ExactAnswer, ThinkAnswerFormat, Weighted
from agentic_jax.envs.text.strings import Text, contains, embed, equals, substring
from agentic_jax.envs.text.tasks import Task, TaskBank
from agentic_jax.envs.text.tools import Tool, join_rows, parse_call, top_documents
from agentic_jax.envs.text.vocab import Vocab, pack


@struct.dataclass
class Memory:
    """``slots`` stored texts: bytes, lengths (-1: empty) and `strings.embed` of each."""

    text: jax.Array  # uint8 [slots, width]
    length: jax.Array  # int32 [slots]; -1 marks an empty slot
    embedding: jax.Array  # float32 [slots, dim]
    writes: jax.Array  # int32 []: texts stored so far (the next slot is writes % slots)

    @classmethod
    def empty(cls, slots: int, width: int, dim: int) -> Memory:
        return cls(
            jnp.zeros((slots, width), jnp.uint8),
            jnp.full((slots,), -1, jnp.int32),
            jnp.zeros((slots, dim), jnp.float32),
            jnp.int32(0),
        )

    def slot(self, index) -> Text:
        return Text(self.text[index], self.length[index])

    def holds(self, text: Text) -> jax.Array:
        """Whether ``text`` is stored already (byte for byte)."""
        return jnp.any(
            jax.vmap(lambda data, length: equals(Text(data, length), text))(self.text, self.length)
        )

    def write(self, text: Text) -> Memory:
        """``text`` in the next slot of the ring, with its embedding."""
        index = self.writes % self.length.shape[0]
        data = substring(text, 0, text.length, self.text.shape[1])
        return Memory(
            self.text.at[index].set(data.data),
            self.length.at[index].set(data.length),
            self.embedding.at[index].set(embed(data, self.embedding.shape[1])),
            self.writes + 1,
        )

    def recall(self, query: Text, k: int) -> tuple[jax.Array, jax.Array]:
        """The ``k`` stored texts that best match ``query`` (`tools.top_documents`): (slots, which exist)."""
        return top_documents(query, self.embedding, self.length, k)


class Remember(Tool):
    """Store a text in the agent's memory (`MemoryEnv`); "already stored" for a duplicate."""

    name, argument = "remember", "text"
    messages = ("stored", "already stored", "error: nothing to store")
    description = "Store a short text in your memory; it outlasts this conversation."

    def accepts(self, text: Text) -> jax.Array:
        """A text it stores: not empty, and within ``argument_bytes`` (the slot's width)."""
        return (text.length > 0) & text.fits

    def run_memory(self, argument: Text, memory: Memory, vocab: Vocab, messages, byte_ids):
        del byte_ids
        choice = jnp.where(~self.accepts(argument), 2, jnp.where(memory.holds(argument), 1, 0))
        return messages[0][choice], messages[1][choice]


class Recall(Tool):
    """The ``top_k`` stored texts that best match a query, one per line (`MemoryEnv`)."""

    name, argument = "recall", "query"
    messages = ("\n", "error: memory is empty")
    description = "Search your memory: the stored texts that best match a query, one per line."

    def __init__(self, top_k: int = 1, embedding_dim: int = 64, argument_bytes: int = 48):
        super().__init__(argument_bytes)
        self.top_k, self.embedding_dim = top_k, embedding_dim

    def run_memory(self, argument: Text, memory: Memory, vocab: Vocab, messages, byte_ids):
        best, exists = memory.recall(argument, self.top_k)
        found, found_length = join_rows(
            byte_ids[memory.text],
            memory.length,
            best,
            exists,
            (messages[0][0], messages[1][0]),
            vocab,
        )
        any_stored = jnp.any(exists)
        return pack(
            [
                (found, jnp.where(any_stored, found_length, 0)),
                (messages[0][1], jnp.where(any_stored, 0, messages[1][1])),
            ],
            max(found.shape[0], messages[0].shape[1]),
            vocab.pad_id,
        )


@struct.dataclass
class MemoryEnvState(TextEnvState):
    """`TextEnvState` plus what outlives a session: the memory, and the episode's session."""

    memory: Memory
    # int32 []: sessions ended so far (the current one is `Task.sessions[session - 1]`)
    session: jax.Array
    wrote: jax.Array  # bool []: a useful write was paid this episode
    read: jax.Array  # bool []: a useful read was paid this episode


class MemoryEnv(TextEnv):
    """A `TextEnv` whose episodes span sessions, with a `Remember` / `Recall` memory of
    ``slots`` texts carried between them (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, tasks, reward, *, slots: int = 8, **kwargs):
        super().__init__(tokenizer, tasks, reward, **kwargs)
        kinds = [
            [i for i, t in enumerate(self.tools) if isinstance(t, k)] for k in (Remember, Recall)
        ]
        if any(len(found) != 1 for found in kinds):
            raise ValueError("a MemoryEnv needs one Remember and one Recall tool")
        (self.remember_index,), (self.recall_index,) = kinds
        self.slots = slots
        self.byte_ids = tokenizer.byte_token_ids

    @property
    def remember(self) -> Remember:
        return self.tools[self.remember_index]

    @property
    def recall(self) -> Recall:
        return self.tools[self.recall_index]

    def observation_space(self, params=None):
        space = super().observation_space(params)
        return spaces.Dict({**space.spaces, "context_start": spaces.Discrete(self.max_length + 1)})

    @staticmethod
    def observation(state: TextEnvState) -> dict:
        """The transcript and where the current session's context starts in it."""
        return {**TextEnv.observation(state), "context_start": state.context_start}

    def reset_task(self, task, params):
        _, base = super().reset_task(task, params)
        state = MemoryEnvState(
            **{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
            memory=Memory.empty(
                self.slots, self.remember.argument_bytes, self.recall.embedding_dim
            ),
            session=jnp.int32(0),
            wrote=jnp.bool_(False),
            read=jnp.bool_(False),
        )
        return self.observation(state), state

    def run_tool(self, tool: Tool, argument, task: TaskBank, vocab: Vocab, messages, state):
        if isinstance(tool, Remember | Recall):
            return tool.run_memory(
                argument, state.memory, vocab, messages, jnp.asarray(self.byte_ids)
            )
        return super().run_tool(tool, argument, task, vocab, messages, state)

    def step_env(self, key, state: MemoryEnvState, action, params):
        _, after, reward, terminated, truncated, info = super().step_env(key, state, action, params)
        task, vocab = params.tasks.row(state.task), params.vocab
        tool_turn, payload = self.call(jnp.asarray(action, jnp.int32), info["turn_length"], vocab)
        index, value = parse_call(payload, self.tools)
        text = substring(value, 0, value.length, self.remember.argument_bytes)
        query = substring(value, 0, value.length, self.recall.argument_bytes)
        answer = Text(task.answer, task.answer_length)
        memory = state.memory

        stores = (
            tool_turn
            & (index == self.remember_index)
            & self.remember.accepts(text)
            & ~memory.holds(text)
        )
        useful_write = stores & contains(text, answer) & ~state.wrote
        last = state.session == jnp.sum(task.session_length >= 0)
        best, exists = memory.recall(query, self.recall.top_k)
        surfaced = jnp.any(exists & jax.vmap(lambda i: contains(memory.slot(i), answer))(best))
        useful_read = tool_turn & (index == self.recall_index) & last & surfaced & ~state.read
        rewards = self.turn_rewards
        bonus = jnp.where(useful_write, rewards.useful_write, 0.0) + jnp.where(
            useful_read, rewards.useful_read, 0.0
        )

        # An answer before the last session ends the session: clear the context, open the next.
        ends = ~tool_turn & ~last
        following = jnp.minimum(state.session, task.sessions.shape[0] - 1)
        prompt, prompt_length = task.sessions[following], task.session_length[following]
        fits = after.length + prompt_length + self.action_length <= self.max_length
        opens = ends & fits & (after.turn < params.max_turns)
        written = memory.write(text)
        after = after.replace(
            tokens=_write(after.tokens, after.length, prompt, jnp.where(opens, prompt_length, 0)),
            length=jnp.where(opens, after.length + prompt_length, after.length),
            context_start=jnp.where(opens, after.length, after.context_start),
            memory=jax.tree.map(lambda new, old: jnp.where(stores, new, old), written, memory),
            session=state.session + opens,
            wrote=state.wrote | useful_write,
            read=state.read | useful_read,
        )
        reward = jnp.where(ends, 0.0, reward) + bonus.astype(jnp.float32)
        info = {
            **info,
            "session": after.session,
            "memory_write": stores,
            "useful_write": useful_write,
            "useful_read": useful_read,
        }
        return (
            self.observation(after),
            after,
            reward,
            terminated & ~ends,
            truncated | (ends & ~opens),
            info,
        )


_FACTS = (
    ("locker code", 4),
    ("parking spot", 3),
    ("bike lock code", 4),
    ("apartment number", 3),
    ("gym pin", 4),
    ("badge number", 5),
)
_SMALL_TALK = (
    "The weather was lovely on my walk today.",
    "I finally finished the book I was reading.",
    "We had pasta for dinner last night.",
    "My sister visited over the weekend.",
)
MEMORY_HINT = (
    "Each conversation starts with an empty context. remember stores a text that outlasts it; "
    "recall searches what you stored."
)


class MultiSessionRecall(Generator):
    """A fact in session 1, ``difficulty`` sessions of other facts and small talk, the question
    in the last: "What is my locker code?" (`MemoryEnv`; its context is cleared between).

    The distractor sessions state facts of other kinds, so a recall must find the right one
    among several stored texts.  Reward: exact answer (0.9) + format (0.1), plus the memory
    turn rewards (`TurnRewards.useful_write`, ``useful_read``).  A policy that remembers what it
    is told each session and recalls before answering takes ``2 × (difficulty + 2)`` turns.
    """

    env_type = MemoryEnv

    def __init__(self, difficulty: int = 2, top_k: int = 1):
        super().__init__(difficulty)
        self.tools = (Remember(), Recall(top_k=top_k))
        self.reward = Weighted((0.9, ExactAnswer()), (0.1, ThinkAnswerFormat()))

    @property
    def max_turns(self):
        return 2 * (self.difficulty + 2)

    def sample(self, seed):
        rng = np.random.default_rng(seed)
        kinds = rng.permutation(len(_FACTS))[: self.difficulty + 1]
        facts = []
        for kind in kinds:
            name, digits = _FACTS[kind]
            facts.append((name, str(rng.integers(10 ** (digits - 1), 10**digits))))
        system = f"{MEMORY_HINT} {FORMAT}"

        def session(user: str):
            return task_prompt(system, user, self.tools)

        (name, value), others = facts[0], facts[1:]
        later = [
            session(f"{_SMALL_TALK[rng.integers(len(_SMALL_TALK))]} My {n} is {v}.")
            for n, v in others
        ]
        return Task(
            session(f"Please keep this in mind: my {name} is {value}."),
            value,
            sessions=(*later, session(f"What is my {name}?")),
            seed=seed,
            difficulty=self.difficulty,
            family=self.family,
        )
