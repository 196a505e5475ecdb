"""Reasoning-aware retrieval fine-tuning (RA-RFT): the dual encoder trained to retrieve the
demonstrations that help the policy, by distillation from the policy's success with each.

A record is a query ``q`` (a problem), candidates ``d_1..d_m`` (demonstrations: solved problems
with their worked conversations) and each candidate's utility ``u(d, q)``: how often the policy
solved ``q`` with ``d`` in its context (``post_training.demonstration_utility`` measures it; any
other score, such as the log-likelihood of the reference answer, can be written instead).  The
utilities define the target and the encoder's scores ``s(q, d)`` (``encoders.similarity``) the
retriever's distribution over the candidates,

    Q(d | q) = softmax_d(u(d, q) / τ),    P(d | q) = softmax_d(s(q, d) / γ),

and the encoder minimises ``KL(Q ‖ P) = Σ_d Q (log Q − log P)`` over the real candidates of
each query (padding masked), whose gradient in the logits ``s / γ`` is ``P − Q``: nothing moves
once the retriever ranks as the policy's success does.  ``Q`` is a fixed target (no gradient).

* REPLUG LSR (Shi et al. 2023, "REPLUG: Retrieval-Augmented Black-Box Language Models",
  arXiv:2301.12652) trains the retriever with these two softmaxes, ``Q`` from the frozen LM's
  likelihood of the reference answer given each retrieved document;
* EPR (Rubin, Herzig & Berant 2022, "Learning to Retrieve Prompts for In-Context Learning",
  arXiv:2112.08633) scores candidate demonstrations by the LM's success with each in the prompt,
  as here;
* REPLUG writes the divergence as ``KL(P ‖ Q)``; this is the direction of Atlas's distillation
  objectives (Izacard et al. 2022, arXiv:2208.03299), the target first: the cross-entropy to
  the soft target minus its entropy, whose mass-covering optimum keeps every helpful
  demonstration likely rather than only the best one, and whose gradient is the plain
  ``P − Q``.

A query whose candidates all have the same utility (all solved, or none) says nothing about which
demonstration helps; its uniform target would only flatten the retriever, so the trainer drops it.
Records are split by the SHA-256 of the query (``training_data.is_heldout``); held-out metrics:
``kl``, ``utility@1`` (the mean utility of the candidate the retriever ranks first: what a
policy given the top demonstration would score) and ``best@1`` (that candidate is one of the most
useful).

`train_ra_rft` is the gin job (``configs/retrieval_ra_rft.gin``): it fine-tunes a
``train_encoder`` run (or a fresh head on a trunk) through ``trainer.train``, and its run loads
with ``encoders.load_encoder``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.files import atomic_write
from agentic_jax.models import TransformerConfig
from agentic_jax.retrieval.encoders import (
    HEAD,
    Encoder,
    EncoderConfig,
    embed,
    encoder_info,
    init_encoder,
    load_encoder,
    matryoshka_dims,
    prefix_similarity,
)
from agentic_jax.retrieval.trainer import TrainSettings, load_trunk, train
from agentic_jax.retrieval.training_data import is_heldout
from agentic_jax.retrieval.trunk import text_rows

# A masked candidate's logit: finite, so a row with no real candidate gives 0 loss, not NaN.
_MASKED = -1e30


def distillation_loss(
    scores, utility, mask, *, temperature: float, target_temperature: float
) -> jax.Array:
    """``KL(Q ‖ P) [B]`` of ``scores``, ``utility`` and ``mask [B, M]`` (0 on padded
    candidates): ``P = softmax(scores / temperature)``, ``Q = softmax(utility /
    target_temperature)`` over each row's real candidates (module docstring).  A row with at
    most one real candidate costs 0."""
    mask = jnp.asarray(mask, bool)

    def log_softmax(x, t):
        return jax.nn.log_softmax(jnp.where(mask, jnp.asarray(x, jnp.float32) / t, _MASKED), axis=1)

    log_p = log_softmax(scores, temperature)
    log_q = jax.lax.stop_gradient(log_softmax(utility, target_temperature))
    return jnp.sum(jnp.where(mask, jnp.exp(log_q) * (log_q - log_p), 0.0), axis=1)


def first_choice(scores, utility, mask) -> tuple[jax.Array, jax.Array]:
    """``(utility [B], best [B])`` of each row's highest-scoring real candidate: its utility, and
    whether no real candidate has more."""
    mask = jnp.asarray(mask, bool)
    top = jnp.argmax(jnp.where(mask, scores, -jnp.inf), axis=1)
    chosen = jnp.take_along_axis(jnp.asarray(utility), top[:, None], axis=1)[:, 0]
    return chosen, chosen >= jnp.max(jnp.where(mask, utility, -jnp.inf), axis=1)


@dataclasses.dataclass(frozen=True)
class UtilityRecord:
    """One query, its candidate demonstrations and the policy's utility with each (a line of the
    JSON Lines file between the measurement and the trainer); the ids name the problems."""

    query: str
    candidates: tuple[str, ...]
    utility: tuple[float, ...]
    query_id: str = ""
    candidate_ids: tuple[str, ...] = ()

    def __post_init__(self):
        if len(self.candidates) != len(self.utility):
            raise ValueError(
                f"{len(self.candidates)} candidates but {len(self.utility)} utilities for "
                f"query {self.query_id or self.query!r}"
            )

    @property
    def informative(self) -> bool:
        """At least two candidates whose utilities differ (module docstring)."""
        return len(set(self.utility)) > 1


def write_utilities(path, records: Sequence[UtilityRecord]) -> None:
    """``records`` as JSON Lines at ``path``, written atomically (a reader never sees half)."""
    with atomic_write(path) as f:
        for record in records:
            f.write(json.dumps(dataclasses.asdict(record)) + "\n")


def read_utilities(path) -> list[UtilityRecord]:
    """The records of a file :func:`write_utilities` wrote."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [
        UtilityRecord(
            r["query"],
            tuple(r["candidates"]),
            tuple(float(u) for u in r["utility"]),
            r.get("query_id", ""),
            tuple(r.get("candidate_ids", ())),
        )
        for r in rows
    ]


