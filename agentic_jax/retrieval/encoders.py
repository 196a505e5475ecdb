"""Dual encoders on the project's transformer trunk, trained with InfoNCE on in-batch and hard
negatives, with Matryoshka embeddings; the same trunk gives late interaction its token vectors.

The model is ``{"trunk": transformer params, "proj": [D, P]}`` (``proj`` only when
``EncoderConfig.dim`` is set).  A text ``BOS x EOS`` becomes ``e(x) = normalize(pool(h) · W)``
with ``h`` the trunk's final-norm hidden states and ``pool`` the mean over its tokens or its last
token's state (``trunk.pool``); ``pooling="tokens"`` keeps one unit vector per token and scores
by MaxSim (ColBERT, ``late_interaction``).  Queries and passages share the encoder; the score
is ``s(q, p) = e(q) · e(p)`` (cosine).

* **InfoNCE** (van den Oord, Li & Vinyals 2018, "Representation Learning with Contrastive
  Predictive Coding", arXiv:1807.03748; in-batch and BM25 negatives as in DPR, Karpukhin et al.
  2020, arXiv:2004.04906): a batch of ``B`` queries, the columns their ``B`` positives then
  every query's hard negatives, and ``ℓ_i = −log exp(s_ii/τ) / Σ_{j ∈ V_i} exp(s_ij/τ)``.  A
  column holding the same passage as query ``i``'s positive is no negative for it (two queries
  made from one passage, or a hard negative that is another's positive): ``V_i = {i} ∪
  {j : id_j ≠ id_i}``.  Counting such a column would push ``q_i`` away from its own answer.
* **Matryoshka** (Kusupati et al. 2022, "Matryoshka Representation Learning",
  arXiv:2205.13147): the loss is summed over prefixes ``m`` of the embedding,
  ``L = Σ_m ℓ(t_m(q), t_m(p))`` with ``t_m(x) = x[:m] / ‖x[:m]‖``, so a truncated embedding
  is itself a trained one (a smaller index for a little recall).

`train_encoder` is the gin job (run directory as in ``trainer``; held-out recall@10 at every
evaluation); `load_encoder` reads its result.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.models import TransformerConfig, hidden_states, param_axes
from agentic_jax.retrieval.late_interaction import maxsim_scores
from agentic_jax.retrieval.trainer import TrainSettings, load_run, load_trunk, train
from agentic_jax.retrieval.training_data import RetrievalDataSpec, RetrievalSplit
from agentic_jax.retrieval.trunk import POOLINGS, map_rows, pool, text_rows

HEAD = "encoder"
RECALL_K = 10


@gin.configurable(module="retrieval")
@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """How a trunk encodes: ``pooling`` (mean, last or tokens), the projection's width ``dim``
    (None: the trunk's own ``d_model``, no projection), and the token lengths of queries and
    passages (longer texts are cut)."""

    pooling: str = "mean"
    dim: int | None = None
    query_length: int = 32
    passage_length: int = 128

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"EncoderConfig.pooling={self.pooling!r}; expected one of {POOLINGS}")
        if self.dim is not None and self.dim < 1:
            raise ValueError(f"EncoderConfig.dim={self.dim} must be positive or None")

    def width(self, config: TransformerConfig) -> int:
        """The embedding's size."""
        return self.dim or config.d_model


def init_encoder(trunk, config: TransformerConfig, encoder: EncoderConfig, key) -> dict:
    """An encoder over ``trunk``; the projection ``W ~ N(0, 1/D)`` keeps the embedding's scale."""
    params = {"trunk": trunk}
    if encoder.dim:
        scale = config.d_model**-0.5
        params["proj"] = scale * jax.random.normal(key, (config.d_model, encoder.dim), jnp.float32)
    return params


def encoder_axes(config: TransformerConfig, encoder: EncoderConfig) -> dict:
    """Logical axes of :func:`init_encoder`'s parameters, for ``sharding``."""
    axes = {"trunk": param_axes(config)}
    if encoder.dim:
        axes["proj"] = ("embed", "retrieval_embed")
    return axes


def normalize(x, eps: float = 1e-6) -> jax.Array:
    """``x / ‖x‖`` over the last axis; a zero vector (a padding token) stays zero, gradient too."""
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps**2))


