"""Draft heads on the target's own hidden states: Medusa and EAGLE, each drafting a tree.

Both read the target's final-norm hidden state ``f_t`` (the LM head's input at position ``t``,
which predicts token ``t + 1``), so drafting costs a few small matmuls instead of a second model.

* **Medusa** (Cai et al. 2024): ``K`` heads on ``f_t``; head ``k`` (1-based) predicts token
  ``t + k + 1`` through a residual SiLU block and an LM head, ``logits_k = LM(f_t + SiLU(W_k f_t
  + b_k))``, the LM head the target's own (shared) or one per head.  ``W_k`` starts at zero (the
  paper's initialisation: every head starts as the target's next-token head).  The heads see
  one state, so their drafts at different depths are independent guesses; the tree's depth is at
  most ``K``.
* **EAGLE** (Li et al. 2024): one decoder layer that drafts *features*: from ``x_{t+1}``'s
  embedding and ``f_t``, concatenated and projected (``fc``: ``2D → D``), it predicts ``f_{t+1}``,
  which the target's LM head turns into token ``t + 2``'s distribution; drafting is
  autoregressive over features, each tree node feeding its own token and its parent's predicted
  feature.  The layer keeps a KV cache of its own; every round starts by running it over the
  tokens just accepted with the target's true features (which the verification pass computed).

A round here: the cache holds every token before the root (the last emitted token), ``pending``
(:class:`Pending`) holds the ``(token, feature)`` pairs not yet run through the EAGLE layer, the
last of them the root with the feature that predicted it; :func:`propose_tree` grows a branching
tree (``draft_tree.grow_tree``) from the head's log-probabilities; the caller verifies it
(``tree_speculative``) and builds the next ``Pending`` from the target's features along the
accepted path (:func:`next_pending`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from agentic_jax.inference.decoding.draft_tree import (
    TreeShape,
    grow_tree,
    tree_ancestors,
)
from agentic_jax.inference.decoding.kv_cache import Tree, cached_attend, chain, init_cache
from agentic_jax.models import TransformerConfig, init_params, lm_head_weight, logits_from_hidden
from agentic_jax.models.rope import rope_tables
from agentic_jax.models.transformer import apply_layers, embed_tokens


class MedusaHeads(NamedTuple):
    """``K`` Medusa heads: residual blocks ``w[K, D, D]``, ``b[K, D]`` and, unless they share the
    target's, their own LM heads ``lm_head[K, D, V]``."""

    w: jax.Array
    b: jax.Array
    lm_head: jax.Array | None = None


def init_medusa(
    params, config: TransformerConfig, num_heads: int, key, *, std: float = 0.0, own_lm_head=False
) -> MedusaHeads:
    """``num_heads`` heads; ``W_k ~ N(0, std)`` (0: Medusa's zero start), ``b_k = 0``; with
    ``own_lm_head`` each head starts from a copy of the target's LM head."""
    if num_heads < 1:
        raise ValueError(f"init_medusa needs num_heads >= 1, got {num_heads}")
    d = config.d_model
    w = std * jax.random.normal(key, (num_heads, d, d), jnp.float32)
    lm_head = None
    if own_lm_head:
        lm_head = jnp.tile(
            lm_head_weight(params, config)[None].astype(jnp.float32), (num_heads, 1, 1)
        )
    return MedusaHeads(w, jnp.zeros((num_heads, d), jnp.float32), lm_head)


def medusa_logits(heads: MedusaHeads, params, config: TransformerConfig, h):
    """``[B, T, K, V]``: head ``k``'s logits for token ``t + k + 1`` from ``h[B, T, D]``."""
    b, t, d = h.shape
    k = heads.w.shape[0]
    dtype = config.compute_dtype
    z = h[:, :, None] + jax.nn.silu(
        jnp.einsum("btd,kde->btke", h, heads.w.astype(dtype)) + heads.b.astype(dtype)
    )
    if heads.lm_head is None:
        return logits_from_hidden(params, config, z.reshape(b, t * k, d)).reshape(b, t, k, -1)
    return jnp.einsum(
        "btkd,kdv->btkv", z, heads.lm_head.astype(dtype), preferred_element_type=jnp.float32
    )


class EagleHead(NamedTuple):
    """EAGLE's draft: ``fc[2D, D]`` and one decoder layer (``layer``: the parameters of
    :func:`eagle_config`'s one-layer stack)."""

    fc: jax.Array
    layer: dict


