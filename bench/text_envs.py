"""Tools inside jit: the jitted `TextEnv` vs its host twin `HostTextEnv`, in environment steps/s.

    python -m bench.text_envs            # 1, 64 and 1,024 parallel episodes (about 2 min, 2 cores)
    python -m bench.text_envs --quick    # tiny budgets, a seconds-long smoke run

Both envs play the same 256 `Arithmetic(2)` tasks with the calculator tool, from the same keys,
with the same actions: every episode replays its task's demonstration
(`demonstration_actions`), so its turns 1 and 2 are real calculator calls (one operation each)
and turn 3 is the correct final answer (reward 1.0), after which the episode auto-resets to the
task its key draws.  All episodes are at the same turn at every step, so the action schedule
(``[episodes, action_length]`` per step) is fixed in advance from the keys, and both envs get
the same arrays: step 1 is a calculator call in every episode, and so is step 4, 7, ...

* "jitted": ``jax.jit(Vectorized(env).step)``: `TextEnv.step` vmapped over the episodes, the
  call parsed and the calculator run in jnp inside the program.  `TextEnv.step` is `step_env`
  (what ``env.batched`` jits) plus the auto-reset, the rule `HostTextEnv.step` applies, so the
  two envs hold the same states at every step.  The first call at each batch size (compilation,
  reset and step) is timed apart as "compile s"; then steps are dispatched back to back and
  timed until the last one's results are ready.
* "host": `HostTextEnv.step` over numpy arrays, the calculator run in Python on its default
  `ToolPool` (8 threads); one warm-up step first.

Per batch size both envs play the same number of batched steps (whole episodes), ``REPEATS``
times in alternation (jitted, host, jitted, ...) so that a change in the machine's load hits
both; the table counts the environment steps each played (episodes x steps x repeats) and
rates are steps / seconds of stepping (resets left out).  Every repeat checks that the two envs
ended in the same state with the same observations, rewards and flags ("identical"), and the
last step's mean reward (an answering step) is 1.0 when the schedule matched the tasks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.data import corpus_files, read_documents, render, train_tokenizer, write_documents
from agentic_jax.envs import Vectorized
from agentic_jax.envs.host import HostTextEnv, ToolPool
from agentic_jax.envs.text import Arithmetic, TextEnv, demonstration_actions
from pallas_kernels.benchmarking import describe_device

DIFFICULTY = 2  # two calculator calls, then the answer: three steps per episode
TURNS = DIFFICULTY + 1
ACTION_LENGTH, MAX_LENGTH = 64, 384
NUM_TASKS = 256
EPISODES = (1, 64, 1024)
# Batched steps per repeat (multiples of TURNS: whole episodes); REPEATS repeats alternate the two
# envs, so a change in the machine's load hits both; steps counted = episodes x steps x repeats.
BATCHED_STEPS = {1: 900, 64: 150, 1024: 30}
QUICK_STEPS = {1: 6, 64: 3, 1024: 3}
REPEATS, QUICK_REPEATS = 3, 1


def make_tokenizer(directory, corpus_docs: int = 200, vocab_size: int = 500):
    """A small byte-level BPE on a slice of the shipped corpus plus rendered arithmetic tasks
    (as ``tests/tiny_models.task_tokenizer`` does), so that digits merge; no download."""
    docs = list(read_documents(corpus_files("train")))[:corpus_docs]
    docs += [render(t.conversation()) for t in Arithmetic(3).tasks(range(300))]
    path = os.path.join(directory, "docs.txt")
    write_documents(path, docs)
    return train_tokenizer(
        os.path.join(directory, "tokenizer.json"), files=[path], vocab_size=vocab_size
    )


@dataclasses.dataclass
class Setup:
    """The two envs over one bank of tasks, and each task's demonstration as actions."""

    tokenizer: object
    jitted: TextEnv
    host: HostTextEnv
    demos: np.ndarray  # int32 [tasks, TURNS, ACTION_LENGTH]
    reset: object  # jitted Vectorized reset
    step: object  # jitted Vectorized step (with auto-reset)