def truncate(x, dim: int) -> jax.Array:
    """``t_m(x)``: the first ``dim`` components, normalised (a Matryoshka prefix)."""
    return normalize(x[..., :dim])


def embed(params, config: TransformerConfig, encoder: EncoderConfig, tokens, mask) -> jax.Array:
    """Unit embeddings ``[B, P]`` of token rows (``[B, L, P]`` for ``pooling="tokens"``, padding
    tokens zero)."""
    h = hidden_states(params["trunk"], config, jnp.asarray(tokens)).astype(jnp.float32)
    if "proj" in params:
        h = h @ params["proj"]  # a linear map commutes with the mean, so project every token
    return normalize(pool(h, mask, encoder.pooling))


def similarity(pooling: str, q, q_mask, p, p_mask) -> jax.Array:
    """``[B, N]`` scores of queries against passages: cosine, or MaxSim for token vectors."""
    if pooling == "tokens":
        return maxsim_scores(q, q_mask, p, p_mask)
    return q @ p.T


def prefix_similarity(pooling: str, dim: int, q, q_mask, p, p_mask) -> jax.Array:
    """:func:`similarity` of the embeddings' Matryoshka prefixes ``t_dim(q)``, ``t_dim(p)``."""
    return similarity(pooling, truncate(q, dim), q_mask, truncate(p, dim), p_mask)


def info_nce(scores, ids, temperature: float, *, mask_duplicates: bool = True) -> jax.Array:
    """``ℓ [B]``: InfoNCE of ``scores [B, C]`` (C ≥ B) whose column ``i`` is query ``i``'s
    positive; ``ids [C]`` name each column's passage, and a column repeating query ``i``'s
    positive is left out of its denominator (module docstring) unless ``mask_duplicates`` is
    False."""
    rows, columns = scores.shape
    own = jnp.arange(rows)
    logits = scores.astype(jnp.float32) / temperature
    if mask_duplicates:
        repeat = (ids[None, :] == ids[:rows, None]) & (jnp.arange(columns)[None, :] != own[:, None])
        logits = jnp.where(repeat, -jnp.inf, logits)
    return jax.nn.logsumexp(logits, axis=1) - logits[own, own]


def matryoshka_dims(dims, config: TransformerConfig, encoder: EncoderConfig) -> tuple[int, ...]:
    """The trained prefixes: ``dims`` and the full width, ascending."""
    width = encoder.width(config)
    if any(not 0 < d <= width for d in dims):
        raise ValueError(f"matryoshka dims {tuple(dims)} must be in [1, {width}]")
    return tuple(sorted({*dims, width}))


def encoder_loss(
    config: TransformerConfig, encoder: EncoderConfig, *, temperature: float, dims: tuple[int, ...]
):
    """``loss(params, batch, key) -> (Σ_m Σ_i ℓ, B, sums)`` over a batch of ``query``,
    ``query_mask [B, Lq]``, ``passages``, ``passage_mask [B, 1 + H, Lp]`` (each query's positive
    then its hard negatives) and their passage ``ids [B, 1 + H]``: the columns are the ``B``
    positives then the ``B·H`` hard negatives.

    Sums: ``loss_dim<m>`` (each prefix's term) and ``accuracy`` (queries whose positive scores
    highest in the batch at full width)."""

    def columns(x):
        return jnp.concatenate([x[:, 0], x[:, 1:].reshape(-1, *x.shape[2:])])

    def loss(params, batch, key):
        del key
        p_mask = columns(batch["passage_mask"])
        q = embed(params, config, encoder, batch["query"], batch["query_mask"])
        p = embed(params, config, encoder, columns(batch["passages"]), p_mask)
        total, sums = 0.0, {}
        for dim in dims:
            scores = prefix_similarity(encoder.pooling, dim, q, batch["query_mask"], p, p_mask)
            sums[f"loss_dim{dim}"] = jnp.sum(info_nce(scores, columns(batch["ids"]), temperature))
            total = total + sums[f"loss_dim{dim}"]
        rows = q.shape[0]
        sums["accuracy"] = jnp.sum(jnp.argmax(scores, axis=1) == jnp.arange(rows))
        return total, jnp.float32(rows), sums

    return loss


_embed = jax.jit(embed, static_argnums=(1, 2))


