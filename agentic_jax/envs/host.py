"""Host-side text environments: Python tools on a thread pool, behind the batched env API.

Some tools cannot run in jnp: arbitrary Python functions, code execution in
a subprocess, anything doing I/O.  `HostTextEnv` is the non-jitted twin of
``Vectorized(TextEnv)``: the same ``reset(keys[B], params)`` /
``step(keys[B], state, actions[B, A], params)`` signatures, the same
transcript observations, masks, auto-reset and ``info`` keys, over numpy
arrays -- so one trainer loop drives either (``reset_tasks`` / ``step_env`` and
``batched`` mirror `TextEnv`'s too).  The episode rules (turn extent,
tool-message template, turn and token budgets, the verifier's reward on the
answering turn and `TurnRewards` on tool turns) are the jitted env's, and on
calls both can run the two give the same rewards and transcripts.  A tool's
result is an error when it starts with ``error`` (every tool's error messages
do); each result is tokenized once and appended as ids.

Tool calls of a batch run concurrently on a `ToolPool`
(``concurrent.futures.ThreadPoolExecutor``) under one deadline, so a slow or
hung tool costs at most ``timeout_s`` per step: its result becomes
``"error: timeout"``.  A thread cannot be killed, so a timed-out Python
function keeps its worker until it returns; code that may hang belongs in a
subprocess (`PythonSandbox`, the guarded sandbox), which is killed at its own timeout.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agentic_jax.data.chat import ToolSpec
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.text.chat_markers import ChatMarkers
from agentic_jax.envs.text.env import TurnRewards, turn_extent
from agentic_jax.envs.text.rewards import Reward
from agentic_jax.envs.text.tasks import Task
from agentic_jax.envs.text.tools import MALFORMED, Tool, parse_call_host
from agentic_jax.envs.text.vocab import Vocab
from agentic_jax.sandbox import run_python

TIMEOUT = "error: timeout"


class ToolPool:
    """Runs batches of calls on threads; each batch must finish within ``timeout_s`` of submission."""

    def __init__(self, max_workers: int = 8, timeout_s: float = 10.0):
        self.timeout_s = timeout_s
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers, thread_name_prefix="tool"
        )

    def map(self, calls: Sequence[Callable[[], str]]) -> list[str]:
        """Results in order; a call still running at the deadline gives `TIMEOUT`, one that
        raised its error."""
        futures = [self.executor.submit(call) for call in calls]
        concurrent.futures.wait(futures, timeout=self.timeout_s)
        results = []
        for future in futures:
            if not future.done():
                future.cancel()  # only stops calls still queued; running ones finish in the background
                results.append(TIMEOUT)
            elif future.exception() is not None:
                results.append(f"error: {type(future.exception()).__name__}: {future.exception()}")
            else:
                results.append(future.result())
        return results

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class PythonSandbox(Tool):
    """Runs Python code in the guarded sandbox of ``agentic_jax.sandbox`` (an isolated
    interpreter with time, memory and file-size limits, no network and no writes outside its
    scratch directory); returns its stdout.

    Host only.  The child is killed at ``timeout_s``; a non-zero exit returns the last line of
    stderr (the exception).
    """

    name, argument = "python", "code"
    messages = (TIMEOUT,)
    description = "Run a Python 3 program in a sandbox; returns what it prints."

    def __init__(self, timeout_s: float = 5.0, argument_bytes: int = 4096, memory_mb: int = 512):
        super().__init__(argument_bytes)
        self.timeout_s, self.memory_mb = timeout_s, memory_mb

    def run(self, argument, task, vocab, messages):
        raise TypeError("PythonSandbox runs only in a HostTextEnv")

    def run_host(self, argument, task):
        done = run_python(argument, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        if done.timed_out:
            return TIMEOUT
        if done.returncode:
            lines = done.stderr.strip().splitlines()
            return f"error: {lines[-1] if lines else f'exit status {done.returncode}'}"
        return done.stdout.strip()


class HostFunction(Tool):
    """A Python function as a host tool: a call ``{"name": name, "arguments": {...}}`` runs
    ``fn(**arguments)`` and its text is the tool message.  ``fn`` checks its own arguments; an
    exception it raises (a bad argument, a failed request) becomes an ``error: ...`` message,
    which counts as an invalid call.  This is how the harness's ``@tool`` functions and MCP
    servers' tools play in RL rollouts (``agents.tools.env_tool``).  Host only."""

    messages = ()

    def __init__(
        self,
        name: str,
        fn: Callable[..., str],
        argument_bytes: int = 4096,
        spec: ToolSpec | None = None,
    ):
        super().__init__(argument_bytes)
        self.name, self.fn, self.argument = name, fn, ""
        self._spec = spec or ToolSpec(name, "", {"type": "object"})

    @property
    def spec(self) -> ToolSpec:
        """The function's own schema (``env_tool`` passes the harness tool's)."""
        return self._spec

    def host_argument(self, arguments):
        return dict(arguments)

    def run(self, argument, task, vocab, messages):
        raise TypeError(f"the host tool {self.name!r} runs only in a HostTextEnv")

    def run_host(self, argument, task):
        del task
        return str(self.fn(**argument))


