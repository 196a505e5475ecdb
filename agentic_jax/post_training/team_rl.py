"""Teams that learn: a solver and a verifier, one shared policy, trained with per-role advantages.

Each step (:func:`team_step`) plays one team episode per solver sample:

1. the **solver** answers a training problem as `train_rl`'s episodes do (tools allowed):
   ``group_size`` episodes of each of ``prompts_per_step`` problems (`post_training.rl.sample`);
2. the **verifier** sees the problem and the solver's final answer as a message (the text inside
   its ``<answer>…</answer>``, never its thinking or tool calls; empty when it gave none) and
   replies ``<answer>yes</answer>`` or ``<answer>no</answer>``: its turn is decoded under a regex
   constraint (``inference.decoding.constrained``, Willard & Louf 2023), so every verdict parses.

Both roles are the same model with a role prompt each (parameter sharing: the task's own
prompt for the solver, `TeamRLConfig.verifier_prompt` for the verifier), so one `RLSetup`,
one optimiser and one compiled update serve the team, and a LoRA ``finetune`` trains one
adapter for both.  (An adapter per role would need two trainable trees behind one update.)

**Rewards per role.**  The solver earns the task's verifier reward (the ground truth, shaped as
`post_training.rl.score` shapes it); the verifier earns 1 exactly when its verdict matches the
ground truth (yes when the solver succeeded, no otherwise: `envs.text.ExactAnswer` on the
verdict).  Each role's reward is charged ``cost_per_token`` per token it generated and
``cost_per_message`` per message it wrote (its assistant turns; tool results are the
environment's).  The team answers with the solver's answer when the verifier accepts it and
abstains otherwise: a step logs the solver's success beside the team's precision (correct
among accepted) and acceptance rate.

**Per-role advantages.**  GRPO's group baseline is taken within each role's group apart: the
solver's G episodes of one problem, and the verifier's G verdicts on those G answers
(`post_training.rl.advantages`, hence ``rl.group_advantages``, once per role).
``schedule="joint"`` takes one `post_training.rl.learn` pass (the same compiled update) over
both roles' rows; ``"alternate"`` trains the solver on odd steps and the verifier on even ones
(both roles play every step, so every step logs the team).  The learner scores the verdict's
tokens under the unconstrained policy, as GRPO on constrained generations does: the constraint
fixes the format, the policy still picks the verdict.
"""

from __future__ import annotations

import dataclasses
import time

import gin
import jax.numpy as jnp
import numpy as np

from agentic_jax.data.chat import Message
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.host import HostTextEnv
from agentic_jax.envs.text import ChatMarkers, ExactAnswer, Task, TextEnv
from agentic_jax.envs.text.rewards import answer_text
from agentic_jax.inference.decoding.constrained import (
    TokenConstraint,
    regex_constraint,
    token_bytes,
)
from agentic_jax.inference.decoding.generate import generate
from agentic_jax.inference.decoding.prompts import PromptBatch
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models import TransformerConfig
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.common import tree_fingerprint
from agentic_jax.post_training.monitors import MonitorConfig
from agentic_jax.post_training.rl import (
    Learner,
    RLConfig,
    RLSetup,
    Samples,
    Scores,
    StepRandom,
    advantages,
    learn,
    make_setup,
    next_learner,
    run_steps,
    sample,
    score,
    summarize,
)
from agentic_jax.post_training.rollout import Rollouts, collect
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.update import FullFinetune

ROLES = ("solver", "verifier")
SCHEDULES = ("joint", "alternate")
VERDICTS = ("yes", "no")
VERDICT_REGEX = "<answer>(yes|no)</answer>"
# The most tokens a constrained verdict takes: one byte a token, then the end of the turn.
VERDICT_LENGTH = max(len(f"<answer>{v}</answer>".encode()) for v in VERDICTS) + 1
# The verifier samples with the key of a solver sampling round that never runs (dynamic
# sampling, the only way to a second round, is refused), so the two draw independent tokens.
VERIFIER_ROUND = 1


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TeamRLConfig:
    """The team's options (see the module docstring); the algorithm is a `post_training.rl.RLConfig`."""

    schedule: str = "joint"  # "joint": both roles each step; "alternate": solver, verifier, ...
    cost_per_token: float = 0.0  # λ: each role's reward minus λ · the tokens it generated
    cost_per_message: float = 0.0  # and minus this per message it wrote
    verifier_prompt: str = (
        "Is the proposed answer correct? Reply <answer>yes</answer> or <answer>no</answer>."
    )

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"TeamRLConfig.schedule={self.schedule!r}; expected one of {SCHEDULES}"
            )
        for name in ("cost_per_token", "cost_per_message"):
            if getattr(self, name) < 0:
                raise ValueError(f"TeamRLConfig.{name}={getattr(self, name)} must be >= 0")


