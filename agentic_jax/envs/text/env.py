"""`TextEnv`: a jitted multi-turn chat environment for LLM policies (token ids in, token ids out).

Action granularity: one *assistant turn* per step, ``int32 [action_length]``
padded with PAD -- what a sampler produces when it generates one reply and
stops at ``<|im_end|>``.  The turn ends at its first ``<|im_end|>``/EOS
(inclusive) or first PAD; later tokens are ignored.  Then:

* a turn holding a complete ``<tool_call>...</tool_call>`` block (and the
  env has tools) is a tool turn: the first call is parsed and executed in
  jnp, and the tool message plus the next generation prompt are appended::

      \\n<|im_start|>tool\\n<tool_result>\\n{content}\\n</tool_result><|im_end|>\\n<|im_start|>assistant\\n

  (with a leading ``<|im_end|>`` if the policy did not close its turn);
* any other turn is the final answer: the episode terminates with the
  verifier's reward.  Without tools every turn is an answer, i.e. a
  single-turn verifiable task (prompt -> completion -> reward).

These are this project's template and tokens.  An imported model's own chat template and
tool-call format (``template=`` / ``tool_format=``, by default the tokenizer's Hugging Face
template and the format it writes) give the call markers, the end of a turn, the tool message
and the task prompts instead (`chat_markers.ChatMarkers`); e.g. a Qwen2.5-style model calls
with ``<tool_call>``/``</tool_call>`` tokens, ends turns with ``<|im_end|>`` and reads its
results as ``\n<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n
<|im_start|>assistant\n``.

**Rewards per turn.**  The answering turn earns the verifier's reward.  A tool turn earns what
the env's `TurnRewards` give (all 0 by default, so only the final answer counts): ``valid_call``
for a well-formed call to a known tool whose arguments it accepts (the result is not an error),
``invalid_call`` (a penalty) for any other call, and ``milestone`` when the call's result is one of
the task's milestones not reached before (`Task.milestones`: each calculator sub-result, each hop
of a lookup chain, as the demonstration passes through them).  ``info`` reports ``turn_start``
and ``turn_length`` (the token span of the turn), ``call_ok``, ``milestone_hit`` and
``milestones`` (how many the episode has reached, a potential for shaping).

The episode is truncated (reward 0) when the last of ``params.max_turns``
assistant turns calls a tool instead of answering, or when the token budget
``max_length`` cannot hold the tool message plus another full action (the
message is then not appended).  Without tools every turn is an answer, so
the turn limit never binds.  ``info`` has ``task`` (the bank row, for
curricula), ``tool_call`` and ``malformed_call``.

Observation = the transcript so far, ``{"tokens": int32 [max_length],
"loss_mask": int32 [max_length], "length": int32}``.  The policy
generates from ``tokens[:length]``; ``loss_mask`` is 1 exactly on the
policy's own tokens (0 on prompt, tool messages and padding), so after an
episode ``info["final_observation"]`` is a ready-made training row for
``rl.policy_loss`` / ``rl.aggregate`` with the episode reward.  Replaying
a `Task`'s demonstration reproduces ``chat.render_ids`` of it token for
token, with ``loss_mask`` equal to its assistant mask.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agentic_jax.data.chat_template import ChatTemplate
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.data.tool_formats import ToolCallFormat
from agentic_jax.envs import spaces
from agentic_jax.envs.core import Env, EnvState
from agentic_jax.envs.text.chat_markers import ChatMarkers
from agentic_jax.envs.text.rewards import ByFamily, Reward
from agentic_jax.envs.text.strings import Text, substring
from agentic_jax.envs.text.tasks import Task, TaskBank, build_bank
from agentic_jax.envs.text.tools import MALFORMED, Search, Tool, parse_call, token_table
from agentic_jax.envs.text.vocab import Vocab, detokenize, pack


@struct.dataclass
class TextEnvParams:
    """Everything an episode reads besides the action; swap banks or weights without recompiling."""

    tasks: TaskBank
    vocab: Vocab
    task_weights: (
        jax.Array
    )  # float32 [N]: unnormalised sampling weights of the tasks (curricula set them)
    max_turns: (
        jax.Array
    )  # int32 []: assistant turns per episode; a tool call in the last one truncates


@struct.dataclass
class TextEnvState(EnvState):
    """The transcript so far (what the observation shows) and the episode's task and turn count."""

    task: jax.Array  # int32 []: row of the task bank
    tokens: jax.Array  # int32 [max_length]
    loss_mask: jax.Array  # int32 [max_length]
    length: jax.Array  # int32 []
    turn: jax.Array  # int32 []: assistant turns taken
    reached: jax.Array  # bool [M]: the task's milestones this episode's tool results reached
    # int32 []: where the context the policy sees starts in ``tokens``; 0 unless an episode spans
    # sessions (`memory.MemoryEnv` clears the context at each new session: earlier sessions stay in
    # ``tokens`` as training rows, and the policy generates from ``tokens[context_start:length]``)
    context_start: jax.Array