def eagle_config(config: TransformerConfig) -> TransformerConfig:
    """The draft layer's config: one dense, global-attention layer of the target's shape."""
    return config.replace(n_layers=1, n_experts=0, sliding_window=None, sliding_window_pattern=None)


def init_eagle(config: TransformerConfig, key) -> EagleHead:
    """A random EAGLE head (``fc`` and the layer drawn like the model's weights)."""
    k_fc, k_layer = jax.random.split(key)
    d = config.d_model
    fc = config.init_std * jax.random.normal(k_fc, (2 * d, d), jnp.float32)
    return EagleHead(fc, init_params(eagle_config(config), k_layer)["layers"])


def save_head(path, head: MedusaHeads | EagleHead) -> Path:
    """Writes ``path/params`` (orbax) and ``path/head.json`` (its kind and sizes)."""
    path = Path(path).absolute()
    fields = {k: v for k, v in head._asdict().items() if v is not None}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / "params", jax.device_get(fields))
    kind = "medusa" if isinstance(head, MedusaHeads) else "eagle"
    about = {"kind": kind, "num_heads": int(head.w.shape[0]) if kind == "medusa" else 0}
    about["own_lm_head"] = kind == "medusa" and head.lm_head is not None
    (path / "head.json").write_text(json.dumps(about))
    return path


def load_head(path, params, config: TransformerConfig) -> MedusaHeads | EagleHead:
    """The head :func:`save_head` wrote, for the target ``(params, config)`` it was trained on."""
    path = Path(path).absolute()
    about = json.loads((path / "head.json").read_text())
    key = jax.random.key(0)
    if about["kind"] == "medusa":
        template = init_medusa(
            params, config, about["num_heads"], key, own_lm_head=about["own_lm_head"]
        )
    else:
        template = init_eagle(config, key)
    fields = {k: v for k, v in template._asdict().items() if v is not None}
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(
            path / "params", jax.tree.map(ocp.utils.to_shape_dtype_struct, fields)
        )
    return type(template)(**restored)


def eagle_features(
    head: EagleHead, params, config: TransformerConfig, tokens, features, positions, attend, state
):
    """``(predicted features [B, T, D], state)``: the layer on ``fc([embed(tokens); features])``,
    token ``t`` being the one ``features[t]`` predicted.  ``attend``/``state`` as in
    ``models.transformer.apply_layers`` (a KV cache's, or plain self-attention and ``None``)."""
    layer_config = eagle_config(config)
    dtype = layer_config.compute_dtype
    x = jnp.concatenate([embed_tokens(params, config, tokens), features.astype(dtype)], axis=-1)
    x = jnp.einsum("btf,fd->btd", x, head.fc.astype(dtype))
    cos, sin = rope_tables(layer_config, positions)
    x, state, _ = apply_layers(
        layer_config, head.layer, x, cos, sin, attend, state, absorbed=state is not None
    )
    return x, state


def _eagle_extend(head, params, config, cache, tokens, features, start, write, tree: Tree):
    """:func:`eagle_features` for a block at slots ``write + [0, T)`` against the layer's cache."""
    attend, positions = cached_attend(eagle_config(config), cache, start, write, tree)
    out, state = eagle_features(
        head, params, config, tokens, features, positions, attend, tuple(cache)
    )
    return out, type(cache)(*state)


class Pending(NamedTuple):
    """``(token, feature)`` pairs at slots ``slot + [0, count)`` not yet through the draft
    layer; ``features[i]`` predicted ``tokens[i]``; the last pair is the root's."""

    tokens: jax.Array  # [B, depth + 1]
    features: jax.Array  # [B, depth + 1, D]
    count: jax.Array  # [B] >= 1
    slot: jax.Array  # [B]


def _pick(x, idx):
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 1)), axis=1)[:, 0]


def first_pending(tokens, hidden, start, end, depth: int) -> Pending:
    """The root (``tokens[:, end - 1]``) with the prompt's feature that predicted it."""
    b = tokens.shape[0]
    rows = jnp.arange(b)
    pad = jnp.zeros((b, depth), jnp.int32)
    feature = jnp.where((end - 2 >= start)[:, None], hidden[rows, jnp.maximum(end - 2, 0)], 0.0)
    features = jnp.zeros((b, depth + 1, hidden.shape[-1]), hidden.dtype).at[:, 0].set(feature)
    return Pending(
        jnp.concatenate([tokens[rows, end - 1][:, None], pad], 1),
        features,
        jnp.ones((b,), jnp.int32),
        end - 1,
    )