def make_setup(tokenizer, num_tasks: int = NUM_TASKS, pool: ToolPool | None = None) -> Setup:
    generator = Arithmetic(DIFFICULTY)
    tasks = generator.tasks(range(num_tasks))
    options = dict(
        tools=generator.tools,
        max_length=MAX_LENGTH,
        action_length=ACTION_LENGTH,
        max_turns=generator.max_turns,
    )
    jitted = TextEnv(tokenizer, tasks, generator.reward, **options)
    host = HostTextEnv(tokenizer, tasks, generator.reward, pool=pool, **options)
    demos = np.stack(
        [
            demonstration_actions(t.render(tokenizer), ACTION_LENGTH, jitted.vocab.pad_id)
            for t in tasks
        ]
    )
    if demos.shape[1] != TURNS:
        raise ValueError(f"expected {TURNS}-turn demonstrations, got {demos.shape[1]}")
    venv = Vectorized(jitted)
    return Setup(tokenizer, jitted, host, demos, jax.jit(venv.reset), jax.jit(venv.step))


@jax.jit
def _reset_tasks(keys, weights):
    """The task `TextEnv.reset_env` (and `HostTextEnv`) draws from each key."""
    return jax.vmap(lambda key: jax.random.categorical(key, jnp.log(weights)))(keys)


@jax.jit
def _auto_reset_keys(keys):
    """The key `Env.step` resets an episode with."""
    return jax.vmap(lambda key: jax.random.split(key)[1])(keys)


@dataclasses.dataclass
class Schedule:
    """Keys and actions of every step for ``episodes`` parallel episodes, decided in advance."""

    reset_keys: jax.Array  # [episodes]
    step_keys: list  # [steps] of [episodes]
    actions: list  # [steps] of int32 numpy [episodes, ACTION_LENGTH]

    @property
    def episodes(self) -> int:
        return len(self.reset_keys)

    @property
    def env_steps(self) -> int:
        return len(self.step_keys) * self.episodes


def make_schedule(setup: Setup, episodes: int, steps: int, seed: int = 0) -> Schedule:
    """Turn ``t % TURNS`` of each episode's current task's demonstration at step ``t``; the
    tasks after each auto-reset (at the answering steps) follow from the step keys."""
    weights = setup.jitted.default_params.task_weights
    root = jax.random.split(jax.random.key(seed), steps + 1)
    reset_keys = jax.random.split(root[0], episodes)
    step_keys = [jax.random.split(k, episodes) for k in root[1:]]
    tasks = np.asarray(_reset_tasks(reset_keys, weights))
    actions = []
    for t, keys in enumerate(step_keys):
        actions.append(setup.demos[tasks, t % TURNS])
        if t % TURNS == TURNS - 1:  # every episode answered: auto-reset to the keys' tasks
            tasks = np.asarray(_reset_tasks(_auto_reset_keys(keys), weights))
    return Schedule(reset_keys, step_keys, actions)


@dataclasses.dataclass
class Played:
    seconds: (
        float  # the steps only (the reset is left out), until the last step's results are ready
    )
    env_steps: int  # counted: episodes in each batched step played
    history: list  # numpy (obs, reward, terminated, truncated, info) of every step, or of the last
    state: object  # the final state


def play(reset, step, params, schedule: Schedule, actions=None, record: bool = False) -> Played:
    """Resets, then plays every step of ``schedule`` (``actions``: the same actions, already on
    the device); ``record`` keeps every step's outputs, else only the last step's."""
    actions = schedule.actions if actions is None else actions
    _, state = jax.block_until_ready(reset(schedule.reset_keys, params))
    history, env_steps = [], 0
    start = time.perf_counter()
    for keys, action in zip(schedule.step_keys, actions):
        obs, state, reward, terminated, truncated, info = step(keys, state, action, params)
        env_steps += len(action)
        if record:
            history.append(jax.tree.map(np.asarray, (obs, reward, terminated, truncated, info)))
    jax.block_until_ready((obs, state, reward))
    seconds = time.perf_counter() - start
    if not record:
        history.append(jax.tree.map(np.asarray, (obs, reward, terminated, truncated, info)))
    return Played(seconds, env_steps, history, state)


@dataclasses.dataclass
class Result:
    episodes: int
    jitted_steps: int  # env steps counted, over all repeats
    host_steps: int
    jitted_s: float  # seconds of those steps
    host_s: float
    compile_s: float  # the jitted reset's and step's first calls at this batch size
    identical: bool  # both envs ended every repeat in the same state with the same outputs
    reward: float  # mean reward of the last (answering) step: 1.0 when the schedule fits the tasks

    @property
    def jitted_rate(self) -> float:
        return self.jitted_steps / self.jitted_s

    @property
    def host_rate(self) -> float:
        return self.host_steps / self.host_s

    @property
    def ratio(self) -> float:
        return self.jitted_rate / self.host_rate