def check_algorithm(algo: RLConfig) -> None:
    """Refuses, by name, the `RLConfig` options a team cannot train with."""
    refused = (
        ("advantage='gae'", algo.advantage == "gae", "the roles' baselines are group-relative"),
        ("credit='turn'", algo.credit != "episode", "the costs are charged per episode"),
        ("slice_turns", algo.slice_turns, "the verifier's episodes are one turn"),
        (
            "dynamic_sampling",
            algo.dynamic_sampling,
            "dropping a solver group would leave its verifier group without answers",
        ),
        ("episode_budget", algo.episode_budget is not None, "the team runs for `steps` steps"),
        (
            "correction",
            algo.correction is not None,
            "the verdicts' sampler is the constrained policy, which the learner does not score",
        ),
        ("distill_coef", algo.distill_coef > 0, "the privileged hints are the solver's alone"),
    )
    for name, bad, why in refused:
        if bad:
            raise ValueError(f"team RL does not take RLConfig.{name}: {why}")


@dataclasses.dataclass(frozen=True)
class TeamSetup:
    """What stays fixed during a team run: the shared policy's `RLSetup` (the solver's env) and
    what the verifier's episodes need."""

    rl: RLSetup
    team: TeamRLConfig
    tasks: tuple[Task, ...]  # the solver env's problems in bank order
    markers: ChatMarkers  # the template the verifier's prompts are rendered in
    constraint: TokenConstraint  # the verdict's regex over the model's vocabulary

    @property
    def tokenizer(self) -> Tokenizer:
        return self.rl.env.tokenizer


def make_team_setup(
    config: TransformerConfig,
    base,
    env: TextEnv,
    tasks,
    algo: RLConfig,
    team: TeamRLConfig,
    *,
    steps: int,
    peak_lr: float,
    warmup_steps: int = 0,
    finetune=FullFinetune(),
    seed: int = 0,
) -> TeamSetup:
    """The fixed part of a team run: ``rl.make_setup`` over the solver's ``env`` (``tasks``:
    its problems in bank order) and the verdict's constraint."""
    check_algorithm(algo)
    tasks = tuple(tasks)
    if len(tasks) != int(np.shape(env.default_params.task_weights)[0]):
        raise ValueError(
            f"make_team_setup got {len(tasks)} tasks for an env of "
            f"{np.shape(env.default_params.task_weights)[0]} problems; pass the env's own"
        )
    if config.max_seq_len < env.max_length + VERDICT_LENGTH:
        raise ValueError(
            f"the model's max_seq_len={config.max_seq_len} < the env's max_length + the "
            f"verdict's {VERDICT_LENGTH} tokens = {env.max_length + VERDICT_LENGTH}"
        )
    setup = make_setup(
        config,
        base,
        env,
        algo,
        steps=steps,
        peak_lr=peak_lr,
        warmup_steps=warmup_steps,
        finetune=finetune,
        seed=seed,
    )
    markers = ChatMarkers.build(env.tokenizer, calls=False)
    constraint = regex_constraint(
        VERDICT_REGEX, token_bytes(env.tokenizer, config.vocab_size), markers.end_of_turn_id
    )
    return TeamSetup(setup, team, tasks, markers, constraint)


# ----------------------------------------------------------------------------- the verifier
def final_answers(rollouts: Rollouts, tokenizer: Tokenizer) -> list[str]:
    """Each episode's final answer: the text inside its last turn's ``<answer>…</answer>``, ""
    when the episode was truncated or its last turn holds none (its reasoning never shows)."""
    out = []
    for row in range(len(rollouts.length)):
        start, end = rollouts.turn_spans[row, max(int(rollouts.turns[row]) - 1, 0)]
        text = tokenizer.decode(rollouts.tokens[row, start:end], skip_special_tokens=True)
        answer = None if rollouts.truncated[row] else answer_text(text)
        out.append(answer or "")
    return out