def next_pending(path_tokens, path_features, accepted, final, root_slot) -> Pending:
    """The pairs after a verified round: the accepted drafts ``path_tokens[:, :n]`` and the
    final token, each with the target's feature at the node before it (``path_features[B,
    depth + 1, D]``: the root's, then the path's)."""
    k = jnp.arange(path_features.shape[1])[None, :]
    tokens = jnp.where(
        k < accepted[:, None], jnp.pad(path_tokens, ((0, 0), (0, 1))), final[:, None]
    )
    return Pending(tokens, path_features, accepted + 1, root_slot + 1)


def init_draft_cache(head, params, config: TransformerConfig, prompts, hidden, max_len: int):
    """EAGLE's layer cache over the prompt before the root (``hidden[B, P, D]``: the target's
    features of ``prompts``, a ``PromptBatch`` ending before the root); Medusa keeps none."""
    if isinstance(head, MedusaHeads):
        return None
    b, p = prompts.tokens.shape
    idx = prompts.start[:, None] + jnp.arange(p)[None, :]  # row b's tokens from slot start[b] on
    tokens = jnp.take_along_axis(prompts.tokens, jnp.clip(idx, 0, p - 1), axis=1)
    prev = jnp.take_along_axis(hidden, jnp.clip(idx - 1, 0, p - 1)[:, :, None], axis=1)
    features = jnp.where((idx > prompts.start[:, None])[:, :, None], prev, 0.0)
    cache = init_cache(eagle_config(config), b, max_len)
    _, cache = _eagle_extend(
        head, params, config, cache, tokens, features, prompts.start, prompts.start, chain(p)
    )
    return cache


def propose_tree(head, params, config: TransformerConfig, shape: TreeShape, cache, pending, start):
    """``(DraftTree, cache)``: a tree grown from the head's log-probabilities after the root."""
    if isinstance(head, MedusaHeads):
        if shape.depth > head.w.shape[0]:
            raise ValueError(f"tree depth {shape.depth} exceeds the {head.w.shape[0]} Medusa heads")
        feature = _pick(pending.features, pending.count - 1)
        logp = jax.nn.log_softmax(medusa_logits(head, params, config, feature[:, None])[:, 0])

        def medusa_children(level, tree, carry):
            width = shape.levels[level - 1][1]
            return jnp.broadcast_to(
                logp[:, level, None], (logp.shape[0], width, logp.shape[-1])
            ), carry

        return grow_tree(shape, logp[:, 0], medusa_children), cache
    out, cache = _eagle_extend(
        head,
        params,
        config,
        cache,
        pending.tokens,
        pending.features,
        start,
        pending.slot,
        chain(pending.tokens.shape[1]),
    )
    root_slot = pending.slot + pending.count - 1
    predicted = _pick(out, pending.count - 1)  # the root's next feature
    depth = jnp.asarray(shape.node_depth[1:] - 1)

    def lm_logp(h):
        return jax.nn.log_softmax(logits_from_hidden(params, config, h))

    def eagle_children(level, tree, outputs):
        # Every node so far, each with its parent's predicted feature, in one pass at the slots
        # after the root; nodes of later levels are junk that no earlier node sees.
        features = jnp.take_along_axis(
            jnp.concatenate([predicted[:, None], outputs], axis=1), tree.parents[:, :, None], 1
        )
        ancestors = tree_ancestors(shape, tree.parents)[:, 1:, 1:]
        outputs, _ = _eagle_extend(
            head,
            params,
            config,
            cache,
            tree.tokens,
            features,
            start,
            root_slot + 1,
            Tree(ancestors, depth),
        )
        first, width = shape.levels[level - 1]
        return lm_logp(outputs[:, first - 1 : first - 1 + width]), outputs

    outputs = jnp.zeros(out.shape[:1] + (shape.nodes - 1, out.shape[-1]), out.dtype)
    tree = grow_tree(shape, lm_logp(predicted[:, None])[:, 0], eagle_children, outputs)
    return tree, cache