def _same_state(jitted_state, host_state) -> bool:
    return all(
        np.array_equal(np.asarray(getattr(jitted_state, f.name)), getattr(host_state, f.name))
        for f in dataclasses.fields(host_state)
    )


def _same_outputs(jitted: Played, host: Played) -> bool:
    (j_obs, *j_out, j_info), (h_obs, *h_out, h_info) = jitted.history[-1], host.history[-1]
    return (
        _same_state(jitted.state, host.state)
        and all(np.array_equal(j_obs[k], h_obs[k]) for k in h_obs)
        and all(np.allclose(j, h, atol=1e-6) for j, h in zip(j_out, h_out))
        and all(np.array_equal(j_info[k], h_info[k]) for k in ("task", "tool_call"))
    )


def measure(setup: Setup, episodes: int, steps: int, repeats: int = 1, seed: int = 0) -> Result:
    """Both envs on the same schedule of ``steps`` batched steps of ``episodes`` episodes,
    ``repeats`` times in alternation (jitted, host, jitted, ...)."""
    schedule = make_schedule(setup, episodes, steps, seed)
    params, host_params = setup.jitted.default_params, setup.host.default_params
    device_actions = [jax.device_put(a) for a in schedule.actions]
    # Warm-up: compile the jitted reset and step (timed) and run one host step, results dropped.
    warm = Schedule(schedule.reset_keys, schedule.step_keys[:1], schedule.actions[:1])
    start = time.perf_counter()
    play(setup.reset, setup.step, params, warm, device_actions[:1])
    compile_s = time.perf_counter() - start
    play(setup.host.reset, setup.host.step, host_params, warm)

    counts, seconds, identical = np.zeros(2, int), np.zeros(2), True
    for _ in range(repeats):
        jitted = play(setup.reset, setup.step, params, schedule, device_actions)
        host = play(setup.host.reset, setup.host.step, host_params, schedule)
        counts += (jitted.env_steps, host.env_steps)
        seconds += (jitted.seconds, host.seconds)
        identical &= _same_outputs(jitted, host)
    answering = (steps - 1) % TURNS == TURNS - 1
    reward = float(np.mean(host.history[-1][1])) if answering else float("nan")
    return Result(episodes, *map(int, counts), *map(float, seconds), compile_s, identical, reward)


def table(results) -> str:
    lines = [
        "| episodes | jitted steps/s | host steps/s | ratio | steps counted (each) | "
        "compile s | identical |",
        "|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in results:
        counted = (
            f"{r.jitted_steps:,}"
            if r.jitted_steps == r.host_steps
            else f"{r.jitted_steps:,} / {r.host_steps:,}"
        )
        lines.append(
            f"| {r.episodes:,} | {r.jitted_rate:,.0f} | {r.host_rate:,.0f} | {r.ratio:,.1f}x | "
            f"{counted} | {r.compile_s:.1f} | {'yes' if r.identical else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets (smoke test)")
    args = parser.parse_args(argv)
    budget, repeats = (QUICK_STEPS, QUICK_REPEATS) if args.quick else (BATCHED_STEPS, REPEATS)
    print(f"device: {describe_device()}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        tokenizer = make_tokenizer(directory)
    setup = make_setup(tokenizer)
    print(
        f"Arithmetic({DIFFICULTY}) with the calculator: {NUM_TASKS} tasks, demonstrations replayed "
        f"({TURNS} steps per episode: 2 calls, 1 answer), action {ACTION_LENGTH} tokens, "
        f"transcript {MAX_LENGTH}; setup {time.perf_counter() - start:.1f} s\n"
    )
    results = []
    for episodes in EPISODES:
        r = measure(setup, episodes, budget[episodes], repeats)
        results.append(r)
        print(
            f"  {episodes:>5} episodes x {budget[episodes]} batched steps x {repeats}: "
            f"jitted {r.jitted_s:.2f} s, host {r.host_s:.2f} s, last-step reward {r.reward:.2f}",
            flush=True,
        )
    print()
    print(table(results))
    setup.host.pool.close()
    if not all(r.identical and r.reward == 1.0 for r in results):
        raise SystemExit("the two envs did not do the same work (see the table)")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