def verification_task(
    setup: TeamSetup, task: Task, proposal: str, correct: bool, room: int
) -> Task:
    """The verifier's problem: its role prompt, then ``task``'s question and the ``proposal``
    as one user message; the answer is the right verdict.  The proposal loses as many tokens
    from its end as the rendered prompt exceeds ``room`` by, until it fits (or is empty)."""
    question = next(m.content for m in reversed(task.prompt) if m.role == "user")
    ids = setup.tokenizer.encode(proposal, special=False)
    while True:
        shown = setup.tokenizer.decode(ids)
        prompt = (
            Message("system", setup.team.verifier_prompt),
            Message("user", f"Problem: {question}\nProposed answer: {shown}"),
        )
        over = len(setup.markers.prompt_ids(prompt, setup.tokenizer)) - room
        if over <= 0 or not ids:
            return Task(prompt, VERDICTS[0] if correct else VERDICTS[1])
        ids = ids[: len(ids) - over]


def _verdict_decoder(params, config: TransformerConfig, setup: TeamSetup, env: HostTextEnv):
    """`rollout.collect`'s decoder for the verifier's one turn: ``generate`` under the verdict's
    constraint."""
    sampling = SamplingParams(temperature=setup.rl.algo.temperature, max_tokens=VERDICT_LENGTH)

    def decode(tokens, length, active, key):
        del active  # one turn: every row plays it
        prompts = PromptBatch(
            jnp.asarray(tokens), jnp.zeros(len(length), jnp.int32), jnp.asarray(length)
        )
        result = generate(
            params,
            config,
            prompts,
            sampling=sampling,
            key=key,
            eos_id=env.im_end_id,
            pad_id=env.pad_id,
            padding="right",
            constraint=setup.constraint,
        )
        return result.tokens, result.sample_logprobs

    return decode


def verify(setup: TeamSetup, learner: Learner, solver: Samples, rand: StepRandom) -> Samples:
    """The verifier's episodes, row ``b`` judging the solver's episode ``b`` (so each solver
    group's G answers get a verifier group of G verdicts), with the sampler's policy."""
    rollouts, max_length = solver.rollouts, setup.rl.env.max_length
    tasks = [
        verification_task(setup, setup.tasks[t], proposal, bool(ok), max_length - VERDICT_LENGTH)
        for t, proposal, ok in zip(
            rollouts.task, final_answers(rollouts, setup.tokenizer), rollouts.success
        )
    ]
    env = HostTextEnv(
        setup.tokenizer,
        tasks,
        ExactAnswer(),
        max_length=max_length,
        action_length=VERDICT_LENGTH,
        max_turns=1,
    )
    params, config = setup.rl.sampler(learner)
    start = time.perf_counter()
    verdicts = collect(
        params,
        config,
        env,
        env.default_params,
        np.arange(len(tasks)),
        key=rand.rollout_key(VERIFIER_ROUND),
        backend=_verdict_decoder(params, config, setup, env),
    )
    group_size = setup.rl.algo.group_size
    return Samples(
        verdicts,
        solver.row_kept,
        1,
        1.0 - float((verdicts.group(verdicts.reward, group_size).std(axis=1) > 0).mean()),
        solver.curriculum,
        solver.position,
        time.perf_counter() - start,
        **verdicts.sample_counts,
    )


