"""Stability monitoring for online RL on agent tasks: per-step collapse signals and alarms.

Multi-turn agent RL fails in a few recurring ways, and each leaves a trace in the step's
episodes or metrics well before the reward curve shows it.  This module computes those traces
(:func:`step_diagnostics`, numpy on the host, from the episodes ``train_rl`` samples) and
watches them over the run (:class:`StabilityMonitor`, configured by :class:`MonitorConfig`),
raising :class:`Alarm` s, and, for the alarms named in ``MonitorConfig.stop_on``, letting the
trainer stop the run with :class:`RLStopped`.

Notation: a step has ``B = P·G`` episodes, ``P`` groups of ``G = group_size`` consecutive
episodes that share a prompt; episode ``i`` has reward ``r_i``, response length ``L_i``,
final answer ``a_i`` and response token-set ``S_i`` (the distinct token ids of its response);
``g`` runs over groups, ``J(S, S') = |S ∩ S'| / |S ∪ S'|`` is the Jaccard overlap (1 for two
empty sets).

Per-step signals (:func:`step_diagnostics`)
-------------------------------------------
``reward_std_within_group``
    ``(1/P) Σ_g std(r_i : i ∈ g)`` (population std).  RAGEN's **Echo Trap** (Wang et al.
    2025, "RAGEN: Understanding Self-Evolution in LLM Agents via Multi-Turn Reinforcement
    Learning", arXiv:2504.20073): the agent overfits to a few self-reinforced reasoning
    patterns; within-group reward variability falls off a cliff and gradient norms spike,
    shortly *before* reward collapses.  With group-relative advantages this quantity is also the
    size of the learning signal: RAGEN-2 (below) explains template collapse by it (low reward
    variance → weak task gradient → the KL/entropy regularisers dominate).
``distinct_answers``
    ``(1/P) Σ_g |{a_i : i ∈ g}| / G`` ∈ [1/G, 1]: answer diversity within a group; 1/G when
    every episode of every group answers the same (the diversity collapse of the Echo Trap, but
    also what a policy that has learnt the task looks like; hence its alarm is off by default).
``pairwise_overlap``
    ``(1/P) Σ_g mean_{i<j ∈ g} J(S_i, S_j)`` ∈ [0, 1]: how alike a group's responses are
    token-wise (1: the same bag of tokens).  Needs ``G ≥ 2``.
``prompt_response_mi``
    Template collapse (Wang, Gui et al. 2026, "RAGEN-2: Reasoning Collapse in Agentic RL",
    arXiv:2604.06268): responses stay diverse (entropy looks healthy) but stop depending on the
    input.  RAGEN-2 splits reasoning quality into within-input diversity (entropy,
    ``H(R | P)``) and cross-input distinguishability, the mutual information ``I(P; R)``, which
    they estimate online from in-batch cross-scoring and find tracks final performance far
    better than entropy.  The proxy here is model-free and host-only: the **InfoNCE lower bound**
    (van den Oord et al. 2018, arXiv:1807.03748; Poole et al. 2019, "On Variational Bounds of
    Mutual Information", arXiv:1905.06922) with a token-overlap critic.  The prompts are the
    ``K`` distinct prompts of the batch (groups with equal ``prompt_ids`` are one prompt); each
    response ``i`` (of prompt ``c_i``) is scored against each prompt ``c`` by its mean overlap
    with the *other* responses to ``c`` (leave-one-out, so a response never matches itself)::

        s_i(c) = mean_{j ∈ c, j ≠ i} J(S_i, S_j)
        q_i    = exp(s_i(c_i)/τ) / Σ_c exp(s_i(c)/τ)          (τ = mi_temperature, 0.05)
        Î      = log K + mean_i log q_i                        (nats; ≤ log K)
        prompt_response_mi = max(0, Î / log K)                 ∈ [0, 1]

    ``Î ≤ I(P; R)`` for any critic (up to sampling noise), so the max with 0 is still a lower
    bound, and dividing by ``log K = H(P)`` makes it a fraction of the prompt's entropy that the
    responses carry, comparable across batch sizes.  It is exactly 0 when every prompt gets the
    same response (all ``s_i(c)`` equal, ``q_i = 1/K``), ≈ 1 when each prompt's responses share
    tokens only with each other, and 0 when ``K = 1`` (a single prompt carries no information).
    Why this proxy: it needs no forward passes (RAGEN-2's cross-scoring evaluates each response's
    likelihood under every prompt), it is a real bound on ``I(P; R)`` rather than a plug-in
    estimate (which, with every sampled response distinct, reads ``log K`` even for
    prompt-independent noise), and it costs one sparse ``B × B`` product.  Responses whose prompt
    has no other response (``G = 1``) cannot be scored; with none scorable the key is left out.
    Its scale depends on ``τ`` (smaller: more sensitive, noisier) and its noise floor on the
    batch: with prompt-independent random responses it reads ≈ 0.003 on average for 8 prompts ×
    8 episodes but ≈ 0.02 for 2 × 8 (the max with 0 biases small batches upwards), so compare
    values at one batch shape and ``τ``.
``reward_length_corr``
    Pearson ``corr(r, L)`` over the batch (0 when either is constant).  Optimising length is the
    classic reward hack (Singhal et al. 2023, "A Long Way to Go: Investigating Length
    Correlations in RLHF", arXiv:2310.03716); a verifier whose reward grows with length
    (partial credit per tool call, per line) invites it.
``is_ess``
    Kish/Kong effective-sample-size fraction of importance weights ``w`` (token ratios
    ``π_θ / π_sampler`` ``[B, T]``, or sequence ratios ``[B]``) over the ``n`` nonzero ones:
    ``(Σw)² / (n Σw²)`` ∈ (0, 1], 1 for equal weights, → 1/n when one weight dominates (Kong
    1992; Elvira, Martino & Robert, "Rethinking the Effective Sample Size", arXiv:1809.04129).
    Off-policy / asynchronous LLM RL collapses are preceded by falling ESS (Huang et al. 2026,
    "Stable Asynchrony: Variance-Controlled Off-Policy RL for LLMs", arXiv:2602.17616).  Left
    out when no weights are given or none is nonzero.

Alarms (:class:`StabilityMonitor`, thresholds in :class:`MonitorConfig`)
------------------------------------------------------------------------
Each alarm reads one or two keys of the step's record (the trainer's ``metrics.jsonl`` record
plus the keys above) and is skipped when they are missing; a NaN value is never within bounds,
so it raises the alarm of every threshold it is checked against.  Alarms are level-triggered:
an alarm is raised at every step its condition holds.  An :class:`Alarm` carries the signal's
value and the threshold it crossed; for the relative alarms (``entropy_collapse``,
``variance_cliff``) the threshold is the step's absolute floor (fraction × reference).

``entropy_collapse`` (``entropy``)
    ``entropy_t < entropy_collapse_fraction · entropy_first``.  Cui et al. 2025, "The Entropy
    Mechanism of Reinforcement Learning for Reasoning Language Models" (arXiv:2505.22617): without
    intervention policy entropy falls sharply early in RL and performance saturates as it is
    spent (``R = −a·e^H + b``); a policy near zero entropy no longer explores.
``kl_bound`` (``kl``)
    ``kl_t > kl_bound``: the policy has drifted far from the reference (per-token KL in nats).
``kl_growth`` (``kl``, ``reward_mean``)
    ``kl`` rose at each of the last ``kl_growth_steps`` steps while ``reward_mean`` rose by at
    most ``flat_reward_tolerance`` over them (flat or falling): KL budget is being spent without
    reward, the signature of over-optimisation (Gao, Schulman & Hilton 2022, "Scaling Laws for
    Reward Model Overoptimization", arXiv:2210.10760) and of a blow-up building up.  The alarm's
    value is the streak's length, its threshold ``kl_growth_steps``.
``reward_length_corr`` (``reward_length_corr``)
    ``reward_length_corr_t > reward_length_corr_max``: reward is being earned by length.
``variance_cliff`` (``reward_std_within_group``)
    After ``warmup_steps`` observations: ``reward_std_within_group_t < variance_cliff_fraction
    · max_{s ≤ t} reward_std_within_group_s``, the Echo Trap's precursor (RAGEN).
``distinct_answers`` (``distinct_answers``)
    ``distinct_answers_t < min_distinct_answers``.
``prompt_response_mi`` (``prompt_response_mi``)
    ``prompt_response_mi_t < min_prompt_response_mi``: template collapse (RAGEN-2).
``is_ess`` (``is_ess``)
    ``is_ess_t < min_is_ess``: a few samples carry the importance-weighted gradient.
``zero_variance_groups`` (``zero_variance_groups``, a fraction of the drawn groups)
    ``> max_zero_variance_groups``: almost no group has a reward spread, so group-relative
    advantages are zero and learning has stalled (all solved or all failed; DAPO's dynamic
    sampling, Yu et al. 2025, arXiv:2503.14476, exists to work around it).
``clip_fraction`` (``clip_frac_low`` + ``clip_frac_high``, per-token means)
    ``> max_clip_fraction``: updates leave PPO's trust region for many tokens (Schulman et al.
    2017, arXiv:1707.06347); the learning rate or the number of epochs is too high.
``mismatch`` (``mismatch_mean``, mean ``|log π_trainer − log π_sampler|`` per token)
    ``> max_mismatch``: the sampler's and the trainer's probabilities disagree, which silently
    turns on-policy RL off-policy and precedes collapses (Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training"; Liu, Li et al. 2025, "When Speed Kills
    Stability: Demystifying RL Collapse from the Training-Inference Mismatch").

The monitor's history (first entropy, running maximum of the within-group std, the KL streak)
is plain data (:meth:`StabilityMonitor.state`), so a checkpointed, resumed run raises exactly the
alarms the uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import gin
import numpy as np
import scipy.sparse

__all__ = [
    "ALARMS",
    "Alarm",
    "MonitorConfig",
    "RLStopped",
    "StabilityMonitor",
    "step_diagnostics",
]

# Every alarm the monitor can raise, in the order :meth:`StabilityMonitor.observe` checks them.
ALARMS = (
    "entropy_collapse",
    "kl_bound",
    "kl_growth",
    "reward_length_corr",
    "variance_cliff",
    "distinct_answers",
    "prompt_response_mi",
    "is_ess",
    "zero_variance_groups",
    "clip_fraction",
    "mismatch",
)

# The threshold field each alarm needs (None there disables the alarm).
ALARM_THRESHOLD = {
    "entropy_collapse": "entropy_collapse_fraction",
    "kl_bound": "kl_bound",
    "kl_growth": "kl_growth_steps",
    "reward_length_corr": "reward_length_corr_max",
    "variance_cliff": "variance_cliff_fraction",
    "distinct_answers": "min_distinct_answers",
    "prompt_response_mi": "min_prompt_response_mi",
    "is_ess": "min_is_ess",
    "zero_variance_groups": "max_zero_variance_groups",
    "clip_fraction": "max_clip_fraction",
    "mismatch": "max_mismatch",
}


# ----------------------------------------------------------------------------- per-step signals
def _jaccard_matrix(response_ids: Sequence[np.ndarray]) -> np.ndarray:
    """``[B, B]`` token-set Jaccard overlaps ``|S_i ∩ S_j| / |S_i ∪ S_j|`` (1 for two empty sets),
    from one sparse product of the episodes' token-incidence matrix."""
    sets = [np.unique(np.asarray(r).reshape(-1)) for r in response_ids]
    sizes = np.array([s.size for s in sets], dtype=np.float64)
    rows = np.repeat(np.arange(len(sets)), sizes.astype(np.int64))
    flat = np.concatenate(sets) if sets else np.zeros(0, np.int64)
    _, cols = np.unique(flat, return_inverse=True)
    vocab = int(cols.max()) + 1 if cols.size else 1
    incidence = scipy.sparse.csr_matrix(
        (np.ones(rows.size), (rows, cols.reshape(-1))), shape=(len(sets), vocab)
    )
    inter = (incidence @ incidence.T).toarray()
    union = sizes[:, None] + sizes[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 1.0)


