"""Per-tile math shared by the flash-attention forward, dQ and dK/dV kernels.

Every kernel sees one [bq, H] query tile and one [bk, H] key/value tile at a time.  This
module answers, for such a pair: is it worth computing (causal / window block skipping),
does it need an element mask, what are its capped, scaled logits, and which tile should
the pipeline fetch when the current one is skipped.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import masks
from pallas_kernels.block_sizes import Tiling


@dataclasses.dataclass(frozen=True)
class FlashConfig:
    """Static description of one attention problem (hashable: it keys the kernels' traces)."""

    causal: bool
    sliding_window: int | None
    soft_cap: float | None
    scale: float
    q_len: int  # T before padding
    kv_len: int  # S before padding
    groups: int  # N // K query heads per kv head
    has_segments: bool
    tiling: Tiling
    interpret: bool

    @property
    def kv_offset(self) -> int:
        """Absolute position of query row 0: queries are the last T of S positions."""
        return self.kv_len - self.q_len

    @property
    def kv_is_padded(self) -> bool:
        return self.tiling.kv_padded != self.kv_len


def tile_flags(cfg: FlashConfig, q_block, kv_block, bq: int, bk: int):
    """``(compute, needs_mask)`` for query tile ``q_block`` x key tile ``kv_block``.

    ``compute`` is false for tiles that causality or the window hide entirely (skipped,
    which is what makes causal attention ~2x cheaper); ``needs_mask`` is false for tiles
    that are visible everywhere, whose inner loop then skips building the mask.
    """
    q_first = q_block * bq + cfg.kv_offset
    k_first = kv_block * bk
    any_ok, all_ok = masks.block_visibility(
        q_first,
        q_first + bq - 1,
        k_first,
        k_first + bk - 1,
        causal=cfg.causal,
        sliding_window=cfg.sliding_window,
    )
    if cfg.has_segments:
        all_ok = False
    if cfg.kv_is_padded:
        all_ok = all_ok & (k_first + bk <= cfg.kv_len)
    return jnp.asarray(any_ok), jnp.logical_not(all_ok)


def clamp_kv_block(cfg: FlashConfig, q_block, kv_block, bq: int, bk: int, num_kv_blocks: int):
    """The key tile to fetch at grid step (q_block, kv_block): itself if visible, else the
    nearest visible one, so that skipped steps re-use the resident tile instead of a DMA."""
    q_first = q_block * bq + cfg.kv_offset
    lo, hi = masks.visible_block_span(
        q_first,
        q_first + bq - 1,
        other_is_key=True,
        other_offset=0,
        block=bk,
        num_blocks=num_kv_blocks,
        causal=cfg.causal,
        sliding_window=cfg.sliding_window,
    )
    return jnp.minimum(jnp.maximum(kv_block, lo), hi)


def clamp_q_block(cfg: FlashConfig, kv_block, q_block, bq: int, bk: int, num_q_blocks: int):
    """Mirror of :func:`clamp_kv_block` for kernels that loop over query tiles."""
    k_first = kv_block * bk
    lo, hi = masks.visible_block_span(
        k_first,
        k_first + bk - 1,
        other_is_key=False,
        other_offset=cfg.kv_offset,
        block=bq,
        num_blocks=num_q_blocks,
        causal=cfg.causal,
        sliding_window=cfg.sliding_window,
    )
    return jnp.minimum(jnp.maximum(q_block, lo), hi)


def tile_mask(cfg: FlashConfig, q_block, kv_block, bq: int, bk: int, q_seg=None, k_seg=None):
    """Boolean [bq, bk] visibility of one tile (same rule as ``masks.visible``)."""
    q_pos = q_block * bq + cfg.kv_offset + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    k_pos = kv_block * bk + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    ok = masks.visible(
        q_pos, k_pos, causal=cfg.causal, sliding_window=cfg.sliding_window, q_seg=q_seg, k_seg=k_seg
    )
    if cfg.kv_is_padded:
        ok = ok & (k_pos < cfg.kv_len)
    return ok


def on_visible_tiles(
    cfg: FlashConfig, q_block, kv_block, bq: int, bk: int, q_seg_ref, kv_seg_ref, body
):
    """Runs ``body(mask)`` unless the tile is hidden; ``mask`` is None for fully visible tiles
    (which then skip building it) and the [bq, bk] tile mask otherwise."""
    compute, needs_mask = tile_flags(cfg, q_block, kv_block, bq, bk)
    pl.when(compute & jnp.logical_not(needs_mask))(lambda: body(None))

    @pl.when(compute & needs_mask)
    def _():
        segs = (q_seg_ref[...], kv_seg_ref[...]) if cfg.has_segments else (None, None)
        body(tile_mask(cfg, q_block, kv_block, bq, bk, *segs))


def dot_nt(a, b):
    """a @ b.T with f32 accumulation (the MXU contracts b's minor axis natively)."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def dot_tn(a, b):
    """a.T @ b with f32 accumulation."""
    return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def dot_nn(a, b):
    return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def tile_logits(cfg: FlashConfig, q, k):
    """``cap(q k^T * scale)`` in f32, the logits the softmax sees."""
    s = dot_nt(q, k) * cfg.scale
    if cfg.soft_cap is not None:
        s = cfg.soft_cap * jnp.tanh(s / cfg.soft_cap)
    return s


def head_tile_spec(block, index_map):
    """BlockSpec of one [rows, cols] tile of a head-major [B, heads, L, cols] array."""
    return pl.BlockSpec((pl.squeezed, pl.squeezed, *block), index_map)


def segment_specs(bq: int, bk: int, q_map, kv_map):
    """BlockSpecs of q_seg [B, Tp, 1] and kv_seg [B, 1, Sp] that follow the tiles chosen by
    the query and key/value index maps ``(*grid) -> (b, head, tile, 0)``."""

    def q_seg(*grid):
        b, _, tile, _ = q_map(*grid)
        return b, tile, 0

    def kv_seg(*grid):
        b, _, tile, _ = kv_map(*grid)
        return b, 0, tile

    return [pl.BlockSpec((pl.squeezed, bq, 1), q_seg), pl.BlockSpec((pl.squeezed, 1, bk), kv_seg)]