_scores = jax.jit(prefix_similarity, static_argnums=(0, 1))


@functools.partial(jax.jit, static_argnames=("pooling", "dim", "k"))
def _top_k(q, q_mask, p, p_mask, *, pooling: str, dim: int, k: int):
    return jax.lax.top_k(prefix_similarity(pooling, dim, q, q_mask, p, p_mask), k)[1]


@dataclasses.dataclass(frozen=True, eq=False)
class Encoder:
    """A trained encoder (:func:`load_encoder`): texts to unit embeddings, on the host."""

    config: TransformerConfig
    encoder: EncoderConfig
    params: dict
    tokenizer: Tokenizer
    dims: tuple[int, ...]  # the Matryoshka prefixes it was trained at
    batch_size: int = 32

    def rows(self, texts, *, query: bool):
        length = self.encoder.query_length if query else self.encoder.passage_length
        return text_rows(self.tokenizer, texts, length)

    def embed_rows(self, tokens, mask) -> np.ndarray:
        fn = functools.partial(_embed, self.params, self.config, self.encoder)
        return map_rows(fn, [tokens, mask], self.batch_size)

    def encode(self, texts, *, query: bool, dim: int | None = None):
        """``[N, dim]`` unit embeddings (``dim`` a prefix, default the full width); for token
        vectors ``(vectors [N, L, dim], mask [N, L])``."""
        tokens, mask = self.rows(texts, query=query)
        vectors = self.embed_rows(tokens, mask)
        if dim is not None:
            vectors = np.asarray(truncate(jnp.asarray(vectors), dim))
        return (vectors, mask) if self.encoder.pooling == "tokens" else vectors

    def encode_queries(self, texts, *, dim: int | None = None):
        return self.encode(texts, query=True, dim=dim)

    def encode_passages(self, texts, *, dim: int | None = None):
        return self.encode(texts, query=False, dim=dim)

    def embed_texts(self, queries, passages):
        """``(q, q_mask, p, p_mask)``: the embeddings of ``queries`` and ``passages`` (per token
        for late interaction) beside their token masks."""
        q, q_mask = self.rows(queries, query=True)
        p, p_mask = self.rows(passages, query=False)
        return self.embed_rows(q, q_mask), q_mask, self.embed_rows(p, p_mask), p_mask

    def scores(self, queries, passages, *, dim: int | None = None) -> np.ndarray:
        """``[Q, N]``: ``s(q, p)`` of every query against every passage at the prefix ``dim``
        (default the full width)."""
        q, q_mask, p, p_mask = self.embed_texts(queries, passages)
        fn = functools.partial(
            _scores, self.encoder.pooling, dim or self.dims[-1], p=p, p_mask=p_mask
        )
        return map_rows(fn, [q, q_mask], self.batch_size)

    def text_query_encoder(self, dim: int | None = None):
        """A jittable ``text -> [dim]`` query embedding of a byte string ``text`` (``.data``
        ``uint8 [S]``, ``.length``: an ``envs.text.Text``), for ``envs.text.DenseSearch`` over
        this encoder's passage embeddings, so the search runs inside a jitted environment step.
        BPE merges do not run in jit, so the query is read one byte token at a time
        (`Tokenizer.byte_token_ids`): the same text as `encode_queries` sees, tokenised more finely
        than in training, which costs some recall; `encode_queries` on the host is exact."""
        if self.encoder.pooling == "tokens":
            raise ValueError("a late-interaction encoder has no single query vector")
        byte_ids = jnp.asarray(self.tokenizer.byte_token_ids)
        length = self.encoder.query_length
        bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id

        def encode(text):
            n = jnp.minimum(jnp.minimum(text.length, text.data.shape[0]), length - 2)
            position = jnp.arange(length)
            body = byte_ids[text.data[jnp.clip(position - 1, 0, text.data.shape[0] - 1)]]
            tokens = jnp.where(position == 0, bos, jnp.where(position == n + 1, eos, body))
            mask = position <= n + 1
            tokens = jnp.where(mask, tokens, 0)
            vector = embed(self.params, self.config, self.encoder, tokens[None], mask[None])[0]
            return vector if dim is None else truncate(vector, dim)

        return encode

    def recall(self, split: RetrievalSplit, k: int = RECALL_K) -> dict[str, float]:
        """Recall@k of ``split``'s queries over its passages at every trained prefix:
        ``recall@k`` (full width) and ``recall@k_dim<m>``."""
        q, q_mask, p, p_mask = self.embed_texts(split.queries, split.passages)
        k = min(k, len(split.passages))
        out = {}
        for dim in self.dims:
            top = functools.partial(
                _top_k, p=p, p_mask=p_mask, pooling=self.encoder.pooling, dim=dim, k=k
            )
            ranked = map_rows(top, [q, q_mask], self.batch_size)
            hits = float(np.mean(np.any(ranked == split.positives[:, None], axis=1)))
            out[f"recall@{k}" if dim == self.dims[-1] else f"recall@{k}_dim{dim}"] = hits
        return out