@dataclasses.dataclass(frozen=True)
class TurnRewards:
    """What a tool turn earns (see the module docstring); the answering turn earns the
    verifier's reward.  All 0 is the final-answer-only reward.  ``useful_write`` and
    ``useful_read`` pay memory tools' turns that store or retrieve the answer; only an env with
    a memory (`memory.MemoryEnv`) has them."""

    valid_call: float = 0.0
    invalid_call: float = 0.0
    milestone: float = 0.0
    useful_write: float = 0.0
    useful_read: float = 0.0


def turn_extent(action, stop_ids: Sequence[int], pad_id: int):
    """Length of the turn in ``action`` (up to the first stop token inclusive, or the first PAD).

    Works on numpy (the host env) and jnp arrays alike.
    """
    xp = np if isinstance(action, np.ndarray) else jnp
    stop = xp.isin(action, xp.asarray(stop_ids))
    size = action.shape[-1]
    first_stop = xp.where(xp.any(stop), xp.argmax(stop) + 1, size)
    first_pad = xp.where(xp.any(action == pad_id), xp.argmax(action == pad_id), size)
    return xp.minimum(first_stop, first_pad)


def _write(buffer, start, values, count):
    """``buffer[start:start + count] = values[:count]`` with static shapes."""
    index = jnp.arange(values.shape[0])
    return buffer.at[jnp.where(index < count, start + index, buffer.shape[0])].set(
        values, mode="drop"
    )


