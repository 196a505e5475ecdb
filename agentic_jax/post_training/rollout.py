"""Episodes of a policy in a text environment: the samples every online trainer learns from.

One call plays ``G`` episodes of each given task (rows ``i*G .. i*G+G-1`` share task ``i``, the
grouping group-relative baselines need).  Each turn the policy generates one assistant turn per
unfinished row with the KV-cache decoder (``inference.decoding.generate``: a jitted prefill and
``while_loop``; the transcripts are right-padded prompts of the env's fixed ``max_length``, so
every turn of every call reuses one compiled program), and the environment executes tool calls
or scores the answer: the jitted ``TextEnv.step_env``, or the host-side ``HostTextEnv.step_env``
whose tools run in Python (the sandbox, any function) between decode segments.  The policy sees
``tokens[context_start:length]``: the whole transcript, unless the env cleared the context for
a new session (``envs.text.MemoryEnv``); ``sessions`` then marks each token's session.  Finished rows are
frozen (no auto-reset): the final transcript of row ``b`` is ``tokens[b, :length[b]]`` with the
policy's own tokens marked by ``loss_mask`` -- a training row for ``rl.policy_loss`` as it stands.

**Token in, token out.**  The transcript holds exactly the ids the sampler produced, and the tool
messages the environment appended as ids (tokenized once): a trainer learns on these ids, never on
re-tokenised text.  ``behaviour_logp`` holds the sampler's log-probability of each policy token
(under the distribution it was drawn from), aligned with ``tokens``; ``turn_spans`` give each
turn's token span and ``turn_rewards`` what it earned.
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.envs.host import HostTextEnv
from agentic_jax.envs.text import TextEnv, Vocab
from agentic_jax.inference.decoding.generate import generate
from agentic_jax.inference.decoding.prompts import PromptBatch
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.engine import Engine, EngineConfig, Request
from agentic_jax.models import TransformerConfig


class Rollouts(NamedTuple):
    """``B = tasks × G`` finished episodes (numpy, host side)."""

    tokens: np.ndarray  # int32 [B, L]: prompt, policy turns and tool messages; PAD after length
    loss_mask: np.ndarray  # int32 [B, L]: 1 on the policy's tokens
    length: np.ndarray  # int32 [B]
    reward: np.ndarray  # float32 [B]: the verifier's reward (0 when truncated)
    success: np.ndarray  # bool [B]: reward >= success_threshold
    task: np.ndarray  # int32 [B]: bank row
    turns: np.ndarray  # int32 [B]: assistant turns taken
    tool_calls: np.ndarray  # int32 [B]
    truncated: np.ndarray  # bool [B]: out of turns or tokens before answering
    behaviour_logp: np.ndarray  # float32 [B, L]: the sampler's log-prob of each policy token
    turn_rewards: np.ndarray  # float32 [B, K]: what each turn earned (the answer: the verifier's)
    turn_spans: np.ndarray  # int32 [B, K, 2]: [start, end) of each turn's policy tokens
    turn_mask: np.ndarray  # int32 [B, K]: 1 on the turns the episode took
    milestones: np.ndarray  # int32 [B, K]: milestones reached after each turn (a potential)
    generation_seconds: float
    # int32 [B, L]: the session of each token (all 0 unless episodes span sessions: then the
    # learner scores each session in its own context, as it was sampled; `envs.text.MemoryEnv`)
    sessions: np.ndarray | None = None

    @property
    def response_length(self) -> np.ndarray:
        """Policy tokens per episode (all its turns)."""
        return self.loss_mask.sum(axis=1)

    @property
    def last_turn(self) -> np.ndarray:
        """int32 ``[B, K]``: 1 on each episode's last turn (where episode-level terms go)."""
        index = np.arange(self.turn_mask.shape[1])
        return (self.turn_mask * (index == self.turns[:, None] - 1)).astype(np.int32)

    @property
    def sample_counts(self) -> dict:
        """What these rollouts spent of a sample budget: ``episodes`` and ``generated_tokens``
        (the policy's tokens; tool messages are the environment's)."""
        return {"episodes": len(self.reward), "generated_tokens": int(self.loss_mask.sum())}

    def rows(self, start: int, stop: int) -> Rollouts:
        """Episodes ``start .. stop - 1`` (the generation time stays whole)."""
        return Rollouts(*[f[start:stop] if isinstance(f, np.ndarray) else f for f in self])

    @staticmethod
    def concat(parts) -> Rollouts:
        """The episodes of ``parts`` one after the other, with their generation times summed."""
        return Rollouts(
            *[np.concatenate(f) if isinstance(f[0], np.ndarray) else sum(f) for f in zip(*parts)]
        )

    def group(self, values: np.ndarray, group_size: int) -> np.ndarray:
        """``[tasks, G]`` view of a per-row array."""
        return np.asarray(values).reshape(-1, group_size)