def encoder_info(encoder: EncoderConfig, dims: Sequence[int], **extra) -> dict:
    """What a run saves beside an encoder's head for :func:`load_encoder`: its
    ``EncoderConfig`` and trained prefixes, and the trainer's ``extra`` fields."""
    return {"encoder": dataclasses.asdict(encoder), "dims": list(dims), **extra}


def load_encoder(run_dir) -> Encoder:
    """The encoder of a `train_encoder` run (``model/``, ``tokenizer.json``, the head)."""
    config, params, tokenizer, info = load_run(run_dir, HEAD)
    return Encoder(config, EncoderConfig(**info["encoder"]), params, tokenizer, tuple(info["dims"]))


def contrastive_batch(rows: dict[str, np.ndarray], split: RetrievalSplit, examples) -> dict:
    """The batch of queries ``examples``, each with its positive and hard negatives (``rows``:
    the split's padded ``query``, ``query_mask``, ``passage``, ``passage_mask``)."""
    ids = np.concatenate([split.positives[examples, None], split.hard_negatives[examples]], axis=1)
    return {
        "query": rows["query"][examples],
        "query_mask": rows["query_mask"][examples],
        "passages": rows["passage"][ids],
        "passage_mask": rows["passage_mask"][ids],
        "ids": ids.astype(np.int32),
    }


@gin.configurable(module="retrieval")
def train_encoder(
    workdir: str,
    *,
    init_from: str | None = None,
    tokenizer: str | None = None,
    model: TransformerConfig | None = None,
    encoder: EncoderConfig = EncoderConfig(),
    data: RetrievalDataSpec = RetrievalDataSpec(),
    dims: tuple[int, ...] = (),
    temperature: float = 0.05,
    settings: TrainSettings = TrainSettings(),
) -> dict:
    """Trains an encoder on ``data``'s training queries (anything whose ``splits()`` gives
    ``train`` and ``heldout`` splits), its trunk from run ``init_from`` (or a
    random ``model`` over the ``tokenizer`` file), with InfoNCE at temperature ``temperature``
    summed over the Matryoshka prefixes ``dims`` and the full width.  Records held-out
    recall@10 (per prefix) at every evaluation; resumes from the latest checkpoint in
    ``workdir``; saves the trunk as ``workdir/model`` and the head beside it
    (:func:`load_encoder`).  Returns the final metrics."""
    seed = settings.seed
    config, trunk, tok = load_trunk(init_from, tokenizer=tokenizer, model=model, seed=seed)
    dims = matryoshka_dims(dims, config, encoder)
    splits = data.splits()
    train_split, heldout = splits["train"], splits["heldout"]
    rows = dict(
        zip(("query", "query_mask"), text_rows(tok, train_split.queries, encoder.query_length))
    )
    rows |= dict(
        zip(
            ("passage", "passage_mask"),
            text_rows(tok, train_split.passages, encoder.passage_length),
        )
    )

    def evaluate(params):
        return Encoder(config, encoder, params, tok, dims, settings.batch_size).recall(heldout)

    return train(
        workdir,
        config=config,
        tokenizer=tok,
        params=init_encoder(trunk, config, encoder, jax.random.key(seed)),
        loss=encoder_loss(config, encoder, temperature=temperature, dims=dims),
        batch_of=functools.partial(contrastive_batch, rows, train_split),
        num_examples=len(train_split.queries),
        evaluate=evaluate,
        settings=settings,
        name=HEAD,
        info=encoder_info(encoder, dims, temperature=temperature),
    )