@dataclasses.dataclass(frozen=True)
class HostTextParams:
    task_weights: np.ndarray  # float [N], as `TextEnvParams.task_weights`
    max_turns: int


@struct.dataclass
class HostTextState:
    """Batched numpy state with the fields of `TextEnvState` (a pytree of numpy arrays)."""

    time: np.ndarray
    task: np.ndarray
    tokens: np.ndarray
    loss_mask: np.ndarray
    length: np.ndarray
    turn: np.ndarray
    reached: np.ndarray  # bool [B, M]: milestones reached, as `TextEnvState.reached`
    context_start: np.ndarray  # int32 [B]: 0 (no host env spans sessions), as `TextEnvState`'s

    def observation(self) -> dict:
        return {
            "tokens": self.tokens.copy(),
            "loss_mask": self.loss_mask.copy(),
            "length": self.length.copy(),
        }


class HostTextEnv:
    """`TextEnv`'s rules with host tools: batched ``reset``/``step`` over numpy arrays (see the
    module doc)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        tasks: Sequence[Task],
        reward: Reward,
        *,
        tools: Sequence[Tool] = (),
        max_length: int = 512,
        action_length: int = 96,
        max_turns: int = 4,
        pool: ToolPool | None = None,
        turn_rewards: TurnRewards = TurnRewards(),
    ):
        self.tokenizer, self.tasks, self.reward, self.tools = (
            tokenizer,
            list(tasks),
            reward,
            tuple(tools),
        )
        self.max_length, self.action_length = max_length, action_length
        self.turn_rewards = turn_rewards
        self.milestones = [t.milestones for t in self.tasks]
        self.max_milestones = max(1, *map(len, self.milestones))
        self.pool = pool or ToolPool()
        # The tokenizer's chat template and tool-call format, as `TextEnv`'s default.
        markers = ChatMarkers.build(tokenizer, calls=bool(self.tools))
        vocab = Vocab.build(tokenizer, markers)
        self.stop_ids, self.pad_id = vocab.stop_ids, vocab.pad_id
        self.tool_call_id, self.tool_call_end_id = vocab.tool_call_id, vocab.tool_call_end_id
        self.im_end_id = markers.end_of_turn_id
        self.head, self.tail = list(markers.head), list(markers.tail)
        self.prompts = [t.prompt_ids(tokenizer, markers) for t in self.tasks]
        if max(map(len, self.prompts)) + action_length > max_length:
            raise ValueError(
                f"a prompt leaves no room for a {action_length}-token turn in max_length={max_length}"
            )
        self.default_params = HostTextParams(np.ones(len(self.tasks), np.float32), max_turns)

    def _sample_tasks(self, keys, params: HostTextParams) -> np.ndarray:
        """The tasks `TextEnv.reset_env` would draw with the same keys."""
        logits = jnp.log(jnp.asarray(params.task_weights, jnp.float32))
        return np.asarray(jax.vmap(lambda key: jax.random.categorical(key, logits))(keys))

    def _reset_rows(self, state: HostTextState, rows: np.ndarray, tasks: np.ndarray) -> None:
        for row, task in zip(rows, tasks):
            prompt = self.prompts[task]
            state.tokens[row] = self.pad_id
            state.tokens[row, : len(prompt)] = prompt
            state.loss_mask[row] = 0
            state.reached[row] = False
            state.time[row], state.task[row], state.length[row], state.turn[row] = (
                0,
                task,
                len(prompt),
                0,
            )

    def reset(self, keys, params: HostTextParams | None = None):
        params = params or self.default_params
        return self.reset_tasks(self._sample_tasks(keys, params))

    def reset_tasks(self, tasks, params: HostTextParams | None = None):
        """First observations and state of one episode of each of ``tasks`` (rows of the task
        list; trainers that choose their prompts start here, as with `TextEnv.reset_task`)."""
        tasks = np.asarray(tasks, np.int32)
        size = len(tasks)
        state = HostTextState(
            np.zeros(size, np.int32),
            np.zeros(size, np.int32),
            np.zeros((size, self.max_length), np.int32),
            np.zeros((size, self.max_length), np.int32),
            np.zeros(size, np.int32),
            np.zeros(size, np.int32),
            np.zeros((size, self.max_milestones), bool),
            np.zeros(size, np.int32),
        )
        self._reset_rows(state, np.arange(size), tasks)
        return state.observation(), state

    @property
    def batched(self):
        """``(reset_tasks, step_env)`` with `TextEnv.batched`'s signatures, for trainers that
        drive either env (params are unused: they are this env's own)."""
        return (
            lambda tasks, params: self.reset_tasks(tasks),
            lambda keys, state, actions, params: self.step_env(state, actions, self.default_params),
        )

    def _parse(self, action: np.ndarray):
        """Turn length, answer content, and the call (tool, argument) or None for an answering turn."""
        length = int(turn_extent(action, self.stop_ids, self.pad_id))
        turn = action[:length]
        content = self.tokenizer.decode(turn[~np.isin(turn, self.stop_ids)])
        opens = np.flatnonzero(turn == self.tool_call_id)
        closes = np.flatnonzero(turn == self.tool_call_end_id)
        closes = closes[closes > opens[0]] if len(opens) else closes[:0]
        if not self.tools or not len(closes):
            return length, content, None
        return (
            length,
            content,
            parse_call_host(self.tokenizer.decode(turn[opens[0] + 1 : closes[0]]), self.tools),
        )

    def step(self, keys, state: HostTextState, actions, params: HostTextParams | None = None):
        """`step_env`, then finished rows start a new episode (as `Env.step` auto-resets)."""
        params = params or self.default_params
        obs, state, reward, terminated, truncated, info = self.step_env(state, actions, params)
        info["final_observation"] = obs
        done = np.flatnonzero(terminated | truncated)
        reset_keys = jax.vmap(lambda key: jax.random.split(key)[1])(
            keys
        )  # as `Env.step` splits its key
        self._reset_rows(state, done, self._sample_tasks(reset_keys, params)[done])
        return state.observation(), state, reward, terminated, truncated, info

    def _milestone(self, row: int, state: HostTextState, result: str) -> bool:
        """Marks and reports the first milestone of the row's task not reached before that
        ``result`` equals (as `TextEnv`)."""
        for m, milestone in enumerate(self.milestones[state.task[row]]):
            if milestone == result and not state.reached[row, m]:
                state.reached[row, m] = True
                return True
        return False

    def step_env(self, state: HostTextState, actions, params: HostTextParams | None = None):
        """One turn of every row, without resetting finished ones (`TextEnv.step_env`)."""
        params = params or self.default_params
        actions = np.asarray(actions, np.int32)
        state = dataclasses.replace(
            state, **{f.name: getattr(state, f.name).copy() for f in dataclasses.fields(state)}
        )
        parsed = [self._parse(a) for a in actions]
        calls = [(i, call) for i, (_, _, call) in enumerate(parsed) if call is not None]
        results = self.pool.map(
            [
                (
                    lambda tool=tool, arg=arg, task=self.tasks[state.task[i]]: tool.run_host(
                        arg, task
                    )
                )
                if tool is not None
                else (lambda: MALFORMED)
                for i, (tool, arg) in calls
            ]
        )
        result_of = {i: r for (i, _), r in zip(calls, results)}
        size = len(actions)
        reward, terminated, truncated = (
            np.zeros(size, np.float32),
            np.zeros(size, bool),
            np.zeros(size, bool),
        )
        call_ok, hit = np.zeros(size, bool), np.zeros(size, bool)
        turn_start = state.length.copy()
        rewards = self.turn_rewards
        for i, (length, content, call) in enumerate(parsed):
            start = state.length[i]
            state.tokens[i, start : start + length] = actions[i, :length]
            state.loss_mask[i, start : start + length] = 1
            state.length[i] += length
            state.turn[i] += 1
            state.time[i] += 1
            if call is None:
                terminated[i] = True
                reward[i] = self.reward.host(content, self.tasks[state.task[i]])
                continue
            call_ok[i] = call[0] is not None and not result_of[i].startswith("error")
            hit[i] = self._milestone(i, state, result_of[i])
            reward[i] = (rewards.valid_call if call_ok[i] else rewards.invalid_call) + (
                rewards.milestone if hit[i] else 0.0
            )
            closing = [] if actions[i, length - 1] == self.im_end_id else [self.im_end_id]
            message = (
                closing + self.head + self.tokenizer.encode(result_of[i], special=False) + self.tail
            )
            fits = state.length[i] + len(message) + self.action_length <= self.max_length
            if fits:
                state.tokens[i, state.length[i] : state.length[i] + len(message)] = message
                state.length[i] += len(message)
            truncated[i] = not fits or state.turn[i] >= params.max_turns
        info = {
            "task": state.task.copy(),
            "tool_call": np.array([p[2] is not None for p in parsed]),
            "malformed_call": np.array([p[2] is not None and p[2][0] is None for p in parsed]),
            "call_ok": call_ok,
            "milestone_hit": hit,
            "milestones": state.reached.sum(axis=1).astype(np.int32),
            "turn_start": turn_start,
            "turn_length": np.array([p[0] for p in parsed], np.int32),
        }
        return state.observation(), state, reward, terminated, truncated, info