@dataclasses.dataclass(frozen=True, eq=False)
class CandidateLists:
    """Records as arrays: ``candidates [R, M]`` index ``passages`` (padding 0 where ``mask`` is
    0), ``utility [R, M]`` (float32)."""

    queries: tuple[str, ...]
    passages: tuple[str, ...]
    candidates: np.ndarray
    mask: np.ndarray
    utility: np.ndarray

    @staticmethod
    def of(records: Sequence[UtilityRecord]) -> CandidateLists:
        passages = list(dict.fromkeys(c for r in records for c in r.candidates))
        row_of = {p: i for i, p in enumerate(passages)}
        width = max(len(r.candidates) for r in records)
        candidates = np.zeros((len(records), width), np.int32)
        mask = np.zeros((len(records), width), np.int32)
        utility = np.zeros((len(records), width), np.float32)
        for i, r in enumerate(records):
            n = len(r.candidates)
            candidates[i, :n] = [row_of[c] for c in r.candidates]
            mask[i, :n], utility[i, :n] = 1, r.utility
        return CandidateLists(
            tuple(r.query for r in records), tuple(passages), candidates, mask, utility
        )

    def metrics(self, scores, *, temperature: float, target_temperature: float) -> dict:
        """Held-out ``kl``, ``utility@1`` and ``best@1`` (module docstring) of the encoder's
        ``scores [R, len(passages)]``."""
        scores = np.take_along_axis(np.asarray(scores), self.candidates, axis=1)
        kl = distillation_loss(
            scores,
            self.utility,
            self.mask,
            temperature=temperature,
            target_temperature=target_temperature,
        )
        chosen, best = first_choice(scores, self.utility, self.mask)
        return {
            "kl": float(jnp.mean(kl)),
            "utility@1": float(jnp.mean(chosen)),
            "best@1": float(jnp.mean(best)),
        }


def ra_rft_loss(
    config: TransformerConfig,
    encoder: EncoderConfig,
    *,
    temperature: float,
    target_temperature: float,
    dims: tuple[int, ...],
):
    """``loss(params, batch, key) -> (Σ_m Σ_i KL, B, sums)`` over ``query``, ``query_mask [B,
    Lq]``, ``passages``, ``passage_mask [B, M, Lp]`` (each query's candidates), ``mask`` and
    ``utility [B, M]``, summed over the Matryoshka prefixes ``dims`` (as ``encoder_loss``, so a
    fine-tune keeps the prefixes it was trained at).  Sums: ``loss_dim<m>``, ``utility@1`` and
    ``best@1`` at full width."""

    def loss(params, batch, key):
        del key
        rows, width, length = batch["passages"].shape
        p_mask = batch["passage_mask"].reshape(rows * width, length)
        q = embed(params, config, encoder, batch["query"], batch["query_mask"])
        p = embed(params, config, encoder, batch["passages"].reshape(rows * width, length), p_mask)
        own = jnp.arange(rows)
        total, sums = 0.0, {}
        for dim in dims:
            every = prefix_similarity(encoder.pooling, dim, q, batch["query_mask"], p, p_mask)
            scores = every.reshape(rows, rows, width)[own, own]  # each query's own candidates
            kl = distillation_loss(
                scores,
                batch["utility"],
                batch["mask"],
                temperature=temperature,
                target_temperature=target_temperature,
            )
            sums[f"loss_dim{dim}"] = jnp.sum(kl)
            total = total + sums[f"loss_dim{dim}"]
        chosen, best = first_choice(scores, batch["utility"], batch["mask"])
        sums |= {"utility@1": jnp.sum(chosen), "best@1": jnp.sum(best)}
        return total, jnp.float32(rows), sums

    return loss


