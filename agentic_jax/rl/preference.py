"""Paired preference-optimisation losses over summed sequence log-probs.

Inputs are per pair, [B]: the policy's summed log-probs of the chosen and
rejected completions, the reference model's (for reference-based losses) and
the completions' token counts (for length-normalised losses). Notation:
  ρ_w = log π(y_w) − log π_ref(y_w),  ρ_l likewise     (implicit rewards / β)
  h   = ρ_w − ρ_l                                        (the DPO margin)
  ā_w = log π(y_w) / |y_w|,  ā_l likewise                (length-averaged log-probs)
Each `loss_type`'s formula and paper is in its function's docstring and in
docs/rl_losses.md.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.numerics import EXP_CAP, clamped_exp, log1mexp

log_sigmoid = jax.nn.log_sigmoid
sg = jax.lax.stop_gradient

F_DIVERGENCES = ("reverse_kl", "forward_kl", "js", "alpha")


class _Pairs(NamedTuple):
    chosen: jax.Array
    rejected: jax.Array
    ref_chosen: jax.Array | None
    ref_rejected: jax.Array | None
    chosen_lengths: jax.Array | None
    rejected_lengths: jax.Array | None
    beta: float
    label_smoothing: float
    f_divergence: str
    f_alpha: float
    simpo_gamma: float
    nll_coef: float
    discopop_tau: float
    bco_delta: float
    alphapo_alpha: float

    @property
    def chosen_ratio(self):
        return self.chosen - self.ref_chosen

    @property
    def rejected_ratio(self):
        return self.rejected - self.ref_rejected

    @property
    def chosen_avg(self):
        return self.chosen / self.chosen_lengths

    @property
    def rejected_avg(self):
        return self.rejected / self.rejected_lengths

    @property
    def chosen_nll(self):
        return -self.chosen_avg

    @property
    def margin(self):
        """h under the chosen f-divergence: f'(u_w) − f'(u_l), u = π/π_ref (Wang et al. 2023)."""
        chosen, rejected = self.chosen_ratio, self.rejected_ratio
        if self.f_divergence == "forward_kl":
            return clamped_exp(-rejected) - clamped_exp(-chosen)
        if self.f_divergence == "js":
            return chosen - rejected - (jax.nn.softplus(chosen) - jax.nn.softplus(rejected))
        if self.f_divergence == "alpha":
            a = self.f_alpha
            return (clamped_exp(-a * rejected) - clamped_exp(-a * chosen)) / a
        return chosen - rejected

    def smoothed_sigmoid(self, logits):
        """−(1 − ε)·log σ(x) − ε·log σ(−x): BCE towards the smoothed label 1 − ε."""
        eps = self.label_smoothing
        return -(1.0 - eps) * log_sigmoid(logits) - eps * log_sigmoid(-logits)


def _sigmoid(p: _Pairs):
    """DPO: −log σ(β·h); with label smoothing ε, −(1 − ε)·log σ(βh) − ε·log σ(−βh).

    `cdpo` is this loss with ε > 0 required (conservative DPO).
    Rafailov et al. (2023), "Direct Preference Optimization", arXiv:2305.18290;
    Mitchell (2023), "A note on DPO with noisy preferences".
    """
    return p.smoothed_sigmoid(p.beta * p.margin)


def _robust(p: _Pairs):
    """rDPO: (−(1 − ε)·log σ(βh) + ε·log σ(−βh)) / (1 − 2ε), unbiased under label flips ε.

    Chowdhury et al. (2024), "Provably Robust DPO", arXiv:2403.00409.
    """
    eps, x = p.label_smoothing, p.beta * p.margin
    return (-(1.0 - eps) * log_sigmoid(x) + eps * log_sigmoid(-x)) / (1.0 - 2.0 * eps)


def _hinge(p: _Pairs):
    """SLiC: max(0, 1 − β·h). Zhao et al. (2023), "SLiC-HF", arXiv:2305.10425."""
    return jax.nn.relu(1.0 - p.beta * p.margin)


def _ipo(p: _Pairs):
    """IPO: (h̄ − 1/(2β))², h̄ from length-averaged log-probs; minimum at h̄ = 1/(2β).

    Azar et al. (2023), "A General Theoretical Paradigm…", arXiv:2310.12036.
    """
    margin = (p.chosen_avg - p.ref_chosen / p.chosen_lengths) - (
        p.rejected_avg - p.ref_rejected / p.rejected_lengths
    )
    return jnp.square(margin - 1.0 / (2.0 * p.beta))


def _exo_pair(p: _Pairs):
    """EXO: KL(σ(βh) ‖ 1 − ε) over the pair, ε = label_smoothing or 1e-3.

    Ji et al. (2024), "Towards Efficient Exact Optimization of LM Alignment", arXiv:2402.00856.
    """
    eps = jnp.where(p.label_smoothing == 0, 1e-3, p.label_smoothing)
    x = p.beta * p.margin
    return jax.nn.sigmoid(x) * (log_sigmoid(x) - jnp.log1p(-eps)) + jax.nn.sigmoid(-x) * (
        log_sigmoid(-x) - jnp.log(eps)
    )


def _nca_pair(p: _Pairs):
    """NCA: −log σ(βρ_w) − ½·log σ(−βρ_w) − ½·log σ(−βρ_l): absolute, not relative, rewards.

    Chen et al. (2024), "Noise Contrastive Alignment", arXiv:2402.05369.
    """
    chosen, rejected = p.beta * p.chosen_ratio, p.beta * p.rejected_ratio
    return -log_sigmoid(chosen) - 0.5 * log_sigmoid(-chosen) - 0.5 * log_sigmoid(-rejected)


def _bco_pair(p: _Pairs):
    """BCO: −log σ(βρ_w − δ) − log σ(−(βρ_l − δ)), δ = `bco_delta` (running reward mean).

    Jung et al. (2024), "Binary Classifier Optimization", arXiv:2404.04656.
    """
    chosen, rejected = p.beta * p.chosen_ratio, p.beta * p.rejected_ratio
    return -log_sigmoid(chosen - p.bco_delta) - log_sigmoid(-(rejected - p.bco_delta))


def _sppo_hard(p: _Pairs):
    """SPPO (hard labels): (ρ_w − 1/(2β))² + (ρ_l + 1/(2β))².

    Wu et al. (2024), "Self-Play Preference Optimization", arXiv:2405.00675.
    """
    half = 0.5 / p.beta
    return jnp.square(p.chosen_ratio - half) + jnp.square(p.rejected_ratio + half)


def _aot(p: _Pairs):
    """AOT (paired): smoothed −log σ(β·d), d = sort(log π_w − log π_l) − sort(ref margins).

    Sorting across the batch aligns quantiles (first-order stochastic dominance),
    so entry i is the i-th quantile's loss, not pair i's.
    Melnyk et al. (2024), "Distributional Preference Alignment via OT", arXiv:2406.05882.
    """
    d = jnp.sort(p.chosen - p.rejected) - jnp.sort(p.ref_chosen - p.ref_rejected)
    return p.smoothed_sigmoid(p.beta * d)


def _aot_unpaired(p: _Pairs):
    """AOT (unpaired): smoothed −log σ(β·d), d = sort(ρ_w) − sort(ρ_l) (same paper)."""
    return p.smoothed_sigmoid(p.beta * (jnp.sort(p.chosen_ratio) - jnp.sort(p.rejected_ratio)))


def _apo_zero(p: _Pairs):
    """APO-zero: 1 − σ(βρ_w) + σ(βρ_l): raise chosen, lower rejected (chosen better than the model).

    D'Oosterlinck et al. (2024), "Anchored Preference Optimization", arXiv:2408.06266.
    """
    return 1.0 - jax.nn.sigmoid(p.beta * p.chosen_ratio) + jax.nn.sigmoid(p.beta * p.rejected_ratio)


def _apo_down(p: _Pairs):
    """APO-down: σ(βρ_w) + 1 − σ(βh): lower both, rejected more (same paper)."""
    return jax.nn.sigmoid(p.beta * p.chosen_ratio) + 1.0 - jax.nn.sigmoid(p.beta * p.margin)


def _discopop(p: _Pairs):
    """DiscoPOP: (1 − σ(x/τ))·(−log σ(x)) + σ(x/τ)·e^{−x}, x = βh (log-ratio modulated).

    e^{−x}·σ(x/τ) is computed in log space. Chris Lu et al. (2024),
    "Discovering Preference Optimization Algorithms with LLMs", arXiv:2406.08414.
    """
    x = p.beta * p.margin
    mix = jax.nn.sigmoid(x / p.discopop_tau)
    exp_part = jnp.exp(jnp.minimum(log_sigmoid(x / p.discopop_tau) - x, EXP_CAP))
    return -(1.0 - mix) * log_sigmoid(x) + exp_part


def _sigmoid_norm(p: _Pairs):
    """Length-normalised DPO: −log σ(β·(ρ_w/|y_w| − ρ_l/|y_l|)).

    As used in Tülu 3, Lambert et al. (2024), arXiv:2411.15124.
    """
    return -log_sigmoid(
        p.beta * (p.chosen_ratio / p.chosen_lengths - p.rejected_ratio / p.rejected_lengths)
    )


def _rpo(p: _Pairs):
    """RPO: DPO + α·NLL(y_w)/|y_w|, α = `nll_coef`.

    Pang et al. (2024), "Iterative Reasoning Preference Optimization", arXiv:2404.19733.
    """
    return _sigmoid(p) + p.nll_coef * p.chosen_nll


def _simpo(p: _Pairs):
    """SimPO (reference-free): −log σ(β·(ā_w − ā_l) − γ), γ = `simpo_gamma`.

    Meng et al. (2024), "SimPO", arXiv:2405.14734 (paper uses β ≈ 2–2.5, γ/β ≈ 0.5).
    """
    return -log_sigmoid(p.beta * (p.chosen_avg - p.rejected_avg) - p.simpo_gamma)


def _orpo(p: _Pairs):
    """ORPO (reference-free): NLL(y_w)/|y_w| − β·log σ(log odds(y_w) − log odds(y_l)).

    odds(y) = P/(1 − P) with log P = ā; log(1 − P) uses a stable log1mexp,
    finite for ā → 0⁻. Hong et al. (2024), "ORPO", arXiv:2403.07691.
    """
    log_odds = (p.chosen_avg - p.rejected_avg) - (log1mexp(p.chosen_avg) - log1mexp(p.rejected_avg))
    return p.chosen_nll - p.beta * log_sigmoid(log_odds)


def _cpo(p: _Pairs):
    """CPO (reference-free): −log σ(β·(log π_w − log π_l)) + α·NLL(y_w)/|y_w|, α = `nll_coef`.

    Xu et al. (2024), "Contrastive Preference Optimization", arXiv:2401.08417.
    """
    return -log_sigmoid(p.beta * (p.chosen - p.rejected)) + p.nll_coef * p.chosen_nll


def _alphapo(p: _Pairs):
    """AlphaPO (reference-free): SimPO on rewards r = (1 − e^{−α·ā})/α; α → 0 is SimPO.

    Gupta et al. (2025), "AlphaPO: Reward Shape Matters", arXiv:2501.03884.
    """
    a = p.alphapo_alpha

    def reward(avg):
        return (1.0 - jnp.exp(jnp.minimum(-a * avg, EXP_CAP))) / a

    return -log_sigmoid(p.beta * (reward(p.chosen_avg) - reward(p.rejected_avg)) - p.simpo_gamma)


def _kto_pair(p: _Pairs):
    """KTO on pairs: (1 − σ(β(ρ_w − z_l))) + (1 − σ(β(z_w − ρ_l))).

    z = max(0, batch-mean ρ), detached: the reference point. The batch mean
    couples the pairs (so micro-batches differ from the whole batch).
    Ethayarajh et al. (2024), "KTO", arXiv:2402.01306.
    """
    z_w = sg(jnp.maximum(jnp.mean(p.chosen_ratio), 0.0))
    z_l = sg(jnp.maximum(jnp.mean(p.rejected_ratio), 0.0))
    return (1.0 - jax.nn.sigmoid(p.beta * (p.chosen_ratio - z_l))) + (
        1.0 - jax.nn.sigmoid(p.beta * (z_w - p.rejected_ratio))
    )


class _Spec(NamedTuple):
    fn: Callable[[_Pairs], jax.Array]
    needs_ref: bool
    needs_lengths: bool
    uses_margin: bool


_LOSSES = {
    "sigmoid": _Spec(_sigmoid, True, False, True),
    "cdpo": _Spec(_sigmoid, True, False, True),
    "robust": _Spec(_robust, True, False, True),
    "hinge": _Spec(_hinge, True, False, True),
    "ipo": _Spec(_ipo, True, True, False),
    "exo_pair": _Spec(_exo_pair, True, False, True),
    "nca_pair": _Spec(_nca_pair, True, False, False),
    "bco_pair": _Spec(_bco_pair, True, False, False),
    "sppo_hard": _Spec(_sppo_hard, True, False, False),
    "aot": _Spec(_aot, True, False, False),
    "aot_unpaired": _Spec(_aot_unpaired, True, False, False),
    "apo_zero": _Spec(_apo_zero, True, False, False),
    "apo_down": _Spec(_apo_down, True, False, True),
    "discopop": _Spec(_discopop, True, False, True),
    "sigmoid_norm": _Spec(_sigmoid_norm, True, True, False),
    "rpo": _Spec(_rpo, True, True, True),
    "kto_pair": _Spec(_kto_pair, True, False, False),
    "simpo": _Spec(_simpo, False, True, False),
    "orpo": _Spec(_orpo, False, True, False),
    "cpo": _Spec(_cpo, False, True, False),
    "alphapo": _Spec(_alphapo, False, True, False),
}
PREFERENCE_LOSSES = tuple(_LOSSES)
REFERENCE_FREE_LOSSES = tuple(name for name, spec in _LOSSES.items() if not spec.needs_ref)
MARGIN_LOSSES = tuple(name for name, spec in _LOSSES.items() if spec.uses_margin)


def _sequence_values(name, x, batch):
    return check.shape(name, check.floating(name, x), batch)


def _lengths(name, x, batch):
    if x is None:
        return None
    return jnp.maximum(check.shape(name, check.numeric(name, x), batch), 1.0)


def _pairs(
    chosen_logps,
    rejected_logps,
    ref_chosen_logps,
    ref_rejected_logps,
    chosen_lengths,
    rejected_lengths,
):
    chosen = check.rank("chosen_logps", check.floating("chosen_logps", chosen_logps), 1)
    batch = chosen.shape
    rejected = _sequence_values("rejected_logps", rejected_logps, batch)
    refs = [
        None if x is None else _sequence_values(name, x, batch)
        for name, x in (
            ("ref_chosen_logps", ref_chosen_logps),
            ("ref_rejected_logps", ref_rejected_logps),
        )
    ]
    lengths = [
        _lengths("chosen_lengths", chosen_lengths, batch),
        _lengths("rejected_lengths", rejected_lengths, batch),
    ]
    return chosen, rejected, refs, lengths


def preference_loss(
    chosen_logps,
    rejected_logps,
    ref_chosen_logps=None,
    ref_rejected_logps=None,
    *,
    loss_type: str = "sigmoid",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    chosen_lengths=None,
    rejected_lengths=None,
    f_divergence: str = "reverse_kl",
    f_alpha: float = 0.5,
    simpo_gamma: float = 0.5,
    nll_coef: float = 1.0,
    discopop_tau: float = 0.05,
    bco_delta: float = 0.0,
    alphapo_alpha: float = 0.25,
) -> jax.Array:
    """Per-pair preference losses [B] for `loss_type` in `PREFERENCE_LOSSES`.

    Reference-based losses need `ref_chosen_logps` / `ref_rejected_logps`;
    reference-free ones (simpo, orpo, cpo, alphapo) ignore them. Losses using
    length-averaged log-probs (ipo, sigmoid_norm, rpo, simpo, orpo, cpo, alphapo)
    need `chosen_lengths` / `rejected_lengths` (completion token counts).
    `label_smoothing` ε applies to sigmoid/cdpo/rpo/aot*/robust/exo_pair;
    `f_divergence` (reverse_kl, forward_kl, js, alpha with `f_alpha`) replaces
    the margin h of the losses in `MARGIN_LOSSES` (Wang et al. 2023,
    "Beyond Reverse KL", arXiv:2309.16240). Take the mean for the batch loss.
    """
    spec = _LOSSES[check.choice("loss_type", loss_type, PREFERENCE_LOSSES)]
    check.choice("f_divergence", f_divergence, F_DIVERGENCES)
    if f_divergence != "reverse_kl" and not spec.uses_margin:
        raise ValueError(
            f"f_divergence={f_divergence!r} needs a margin-based loss_type "
            f"({', '.join(MARGIN_LOSSES)}), got {loss_type!r}"
        )
    check.static_range("beta", beta, 0.0, float("inf"), low_open=True)
    check.static_range("label_smoothing", label_smoothing, 0.0, 0.5)
    if loss_type == "cdpo":
        check.static_range("label_smoothing", label_smoothing, 0.0, 0.5, low_open=True)
    if loss_type == "robust":
        check.static_range("label_smoothing", label_smoothing, 0.0, 0.5, high_open=True)
    if f_divergence == "alpha":
        check.static_range("f_alpha", f_alpha, 0.0, float("inf"), low_open=True)
    if loss_type == "alphapo":
        check.static_range("alphapo_alpha", alphapo_alpha, 0.0, float("inf"), low_open=True)

    chosen, rejected, (ref_chosen, ref_rejected), (chosen_len, rejected_len) = _pairs(
        chosen_logps,
        rejected_logps,
        ref_chosen_logps,
        ref_rejected_logps,
        chosen_lengths,
        rejected_lengths,
    )
    reason = f"for loss_type={loss_type!r}"
    if spec.needs_ref:
        check.required("ref_chosen_logps", ref_chosen, reason)
        check.required("ref_rejected_logps", ref_rejected, reason)
    if spec.needs_lengths:
        check.required("chosen_lengths", chosen_len, reason)
        check.required("rejected_lengths", rejected_len, reason)
    pairs = _Pairs(
        chosen=chosen,
        rejected=rejected,
        ref_chosen=ref_chosen,
        ref_rejected=ref_rejected,
        chosen_lengths=chosen_len,
        rejected_lengths=rejected_len,
        beta=beta,
        label_smoothing=label_smoothing,
        f_divergence=f_divergence,
        f_alpha=f_alpha,
        simpo_gamma=simpo_gamma,
        nll_coef=nll_coef,
        discopop_tau=discopop_tau,
        bco_delta=bco_delta,
        alphapo_alpha=alphapo_alpha,
    )
    return spec.fn(pairs)


def preference_metrics(
    chosen_logps,
    rejected_logps,
    ref_chosen_logps=None,
    ref_rejected_logps=None,
    *,
    beta=0.1,
    chosen_lengths=None,
    rejected_lengths=None,
) -> dict[str, jax.Array]:
    """Per-pair implicit rewards, margins and accuracies (detached), each [B].

    Rewards are β·(log π − log π_ref) with a reference, else β·log π/|y| with
    lengths (SimPO/ORPO/CPO convention), else β·log π. Average for logging.
    """
    chosen, rejected, (ref_chosen, ref_rejected), (chosen_len, rejected_len) = _pairs(
        chosen_logps,
        rejected_logps,
        ref_chosen_logps,
        ref_rejected_logps,
        chosen_lengths,
        rejected_lengths,
    )
    if (ref_chosen is None) != (ref_rejected is None):
        raise ValueError("ref_chosen_logps and ref_rejected_logps must be given together")
    if ref_chosen is not None:
        chosen, rejected = chosen - ref_chosen, rejected - ref_rejected
    elif chosen_len is not None and rejected_len is not None:
        chosen, rejected = chosen / chosen_len, rejected / rejected_len
    chosen_rewards, rejected_rewards = sg(beta * chosen), sg(beta * rejected)
    return {
        "chosen_rewards": chosen_rewards,
        "rejected_rewards": rejected_rewards,
        "margins": chosen_rewards - rejected_rewards,
        "accuracies": (chosen_rewards > rejected_rewards).astype(jnp.float32),
    }
