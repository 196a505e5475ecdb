"""Speculative decoding with draft heads (Medusa, EAGLE) and a branching tree per round.

Each round: the head drafts a tree after the root (``draft_heads.propose_tree``, grown by
``draft_tree.grow_tree`` within a ``TreeShape``'s node budget); the target scores the root and
every node in one pass with a per-row tree attention mask (``kv_cache.Tree``), whose hidden
states are also the features the heads read next round; ``draft_tree.verify_tree`` accepts the
longest path its multi-candidate rule allows and draws the correction or bonus token, so the
output follows the target's sampling distribution exactly (greedy rows: token for token).  The
accepted nodes' cache slots move next to the root and ``write`` drops past them, which rolls back
every other node.  Rows are independent: each accepts its own number of tokens per round, and
``SpeculativeResult`` reports, per row, the target passes and accepted drafts (``tokens_per_step``
is the emitted tokens per target forward).

Constraints (``TokenConstraint``) are not supported here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from agentic_jax.inference.decoding.draft_heads import (
    EagleHead,
    MedusaHeads,
    first_pending,
    init_draft_cache,
    next_pending,
    propose_tree,
)
from agentic_jax.inference.decoding.draft_tree import TreeShape, tree_mask, verify_tree
from agentic_jax.inference.decoding.generate import (
    max_tokens,
    run_prefill,
    sampling_arrays,
    uses_counts,
)
from agentic_jax.inference.decoding.kv_cache import extend_logits, move_slots
from agentic_jax.inference.decoding.prompts import PromptBatch, as_prompt_batch
from agentic_jax.inference.decoding.sampling import SamplingArrays, SamplingParams, row_keys
from agentic_jax.inference.decoding.speculative import (
    Emission,
    SpeculativeResult,
    node_distributions,
    record_round,
    speculative_result,
    start_emission,
)
from agentic_jax.models import TransformerConfig


@functools.partial(
    jax.jit, static_argnames=("config", "shape", "max_new", "eos_id", "pad_id", "track_counts")
)
def _tree_speculative(
    params,
    config: TransformerConfig,
    head,
    prompts: PromptBatch,
    arrays: SamplingArrays,
    key,
    *,
    shape: TreeShape,
    max_new: int,
    eos_id,
    pad_id: int,
    track_counts: bool,
) -> SpeculativeResult:
    b, p = prompts.tokens.shape
    depth = shape.depth
    max_len = p + max_new + shape.nodes + depth + 2
    # The last prompt token is each round's root, so the caches hold everything before it.
    before_root = PromptBatch(prompts.tokens, prompts.start, prompts.end - 1)
    pre = run_prefill(params, config, before_root, max_len)
    draft_cache = init_draft_cache(head, params, config, before_root, pre.hidden, max_len)
    pending = first_pending(prompts.tokens, pre.hidden, prompts.start, prompts.end, depth)
    init, prompt_counts = start_emission(
        prompts,
        config.vocab_size,
        max_len,
        max_new + depth + 1,
        track_counts=track_counts,
        pad_id=pad_id,
    )
    rows = jnp.arange(b)
    k = jnp.arange(depth + 1)[None, :]

    def cond(carry):
        return ~carry[-1].done.all()

    def body(carry):
        cache, draft_cache, pending, emission = carry
        length = prompts.end + emission.out.lengths  # the root sits at slot length - 1
        write = length - 1
        block_root = emission.seq[rows, write]
        keys = row_keys(key, arrays, emission.out.lengths)
        tree, draft_cache = propose_tree(
            head, params, config, shape, draft_cache, pending, prompts.start
        )
        mask = tree_mask(shape, tree.parents)
        block = jnp.concatenate([block_root[:, None], tree.tokens], axis=1)
        logits, hidden, cache = extend_logits(
            params, config, cache, block, prompts.start, write, mask
        )
        on_path = mask.ancestors.at[:, :, 0].set(False).astype(jnp.int32)
        filtered = node_distributions(
            logits, block, on_path, arrays, emission.counts, prompt_counts, eos_id=eos_id
        )
        verdict = verify_tree(
            shape,
            jax.nn.softmax(filtered, axis=-1),
            tree,
            jax.vmap(jax.random.fold_in)(keys, jnp.full((b,), 2)),
        )
        n = verdict.accepted
        # Token i of the round is drawn at node[i]: the root, then the accepted path.
        node = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), verdict.path], axis=1)
        path_tokens = jnp.take_along_axis(block, verdict.path, axis=1)
        emission = record_round(
            emission,
            path_tokens,
            verdict.final,
            node,
            n,
            logits,
            filtered,
            arrays,
            length,
            eos_id=eos_id,
            pad_id=pad_id,
        )
        cache = move_slots(cache, write[:, None] + verdict.path, length[:, None] + k[:, :depth])
        features = jnp.take_along_axis(hidden, node[:, :, None], axis=1)
        pending = next_pending(path_tokens, features, n, verdict.final, write)
        return cache, draft_cache, pending, emission

    carry = jax.lax.while_loop(cond, body, (pre.cache, draft_cache, pending, init))
    return speculative_result(Emission(*carry[-1]), max_new, depth)


def tree_speculative_generate(
    params,
    config: TransformerConfig,
    prompts,
    *,
    head: MedusaHeads | EagleHead,
    sampling: SamplingParams | Sequence[SamplingParams],
    key,
    shape: TreeShape = TreeShape(),
    eos_id: int | None = None,
    pad_id: int = 0,
    padding: str = "left",
) -> SpeculativeResult:
    """Samples like ``generate``, drafting a ``shape`` tree per round with ``head``.

    ``head``: :class:`MedusaHeads` (``shape.depth`` at most its number of heads) or
    :class:`EagleHead`, trained on this target (``post_training.draft_heads``); untrained heads
    give the same output, only fewer tokens per target pass.
    """
    if not isinstance(head, (MedusaHeads, EagleHead)):
        raise ValueError(f"head must be MedusaHeads or EagleHead, got {type(head).__name__}")
    if shape.branching > config.vocab_size:
        raise ValueError(
            f"branching={shape.branching} exceeds vocab_size={config.vocab_size}: siblings are "
            "distinct tokens"
        )
    prompts = as_prompt_batch(prompts, padding=padding, pad_id=pad_id, vocab_size=config.vocab_size)
    return _tree_speculative(
        params,
        config,
        head,
        prompts,
        sampling_arrays(sampling, prompts.tokens.shape[0]),
        key,
        shape=shape,
        max_new=max_tokens(sampling),
        eos_id=eos_id,
        pad_id=pad_id,
        track_counts=uses_counts(sampling),
    )