def _start(init_from, encoder, dims, *, tokenizer, model, seed):
    """``(config, params, tokenizer, encoder, dims)``: a ``train_encoder`` run's encoder (its own
    ``EncoderConfig``, Matryoshka prefixes unless ``dims`` is given), else a fresh head on the
    trunk of ``init_from`` (or a random ``model``)."""
    if init_from is not None and os.path.exists(os.path.join(init_from, f"{HEAD}.json")):
        run = load_encoder(init_from)
        trained = run.encoder
        encoder = encoder or trained
        if (encoder.pooling, encoder.dim) != (trained.pooling, trained.dim):
            raise ValueError(
                f"the encoder run {init_from} has pooling={trained.pooling!r}, dim={trained.dim}; "
                f"got pooling={encoder.pooling!r}, dim={encoder.dim}"
            )
        return run.config, run.params, run.tokenizer, encoder, run.dims if dims is None else dims
    config, trunk, tok = load_trunk(init_from, tokenizer=tokenizer, model=model, seed=seed)
    encoder = encoder or EncoderConfig()
    params = init_encoder(trunk, config, encoder, jax.random.key(seed))
    return config, params, tok, encoder, dims or ()


@gin.configurable(module="retrieval")
def train_ra_rft(
    workdir: str,
    *,
    utilities: str,
    init_from: str | None = None,
    tokenizer: str | None = None,
    model: TransformerConfig | None = None,
    encoder: EncoderConfig | None = None,
    dims: tuple[int, ...] | None = None,
    temperature: float = 0.05,
    target_temperature: float = 0.1,
    heldout_every: int = 5,
    settings: TrainSettings = TrainSettings(),
) -> dict:
    """Fine-tunes an encoder on the records of the ``utilities`` file (:func:`read_utilities`)
    by ``KL(Q ‖ P)`` (module docstring: ``temperature`` is ``γ``, ``target_temperature`` is
    ``τ``), ``settings.batch_size`` queries with all their candidates a step.

    ``init_from``: a ``train_encoder`` run (its head and ``EncoderConfig``; ``encoder`` may
    change the token lengths only) or a run or model directory whose trunk gets a new head of
    ``encoder``; without it, a random ``model`` over the ``tokenizer`` file.  Uninformative
    records are dropped, one query in ``heldout_every`` is held out (by its hash).  Writes a run
    like ``train_encoder``'s (``encoders.load_encoder`` reads it) and returns the final metrics."""
    config, params, tok, encoder, dims = _start(
        init_from, encoder, dims, tokenizer=tokenizer, model=model, seed=settings.seed
    )
    dims = matryoshka_dims(dims, config, encoder)
    records = [r for r in read_utilities(utilities) if r.informative]
    train_records = [r for r in records if not is_heldout(r.query, heldout_every)]
    heldout_records = [r for r in records if is_heldout(r.query, heldout_every)]
    if not train_records or not heldout_records:
        raise ValueError(
            f"{utilities}: {len(train_records)} training and {len(heldout_records)} held-out "
            "queries whose candidates differ in utility; both must be some"
        )
    train_lists, heldout = CandidateLists.of(train_records), CandidateLists.of(heldout_records)
    query, query_mask = text_rows(tok, train_lists.queries, encoder.query_length)
    passage, passage_mask = text_rows(tok, train_lists.passages, encoder.passage_length)
    gamma_tau = {"temperature": temperature, "target_temperature": target_temperature}

    def batch_of(examples):
        candidates = train_lists.candidates[examples]
        return {
            "query": query[examples],
            "query_mask": query_mask[examples],
            "passages": passage[candidates],
            "passage_mask": passage_mask[candidates],
            "mask": train_lists.mask[examples],
            "utility": train_lists.utility[examples],
        }

    def evaluate(params):
        current = Encoder(config, encoder, params, tok, dims, settings.batch_size)
        return heldout.metrics(current.scores(heldout.queries, heldout.passages), **gamma_tau)

    return train(
        workdir,
        config=config,
        tokenizer=tok,
        params=params,
        loss=ra_rft_loss(config, encoder, dims=dims, **gamma_tau),
        batch_of=batch_of,
        num_examples=len(train_records),
        evaluate=evaluate,
        settings=settings,
        name=HEAD,
        info=encoder_info(
            encoder,
            dims,
            ra_rft={**gamma_tau, "utilities": utilities, "queries": len(train_records)},
        ),
    )