# ----------------------------------------------------------------------------- rewards, advantages
def usage(rollouts: Rollouts) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, messages)`` per episode of one role: the tokens it generated (every turn's)
    and the messages it wrote (its assistant turns)."""
    return rollouts.response_length, rollouts.turns


def score_roles(setup: TeamSetup, learner: Learner, roles: dict[str, Samples]) -> dict[str, Scores]:
    """``rl.score`` of each role's episodes, each reward charged its role's token and message
    cost: r − ``cost_per_token`` · tokens − ``cost_per_message`` · messages."""
    team, out = setup.team, {}
    for role, samples in roles.items():
        scores = score(setup.rl, learner, samples)
        tokens, messages = usage(samples.rollouts)
        cost = team.cost_per_token * tokens + team.cost_per_message * messages
        out[role] = scores._replace(rewards=(scores.rewards - cost).astype(np.float32))
    return out


def roles_trained(schedule: str, step: int) -> tuple[str, ...]:
    """The roles whose tokens step ``step`` trains: both (joint), or solver on odd steps and
    verifier on even ones (alternate)."""
    return ROLES if schedule == "joint" else (ROLES[(step - 1) % len(ROLES)],)


def team_batch(
    setup: TeamSetup,
    learner: Learner,
    roles: dict[str, Samples],
    scores: dict[str, Scores],
    trained: tuple[str, ...],
) -> dict:
    """The training rows of the ``trained`` roles, one after the other, each role's advantages
    group-relative within its own groups (``rl.advantages`` per role)."""
    parts = [advantages(setup.rl, learner, roles[r], scores[r])[0] for r in trained]
    return {k: jnp.concatenate([p[k] for p in parts]) for k in parts[0]}


def team_metrics(setup: TeamSetup, roles: dict[str, Samples], scores: dict[str, Scores]) -> dict:
    """The team's record beside the solver's: verdict accuracy, acceptance, precision (correct
    among accepted; absent when nothing was accepted), each role's tokens, messages and
    charged reward per episode."""
    solver, verifier = roles["solver"].rollouts, roles["verifier"].rollouts
    accepted = np.asarray(final_answers(verifier, setup.tokenizer)) == VERDICTS[0]
    record = {
        "verdict_accuracy": float(verifier.reward.mean()),
        "team_accept_rate": float(accepted.mean()),
        "team_success": float((accepted & solver.success).mean()),
    }
    if accepted.any():
        record["team_precision"] = float(solver.success[accepted].mean())
    for role in ROLES:
        tokens, messages = usage(roles[role].rollouts)
        record[f"{role}_tokens"] = float(tokens.mean())
        record[f"{role}_messages"] = float(messages.mean())
        record[f"{role}_role_reward"] = float(scores[role].rewards.mean())
    return record


# ----------------------------------------------------------------------------- one step, the run
def team_step(setup: TeamSetup, learner: Learner, step: int) -> tuple[Learner, dict]:
    """One step: the solver's episodes → the verifier's → per-role scores and advantages → one
    ``rl.learn`` over the trained roles' rows → the record (``rl.summarize`` of the solver's
    episodes and the updates, plus `team_metrics`).  A function of the learner and
    ``(seed, step)`` alone."""
    rand = StepRandom(setup.rl.seed, step)
    roles = {"solver": sample(setup.rl, learner, rand)}
    roles["verifier"] = verify(setup, learner, roles["solver"], rand)
    start = time.perf_counter()
    scores = score_roles(setup, learner, roles)
    trained = roles_trained(setup.team.schedule, step)
    batch = team_batch(setup, learner, roles, scores, trained)
    policy, _, updates = learn(setup.rl, learner, batch, None, rand)
    record = {"step": step}
    record |= summarize(
        roles["solver"],
        scores["solver"],
        updates,
        training_seconds=time.perf_counter() - start,
        group_size=setup.rl.algo.group_size,
    )
    record.update(team_metrics(setup, roles, scores))
    record.update(roles_trained=list(trained), verification_seconds=roles["verifier"].seconds)
    return next_learner(learner, policy, None, roles["solver"]), record


@gin.configurable
def train_team_rl(
    workdir: str,
    *,
    init_from: str,
    team: TeamRLConfig = TeamRLConfig(),
    tasks: TaskSpec = TaskSpec(),
    algorithm: RLConfig = RLConfig(),
    steps: int = 50,
    peak_lr: float = 1e-5,
    warmup_steps: int = 0,
    finetune=FullFinetune(),
    eval_every: int = 0,
    eval_samples: int = 4,
    checkpoint_every: int = 10,
    seed: int = 0,
    progress: bool = True,
    monitor: MonitorConfig = MonitorConfig(),
) -> dict:
    """Trains the model of run ``init_from`` as a solver-verifier team on ``tasks``' train
    problems (`team_step` each step); saves ``workdir/model``, resumes from its checkpoints.

    The reference model for the KL term is ``init_from``'s.  ``eval_every`` > 0 evaluates the
    solver alone on the held-out problems (greedy success, pass@k of ``eval_samples``) every
    that many steps, before the first and at the end.  The steps run in `rl.run_steps`, the loop
    `train_rl` runs: the same progress bar, stability alarms (``monitor``) and checkpoints.
    Returns the last step's record."""
    config, base, tokenizer = load_checkpoint(init_from)
    setup = make_team_setup(
        config,
        base,
        tasks.env(tokenizer, "train"),
        tasks.tasks("train"),
        algorithm,
        team,
        steps=steps,
        peak_lr=peak_lr,
        warmup_steps=warmup_steps,
        finetune=finetune,
        seed=seed,
    )
    return run_steps(
        workdir,
        setup.rl,
        lambda learner, step: team_step(setup, learner, step),
        tasks.env(tokenizer, "heldout"),
        tokenizer,
        meta={"init_from": init_from, "reference": tree_fingerprint(base)},
        steps=steps,
        eval_every=eval_every,
        eval_samples=eval_samples,
        checkpoint_every=checkpoint_every,
        monitor=monitor,
        progress=progress,
        desc="team rl",
    )