def _context(state) -> tuple[np.ndarray, np.ndarray]:
    """What the policy sees of each row: ``tokens[context_start:length]`` moved to the front
    (the whole transcript unless an episode's context was cleared for a new session)."""
    tokens, length = np.asarray(state.tokens), np.asarray(state.length)
    start = np.asarray(state.context_start)
    if not start.any():
        return tokens, length
    index = np.minimum(np.arange(tokens.shape[1])[None] + start[:, None], tokens.shape[1] - 1)
    return np.take_along_axis(tokens, index, axis=1), length - start


def _freeze(active: np.ndarray, new, old):
    """``new`` on the rows still playing, ``old`` on finished ones (numpy or jax states)."""

    def select(n, o):
        xp = np if isinstance(n, np.ndarray) else jnp
        return xp.where(xp.asarray(active).reshape((-1,) + (1,) * (n.ndim - 1)), n, o)

    return jax.tree.map(select, new, old)


ROLLOUT_BACKENDS = ("generate", "engine")


def _engine_turn(engine: Engine, state, active, sampling, key, action_length, pad_id):
    """One turn of every active row through ``engine``: ``(actions [B, A], log-probs [B, A])``.

    Each row's request carries a seed drawn from ``key``, so its tokens depend on the row and the
    key alone, not on how the engine batched it."""
    tokens, length = _context(state)
    b = tokens.shape[0]
    seeds = np.asarray(jax.random.randint(key, (b,), 0, 2**31 - 1))
    rows = np.flatnonzero(active)
    requests = [
        Request(
            tokens[row, : length[row]].tolist(),
            dataclasses.replace(sampling, seed=int(seeds[row])),
            request_id=f"row{row}",
        )
        for row in rows
    ]
    actions = np.full((b, action_length), pad_id, np.int32)
    logp = np.zeros((b, action_length), np.float32)
    for row, done in zip(rows, engine.generate(requests)):
        n = len(done.tokens)
        actions[row, :n], logp[row, :n] = done.tokens, done.sample_logprobs
    return actions, logp