class TextEnv(Env):
    """Multi-turn tool use (or single-turn answers) over a bank of `Task`s; see the module docstring."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        tasks: Sequence[Task] | TaskBank,
        reward: Reward,
        *,
        tools: Sequence[Tool] = (),
        max_length: int = 512,
        action_length: int = 96,
        max_turns: int = 4,
        payload_bytes: int | None = None,
        answer_bytes: int | None = None,
        bank_sizes: dict | None = None,
        turn_rewards: TurnRewards = TurnRewards(),
        template: ChatTemplate | None = None,
        tool_format: ToolCallFormat | str | None = None,
    ):
        if len({t.name for t in tools}) != len(tools):
            raise ValueError("tool names must be unique")
        self.tokenizer, self.reward, self.tools = tokenizer, reward, tuple(tools)
        self.max_length, self.action_length, self.max_turns = max_length, action_length, max_turns
        self.turn_rewards = turn_rewards
        self.bank_sizes = dict(bank_sizes or {})
        search = [t for t in self.tools if isinstance(t, Search)]
        if search:
            self.bank_sizes.setdefault("embedding_dim", search[0].embedding_dim)
        if isinstance(reward, ByFamily):
            self.bank_sizes["families"] = reward.families
        # The model's own chat template and tool-call format (`chat_markers`): this project's for
        # its own tokenizer, else the tokenizer's Hugging Face template and the format it writes.
        self.markers = ChatMarkers.build(tokenizer, template, tool_format, calls=bool(self.tools))
        self.vocab = Vocab.build(tokenizer, self.markers)
        # The verifier sees only the first `answer_bytes` of a turn; by default every turn fits, so a
        # long turn (thinking, then the answer) is scored as on the host, not cut to a zero reward.
        turn_bytes = action_length * self.vocab.token_bytes.shape[1]
        self.answer_bytes = turn_bytes if answer_bytes is None else answer_bytes
        # Likewise every call payload fits by default: a call that did not would be malformed here but
        # parsed on the host; an argument past the tool's own `argument_bytes` is the tool's error in both.
        self.payload_bytes = turn_bytes if payload_bytes is None else payload_bytes
        self.im_end_id = self.markers.end_of_turn_id
        self.head, self.tail = list(self.markers.head), list(self.markers.tail)
        self.malformed = tokenizer.encode(MALFORMED)
        self.tool_messages = [token_table(tokenizer, tool.messages) for tool in self.tools]
        bank = tasks if isinstance(tasks, TaskBank) else self.build_bank(tasks)
        self._params = self.make_params(bank)

    def build_bank(self, tasks: Sequence[Task]) -> TaskBank:
        """A bank with this env's sizes (fix them in ``bank_sizes`` to swap banks without recompiling)."""
        return build_bank(tasks, self.tokenizer, markers=self.markers, **self.bank_sizes)

    def make_params(
        self, bank: TaskBank, task_weights=None, max_turns: int | None = None
    ) -> TextEnvParams:
        """Params over ``bank`` (uniform task weights and this env's turn limit unless given)."""
        if bank.prompt.shape[1] + self.action_length > self.max_length:
            raise ValueError(
                f"prompts of {bank.prompt.shape[1]} tokens leave no room for a "
                f"{self.action_length}-token turn in max_length={self.max_length}"
            )
        weights = np.ones(bank.size, np.float32) if task_weights is None else task_weights
        return TextEnvParams(
            jax.tree.map(jnp.asarray, bank),
            self.vocab,
            jnp.asarray(weights, jnp.float32),
            jnp.int32(self.max_turns if max_turns is None else max_turns),
        )

    @property
    def default_params(self) -> TextEnvParams:
        return self._params

    @functools.cached_property
    def batched(self):
        """``(reset_task, step_env)`` vmapped over a batch of episodes and jitted, once per env
        (trainers play many batches of one env)."""
        return (
            jax.jit(jax.vmap(self.reset_task, in_axes=(0, None))),
            jax.jit(jax.vmap(self.step_env, in_axes=(0, 0, 0, None))),
        )

    def observation_space(self, params=None):
        return spaces.Dict(
            {
                "tokens": spaces.Tokens(
                    self.tokenizer.vocab_size, self.max_length, self.vocab.pad_id
                ),
                "loss_mask": spaces.Box(0, 1, (self.max_length,), jnp.int32),
                "length": spaces.Discrete(self.max_length + 1),
            }
        )

    def action_space(self, params=None):
        return spaces.Tokens(self.tokenizer.vocab_size, self.action_length, self.vocab.pad_id)

    @staticmethod
    def observation(state: TextEnvState) -> dict:
        return {"tokens": state.tokens, "loss_mask": state.loss_mask, "length": state.length}

    def reset_env(self, key, params):
        return self.reset_task(jax.random.categorical(key, jnp.log(params.task_weights)), params)

    def reset_task(self, task, params):
        """The first observation and state of an episode of bank row ``task`` (trainers that
        choose their prompts, e.g. G samples of one task for a group baseline, start here)."""
        task = jnp.asarray(task, jnp.int32)
        prompt, prompt_length = params.tasks.prompt[task], params.tasks.prompt_length[task]
        tokens = _write(
            jnp.full((self.max_length,), self.vocab.pad_id, jnp.int32), 0, prompt, prompt_length
        )
        zero = jnp.int32(0)
        reached = jnp.zeros(params.tasks.milestone_length.shape[1:], bool)
        state = TextEnvState(
            zero, task, tokens, jnp.zeros_like(tokens), prompt_length, zero, reached, zero
        )
        return self.observation(state), state

    def run_tool(self, tool: Tool, argument: Text, task: TaskBank, vocab: Vocab, messages, state):
        """One tool's content ids and length (`Tool.run`); an env whose tools read more of the
        episode than its task (`memory.MemoryEnv`: the memory in ``state``) overrides this."""
        del state
        return tool.run(argument, task, vocab, messages)

    def _tool_result(self, payload: Text, task: TaskBank, vocab: Vocab, state):
        """Content ids and length of the tool message for a call payload (an error message if
        malformed), whether it was malformed, and whether the tool gave a result."""
        index, value = parse_call(payload, self.tools)
        arguments = [substring(value, 0, value.length, t.argument_bytes) for t in self.tools]
        results = [
            self.run_tool(tool, argument, task, vocab, jax.tree.map(jnp.asarray, messages), state)
            for tool, argument, messages in zip(self.tools, arguments, self.tool_messages)
        ]
        results.append((jnp.asarray(self.malformed), len(self.malformed)))
        succeeded = [t.succeeded(a, task, vocab) for t, a in zip(self.tools, arguments)]
        width = max(ids.shape[0] for ids, _ in results)
        padded = [pack([r], width, vocab.pad_id) for r in results]
        choice = jnp.where(index < 0, len(self.tools), index)
        return (
            jnp.stack([ids for ids, _ in padded])[choice],
            jnp.stack([n for _, n in padded])[choice],
            index < 0,
            jnp.stack([*succeeded, jnp.bool_(False)])[choice],
        )

    @staticmethod
    def _milestone(result, result_length, task: TaskBank, reached):
        """The first milestone not reached before that ``result`` equals: ``(hit, reached)``."""
        width = min(result.shape[0], task.milestones.shape[1])
        same = (
            jnp.all(
                (task.milestones[:, :width] == result[None, :width])
                | (jnp.arange(width)[None] >= result_length),
                axis=1,
            )
            & (task.milestone_length == result_length)
            & (result_length <= width)
        )
        new = same & ~reached
        return jnp.any(new), reached | (jnp.arange(new.shape[0]) == jnp.argmax(new)) & new

    def call(self, action, turn_length, vocab: Vocab) -> tuple[jax.Array, Text]:
        """Whether the turn holds a complete tool call, and the call's payload (the bytes between
        ``<tool_call>`` and ``</tool_call>``, or the format's own marker tokens)."""
        position = jnp.arange(self.action_length)
        in_turn = position < turn_length
        opens = in_turn & (action == vocab.tool_call_id)
        call_start = jnp.where(jnp.any(opens), jnp.argmax(opens), self.action_length)
        closes = in_turn & (action == vocab.tool_call_end_id) & (position > call_start)
        call_end = jnp.where(jnp.any(closes), jnp.argmax(closes), -1)
        payload = Text(
            *detokenize(
                vocab, action, (position > call_start) & (position < call_end), self.payload_bytes
            )
        )
        return call_end > call_start, payload

    def _tool_message(self, action, turn_length, task: TaskBank, vocab: Vocab, state):
        """Whether the turn calls a tool, whether the call is malformed, and the tool message to append."""
        tool_turn, payload = self.call(action, turn_length, vocab)
        result, result_length, malformed, succeeded = self._tool_result(payload, task, vocab, state)
        closed = action[jnp.maximum(turn_length - 1, 0)] == self.im_end_id
        message = pack(
            [
                (jnp.asarray([self.im_end_id]), jnp.where(closed, 0, 1)),
                (jnp.asarray(self.head), len(self.head)),
                (result, result_length),
                (jnp.asarray(self.tail), len(self.tail)),
            ],
            1 + len(self.head) + result.shape[0] + len(self.tail),
            vocab.pad_id,
        )
        return tool_turn, malformed, succeeded, (result, result_length), message

    def step_env(self, key, state, action, params):
        vocab, task = params.vocab, params.tasks.row(state.task)
        action = jnp.asarray(action, jnp.int32)
        turn_length = turn_extent(action, vocab.stop_ids, vocab.pad_id)
        content = Text(
            *detokenize(
                vocab,
                action,
                (jnp.arange(self.action_length) < turn_length)
                & ~jnp.isin(action, jnp.asarray(vocab.stop_ids)),
                self.answer_bytes,
            )
        )
        reached, hit, call_ok = state.reached, jnp.bool_(False), jnp.bool_(False)
        if self.tools:
            tool_turn, malformed, succeeded, (result, result_length), (message, message_length) = (
                self._tool_message(action, turn_length, task, vocab, state)
            )
            call_ok = tool_turn & ~malformed & succeeded
            hit, after = self._milestone(result, result_length, task, reached)
            hit = tool_turn & hit
            reached = jnp.where(hit, after, reached)
        else:  # single-turn: every turn answers
            tool_turn, malformed, (message, message_length) = (
                jnp.bool_(False),
                jnp.bool_(False),
                (action, 0),
            )

        length = state.length + turn_length
        fits = length + message_length + self.action_length <= self.max_length
        shown = jnp.where(tool_turn & fits, message_length, 0)
        tokens = _write(
            _write(state.tokens, state.length, action, turn_length), length, message, shown
        )
        loss_mask = _write(state.loss_mask, state.length, jnp.ones_like(action), turn_length)
        turn = state.turn + 1
        next_state = state.replace(
            time=state.time + 1,
            tokens=tokens,
            loss_mask=loss_mask,
            length=length + shown,
            turn=turn,
            reached=reached,
        )
        rewards = self.turn_rewards
        tool_reward = (
            jnp.where(call_ok, rewards.valid_call, rewards.invalid_call)
            + jnp.where(hit, rewards.milestone, 0.0)
        ).astype(jnp.float32)
        reward = jnp.where(tool_turn, tool_reward, self.reward(content, task))
        truncated = tool_turn & (~fits | (turn >= params.max_turns))
        info = {
            "task": state.task,
            "tool_call": tool_turn,
            "malformed_call": tool_turn & malformed,
            "call_ok": call_ok,
            "milestone_hit": hit,
            "milestones": jnp.sum(reached, dtype=jnp.int32),
            "turn_start": state.length,
            "turn_length": turn_length,
        }
        return self.observation(next_state), next_state, reward, ~tool_turn, truncated, info