def _prompt_classes(prompt_ids: Sequence[np.ndarray], group_size: int) -> np.ndarray:
    """``[B]`` prompt index per episode: groups whose (first episode's) prompt tokens are equal
    share one index."""
    index: dict[bytes, int] = {}
    classes = []
    for g in range(len(prompt_ids) // group_size):
        prompt = np.asarray(prompt_ids[g * group_size]).reshape(-1).astype(np.int64)
        classes.append(index.setdefault(prompt.tobytes(), len(index)))
    return np.repeat(np.array(classes, dtype=np.int64), group_size)


def _infonce_mi(jaccard: np.ndarray, classes: np.ndarray, temperature: float) -> float | None:
    """The normalised InfoNCE bound ``max(0, (log K + mean_i log q_i) / log K)`` (module
    docstring); None when no response has another response to its prompt to be scored with."""
    k = int(classes.max()) + 1
    if k < 2:
        return 0.0
    onehot = np.eye(k)[classes]  # [B, K]
    off_diag = jaccard - np.diag(np.diag(jaccard))  # leave-one-out: never score i against i
    counts = onehot.sum(0)[None, :] - onehot  # [B, K] responses of c other than i
    with np.errstate(invalid="ignore", divide="ignore"):
        scores = (off_diag @ onehot) / counts  # s_i(c); NaN where c has no other response
    scorable = counts[np.arange(classes.size), classes] > 0
    if not scorable.any():
        return None
    logits = scores[scorable] / temperature  # finite: only i's own prompt can lack others
    top = logits.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    log_q = logits[np.arange(logits.shape[0]), classes[scorable]] - log_z
    bound = (math.log(k) + float(np.mean(log_q))) / math.log(k)
    return max(0.0, bound)


def step_diagnostics(
    *,
    rewards: np.ndarray,
    lengths: np.ndarray,
    group_size: int,
    answers: Sequence[str],
    prompt_ids: Sequence[np.ndarray],
    response_ids: Sequence[np.ndarray],
    importance_weights: np.ndarray | None = None,
    mi_temperature: float = 0.05,
) -> dict[str, float]:
    """The step's collapse signals from its ``B`` episodes (formulas in the module docstring).

    Args:
      rewards: ``[B]`` episode rewards, groups of ``group_size`` consecutive episodes.
      lengths: ``[B]`` response lengths (policy tokens).
      group_size: ``G``; ``B`` must be a multiple of it.
      answers: ``B`` final answers (compared as strings).
      prompt_ids: ``B`` prompt token arrays; episodes of a group share their prompt (the first
        episode's is used), groups with equal prompts count as one prompt for the MI proxy.
      response_ids: ``B`` unpadded response token arrays (all the policy's turns).
      importance_weights: optional ``[B]`` or ``[B, T]`` nonnegative finite weights (zeros, e.g.
        padding, are left out of the ESS).
      mi_temperature: ``τ`` of the InfoNCE critic.

    Returns:
      ``reward_length_corr``, ``distinct_answers``, ``reward_std_within_group`` always;
      ``pairwise_overlap`` when ``G ≥ 2``; ``prompt_response_mi`` when some response can be
      scored (``G ≥ 2`` or a prompt repeated across groups); ``is_ess`` when weights with a
      nonzero entry are given.  Plain Python floats.
    """
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    lengths = np.asarray(lengths, dtype=np.float64).reshape(-1)
    b = rewards.size
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if b == 0 or b % group_size:
        raise ValueError(f"{b} episodes do not make whole groups of group_size={group_size}")
    for name, seq in (
        ("lengths", lengths),
        ("answers", answers),
        ("prompt_ids", prompt_ids),
        ("response_ids", response_ids),
    ):
        if len(seq) != b:
            raise ValueError(f"{name} has {len(seq)} entries for {b} rewards")
    if mi_temperature <= 0:
        raise ValueError(f"mi_temperature must be > 0, got {mi_temperature}")
    groups = b // group_size
    out: dict[str, float] = {}

    if b > 1 and np.std(rewards) > 0 and np.std(lengths) > 0:
        out["reward_length_corr"] = float(np.corrcoef(rewards, lengths)[0, 1])
    else:
        out["reward_length_corr"] = 0.0

    out["distinct_answers"] = float(
        np.mean(
            [
                len(set(answers[g * group_size : (g + 1) * group_size])) / group_size
                for g in range(groups)
            ]
        )
    )
    out["reward_std_within_group"] = float(np.mean(rewards.reshape(groups, group_size).std(1)))

    jaccard = _jaccard_matrix(response_ids)
    if group_size >= 2:
        upper = np.triu_indices(group_size, k=1)
        blocks = [
            jaccard[g * group_size : (g + 1) * group_size, g * group_size : (g + 1) * group_size]
            for g in range(groups)
        ]
        out["pairwise_overlap"] = float(np.mean([block[upper].mean() for block in blocks]))
    mi = _infonce_mi(jaccard, _prompt_classes(prompt_ids, group_size), mi_temperature)
    if mi is not None:
        out["prompt_response_mi"] = float(mi)

    if importance_weights is not None:
        w = np.asarray(importance_weights, dtype=np.float64)
        if w.shape[0] != b:
            raise ValueError(f"importance_weights has {w.shape[0]} rows for {b} episodes")
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("importance_weights must be finite and nonnegative")
        w = w[w != 0]
        if w.size:
            w = w / w.max()  # scale-free; keeps Σw² from underflowing
            out["is_ess"] = float(w.sum() ** 2 / (w.size * np.sum(w * w)))
    return out


# ----------------------------------------------------------------------------- config and alarms
@gin.configurable
@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """Alarm thresholds (module docstring); a threshold of None disables its alarm.

    The defaults flag a run that is clearly going wrong without firing on a healthy one; none of
    them stops the run unless named in ``stop_on``.
    """

    # entropy below 10% of the first step's: the exploration budget is spent (Cui et al. 2025)
    entropy_collapse_fraction: float | None = 0.1
    # per-token KL(π ‖ π_ref) above 1 nat: far from the reference
    kl_bound: float | None = 1.0
    # KL rose 10 steps in a row while reward_mean gained at most flat_reward_tolerance
    kl_growth_steps: int | None = 10
    flat_reward_tolerance: float = 0.05
    # reward–length Pearson correlation above 0.6 (a batch of 64 has ~±0.25 noise)
    reward_length_corr_max: float | None = 0.6
    # within-group reward std below 25% of its running max, after 5 observations (RAGEN)
    variance_cliff_fraction: float | None = 0.25
    warmup_steps: int = 5
    # off: one answer per group is also what a policy that has learnt the task gives
    min_distinct_answers: float | None = None
    # responses carry under 2% of the prompt's entropy: template collapse (RAGEN-2); at τ = 0.05
    # prompt-independent responses read ≈ 0.003 (99th percentile 0.03) in batches of 8 × 8, two
    # prompt-specific tokens in fifty ≈ 0.06
    min_prompt_response_mi: float | None = 0.02
    # Kish ESS fraction under 1/2, the classic resampling rule of sequential Monte Carlo
    min_is_ess: float | None = 0.5
    # more than 90% of the drawn groups have no reward spread (no gradient)
    max_zero_variance_groups: float | None = 0.9
    # more than 30% of tokens clipped (low + high)
    max_clip_fraction: float | None = 0.3
    # mean |log π_trainer − log π_sampler| above 0.05 nats per token
    max_mismatch: float | None = 0.05
    # the alarms that stop the run (names from ALARMS)
    stop_on: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "stop_on", tuple(self.stop_on))  # gin passes lists
        for name in ("entropy_collapse_fraction", "variance_cliff_fraction"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise ValueError(f"MonitorConfig.{name}={value}; expected a fraction in (0, 1]")
        if self.kl_growth_steps is not None and self.kl_growth_steps < 1:
            raise ValueError(f"MonitorConfig.kl_growth_steps={self.kl_growth_steps}; expected >= 1")
        if self.warmup_steps < 0:
            raise ValueError(f"MonitorConfig.warmup_steps={self.warmup_steps}; expected >= 0")
        if self.flat_reward_tolerance < 0:
            raise ValueError(
                f"MonitorConfig.flat_reward_tolerance={self.flat_reward_tolerance}; expected >= 0"
            )
        for name in self.stop_on:
            if name not in ALARMS:
                raise ValueError(f"MonitorConfig.stop_on names {name!r}; expected some of {ALARMS}")
            if getattr(self, ALARM_THRESHOLD[name]) is None:
                raise ValueError(
                    f"MonitorConfig.stop_on names {name!r}, whose threshold "
                    f"{ALARM_THRESHOLD[name]} is None (disabled)"
                )


@dataclasses.dataclass(frozen=True)
class Alarm:
    """One alarm at one step: ``value`` of the signal against the ``threshold`` it crossed (for
    relative alarms, the absolute threshold this step), and why, in words."""

    name: str
    step: int
    value: float
    threshold: float
    message: str


class RLStopped(Exception):
    """Raised by the trainer when an alarm named in ``MonitorConfig.stop_on`` fires."""

    def __init__(self, alarm: Alarm):
        self.alarm = alarm
        super().__init__(
            f"RL run stopped at step {alarm.step} by alarm {alarm.name!r}: {alarm.message}"
        )

    def __reduce__(self):
        return (type(self), (self.alarm,))


# ----------------------------------------------------------------------------- the monitor
def _number(record: dict, key: str) -> float | None:
    value = record.get(key)
    return None if value is None else float(value)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


class StabilityMonitor:
    """Watches a run's records and raises :class:`Alarm` s (module docstring).

    ``observe`` is called once per step, in order, with the step's record; the monitor's memory
    is ``state()``, plain JSON-serialisable data, restored by ``from_state``.
    """

    def __init__(self, config: MonitorConfig = MonitorConfig()):
        self.config = config
        self._observed = 0  # records seen
        self._first_entropy: float | None = None
        self._std_seen = 0  # records with a (finite) reward_std_within_group
        self._std_max: float | None = None
        self._prev_kl: float | None = None
        self._kl_streak = 0  # consecutive steps with kl_t > kl_{t-1} (and a reward_mean)
        self._rewards: list[float] = []  # reward_mean over the streak, its last steps + 1

    # -- checkpointing
    def state(self) -> dict:
        """The monitor's history as plain data (JSON-serialisable: ints, floats, None, lists)."""
        return {
            "observed": self._observed,
            "first_entropy": self._first_entropy,
            "std_seen": self._std_seen,
            "std_max": self._std_max,
            "prev_kl": self._prev_kl,
            "kl_streak": self._kl_streak,
            "rewards": list(self._rewards),
        }

    @classmethod
    def from_state(cls, config: MonitorConfig, state: dict) -> StabilityMonitor:
        """A monitor that continues from ``state`` (an earlier ``state()``) under ``config``."""
        monitor = cls(config)
        monitor._observed = int(state["observed"])
        monitor._first_entropy = _optional_float(state["first_entropy"])
        monitor._std_seen = int(state["std_seen"])
        monitor._std_max = _optional_float(state["std_max"])
        monitor._prev_kl = _optional_float(state["prev_kl"])
        monitor._kl_streak = int(state["kl_streak"])
        monitor._rewards = [float(r) for r in state["rewards"]]
        return monitor

    # -- stopping
    def should_stop(self, alarms: Sequence[Alarm]) -> Alarm | None:
        """The first of ``alarms`` whose name is in ``config.stop_on``, else None."""
        return next((a for a in alarms if a.name in self.config.stop_on), None)

    # -- the step
    def observe(self, record: dict) -> list[Alarm]:
        """Updates the history with the step's ``record`` and returns the alarms raised at this
        step, in :data:`ALARMS` order.  The step is ``record["step"]`` (else the count of
        records observed before this one)."""
        cfg = self.config
        step = int(record.get("step", self._observed))
        self._observed += 1
        alarms: list[Alarm] = []

        def raise_if(cond: bool, name, value, threshold, message):
            if cond:
                alarms.append(Alarm(name, step, float(value), float(threshold), message))

        def above(name, key, bound, why):  # value > bound, NaN counts as out of bounds
            value = _number(record, key)
            if bound is None or value is None:
                return
            raise_if(
                not value <= bound,
                name,
                value,
                bound,
                f"{key} = {_fmt(value)} is above its bound {_fmt(bound)}: {why}",
            )

        def below(name, key, bound, why):  # value < bound, NaN counts as out of bounds
            value = _number(record, key)
            if bound is None or value is None:
                return
            raise_if(
                not value >= bound,
                name,
                value,
                bound,
                f"{key} = {_fmt(value)} is below its floor {_fmt(bound)}: {why}",
            )

        # entropy_collapse: relative to the first finite entropy
        entropy = _number(record, "entropy")
        if entropy is not None:
            if self._first_entropy is None and math.isfinite(entropy):
                self._first_entropy = entropy
            if cfg.entropy_collapse_fraction is not None and self._first_entropy is not None:
                floor = cfg.entropy_collapse_fraction * self._first_entropy
                raise_if(
                    not entropy >= floor,
                    "entropy_collapse",
                    entropy,
                    floor,
                    f"entropy = {_fmt(entropy)} fell below {cfg.entropy_collapse_fraction:g} × "
                    f"its first-step value {_fmt(self._first_entropy)} (= {_fmt(floor)}): the "
                    "policy's entropy has collapsed and it has stopped exploring",
                )

        above(
            "kl_bound",
            "kl",
            cfg.kl_bound,
            "the policy has drifted too far from the reference model",
        )

        # kl_growth: a streak of rising KL with no reward gain over it
        kl, reward = _number(record, "kl"), _number(record, "reward_mean")
        if kl is None or reward is None or not (math.isfinite(kl) and math.isfinite(reward)):
            self._prev_kl, self._kl_streak, self._rewards = None, 0, []
        else:
            if self._prev_kl is not None and kl > self._prev_kl:
                self._kl_streak += 1
            else:
                self._kl_streak, self._rewards = 0, []
            self._prev_kl = kl
            self._rewards.append(reward)
            del self._rewards[: -((cfg.kl_growth_steps or 0) + 1)]  # the window's k + 1 steps
            if cfg.kl_growth_steps is not None and self._kl_streak >= cfg.kl_growth_steps:
                gain = self._rewards[-1] - self._rewards[0]
                raise_if(
                    gain <= cfg.flat_reward_tolerance,
                    "kl_growth",
                    self._kl_streak,
                    cfg.kl_growth_steps,
                    f"kl has grown for {self._kl_streak} consecutive steps (to {_fmt(kl)}) while "
                    f"reward_mean changed by {gain:+.4g} over the last {cfg.kl_growth_steps} "
                    f"(tolerance {cfg.flat_reward_tolerance:g}): KL is being spent without reward",
                )

        above(
            "reward_length_corr",
            "reward_length_corr",
            cfg.reward_length_corr_max,
            "reward grows with response length, a sign of length-based reward hacking",
        )

        # variance_cliff: relative to the running maximum, after warmup
        std = _number(record, "reward_std_within_group")
        if std is not None:
            if math.isfinite(std):
                self._std_seen += 1
                self._std_max = std if self._std_max is None else max(self._std_max, std)
            if (
                cfg.variance_cliff_fraction is not None
                and self._std_max is not None
                and self._std_seen > cfg.warmup_steps
            ):
                floor = cfg.variance_cliff_fraction * self._std_max
                raise_if(
                    not std >= floor,
                    "variance_cliff",
                    std,
                    floor,
                    f"reward_std_within_group = {_fmt(std)} fell below "
                    f"{cfg.variance_cliff_fraction:g} × its running maximum {_fmt(self._std_max)} "
                    f"(= {_fmt(floor)}): the within-group reward variance has fallen off a cliff, "
                    "the precursor of the Echo Trap collapse",
                )

        below(
            "distinct_answers",
            "distinct_answers",
            cfg.min_distinct_answers,
            "the episodes of a group have collapsed onto the same answers",
        )
        below(
            "prompt_response_mi",
            "prompt_response_mi",
            cfg.min_prompt_response_mi,
            "responses no longer depend on their prompt (template collapse)",
        )
        below(
            "is_ess",
            "is_ess",
            cfg.min_is_ess,
            "a few samples carry most of the importance weight",
        )
        above(
            "zero_variance_groups",
            "zero_variance_groups",
            cfg.max_zero_variance_groups,
            "almost no group has a reward spread, so the group-relative advantages give no "
            "gradient",
        )

        # clip_fraction: low + high, whichever are present
        parts = [_number(record, k) for k in ("clip_frac_low", "clip_frac_high")]
        parts = [p for p in parts if p is not None]
        if cfg.max_clip_fraction is not None and parts:
            clip = sum(parts)
            raise_if(
                not clip <= cfg.max_clip_fraction,
                "clip_fraction",
                clip,
                cfg.max_clip_fraction,
                f"clip_frac_low + clip_frac_high = {_fmt(clip)} is above its bound "
                f"{_fmt(cfg.max_clip_fraction)}: the updates leave the trust region for many "
                "tokens",
            )

        above(
            "mismatch",
            "mismatch_mean",
            cfg.max_mismatch,
            "the sampler's and the trainer's log-probabilities disagree (training-inference "
            "mismatch)",
        )
        return alarms


def _optional_float(value) -> float | None:
    return None if value is None else float(value)