def collect(
    params,
    config: TransformerConfig,
    env: TextEnv | HostTextEnv,
    env_params,
    tasks,
    *,
    group_size: int = 1,
    sampling: SamplingParams = SamplingParams(temperature=1.0),
    key,
    success_threshold: float = 0.5,
    backend="generate",
    engine_slots: int = 16,
) -> Rollouts:
    """Plays ``group_size`` episodes of each bank row in ``tasks`` with the policy ``params``.

    ``env`` is a jitted `TextEnv` or a `HostTextEnv` (its tools run on the host between decode
    segments, batched over the rows waiting on a tool; a slow, failing or hung tool becomes an
    error tool message, never an exception).  ``sampling.max_tokens`` is replaced by the env's
    ``action_length``; a turn ends at ``<|im_end|>`` (or EOS).  ``key`` makes the whole call
    reproducible.

    ``backend``: ``"generate"`` decodes every row of the batch in one padded, jitted
    ``generate`` per turn (finished rows included, until the longest turn ends);
    ``"engine"`` sends each unfinished row's turn to the serving engine (paged KV cache,
    continuous batching over ``engine_slots`` slots, prefix caching across the turns of an
    episode), so a short turn frees its slot at once and finished episodes cost nothing.  A
    callable ``backend(tokens [B, L], length [B], active [B], key) -> (actions [B, A],
    logprobs [B, A])`` decodes the turns itself (a scripted policy in tests, another sampler).
    """
    if not callable(backend) and backend not in ROLLOUT_BACKENDS:
        raise ValueError(f"backend={backend!r}; expected one of {ROLLOUT_BACKENDS} or a callable")
    tasks = np.repeat(np.asarray(tasks, np.int32), group_size)
    if tasks.size == 0:
        raise ValueError("collect needs at least one task")
    if config.max_seq_len < env.max_length + env.action_length:
        raise ValueError(
            f"the model's max_seq_len={config.max_seq_len} is shorter than the env's "
            f"max_length + action_length = {env.max_length + env.action_length}"
        )
    reset, step = env.batched
    vocab = Vocab.build(env.tokenizer) if isinstance(env, HostTextEnv) else env_params.vocab
    im_end_id = env.im_end_id
    stop_ids = tuple(i for i in vocab.stop_ids if i != im_end_id)
    base = dataclasses.replace(
        sampling,
        max_tokens=env.action_length,
        stop_token_ids=tuple(sampling.stop_token_ids) + stop_ids,
    )
    finished_turn = dataclasses.replace(base, max_tokens=1)
    b = tasks.size
    max_turns = int(env_params.max_turns)
    _, state = reset(tasks if isinstance(env, HostTextEnv) else jnp.asarray(tasks), env_params)
    done = np.zeros(b, bool)
    reward, truncated = np.zeros(b, np.float32), np.zeros(b, bool)
    turns, tool_calls = np.zeros(b, np.int32), np.zeros(b, np.int32)
    behaviour = np.zeros((b, env.max_length), np.float32)
    turn_rewards = np.zeros((b, max_turns), np.float32)
    turn_spans = np.zeros((b, max_turns, 2), np.int32)
    milestones = np.zeros((b, max_turns), np.int32)
    sessions = np.zeros((b, env.max_length), np.int32)
    engine = None
    if backend == "engine":
        engine_config = EngineConfig(
            num_slots=min(engine_slots, b), max_model_len=env.max_length + env.action_length
        )
        engine = Engine(params, config, engine_config, eos_id=im_end_id)
    gen_seconds = 0.0
    for turn in range(max_turns):
        if done.all():
            break
        turn_key, step_key = jax.random.split(jax.random.fold_in(key, turn))
        start = time.perf_counter()
        if callable(backend):
            actions, sampled_logp = backend(*_context(state), ~done, turn_key)
            actions, sampled_logp = np.asarray(actions, np.int32), np.asarray(sampled_logp)
        elif engine is None:
            context, context_length = _context(state)
            prompts = PromptBatch(
                jnp.asarray(context), jnp.zeros((b,), jnp.int32), jnp.asarray(context_length)
            )
            result = generate(
                params,
                config,
                prompts,
                key=turn_key,
                eos_id=im_end_id,
                pad_id=vocab.pad_id,
                padding="right",
                sampling=[finished_turn if d else base for d in done],
            )
            jax.block_until_ready(result.tokens)
            actions, sampled_logp = result.tokens, np.asarray(result.sample_logprobs)
        else:
            actions, sampled_logp = _engine_turn(
                engine, state, ~done, base, turn_key, env.action_length, vocab.pad_id
            )
        gen_seconds += time.perf_counter() - start
        _, new_state, r, term, trunc, info = step(
            jax.random.split(step_key, b), state, actions, env_params
        )
        new_start = np.asarray(new_state.context_start)
        for row in np.flatnonzero(~done & (new_start != np.asarray(state.context_start))):
            sessions[row, new_start[row] :] += 1  # a new session: a segment of its own
        state = _freeze(~done, new_state, state)
        r, term, trunc, tool = (np.asarray(x) for x in (r, term, trunc, info["tool_call"]))
        active = ~done
        span_start, span_length = np.asarray(info["turn_start"]), np.asarray(info["turn_length"])
        for row in np.flatnonzero(active):
            begin, n = span_start[row], span_length[row]
            behaviour[row, begin : begin + n] = sampled_logp[row, :n]
        turn_spans[active, turn] = np.stack([span_start, span_start + span_length], 1)[active]
        turn_rewards[active, turn] = r[active]
        milestones[active, turn] = np.asarray(info["milestones"])[active]
        reward = np.where(done, reward, np.where(tool, 0.0, r))
        truncated |= active & trunc
        turns += active
        tool_calls += active & tool
        done |= term | trunc
    tokens, loss_mask, length = (
        np.asarray(x) for x in (state.tokens, state.loss_mask, state.length)
    )
    turn_mask = (np.arange(max_turns)[None] < turns[:, None]).astype(np.int32)
    return Rollouts(
        tokens,
        loss_mask,
        length,
        reward,
        reward >= success_threshold,
        tasks,
        turns,
        tool_calls,
        truncated | ~done,
        behaviour * loss_mask,
        turn_rewards,
        turn_spans,
        turn_mask,
        milestones,
        gen_seconds,
        sessions,
    )
