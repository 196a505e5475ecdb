"""Tile sizes of the flash-attention kernels and how a (T, S) problem is padded to them.

Sequence lengths need not be multiples of the tiles: queries and keys are zero-padded up
to a whole number of tiles, padded keys are masked inside the kernel and padded query rows
are sliced off.  Tiles larger than the (rounded-up) sequence shrink to it, so short
sequences do not pay for a full tile.
"""

from __future__ import annotations

import dataclasses
import math

from pallas_kernels.backend import target_platform

_SUBLANES = 8  # second-minor tile of a TPU vreg: every tile is a multiple of it
_LANES = 128  # minor tile: key tiles are the lane axis of the logits block on TPU


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Query/key tile sizes for the forward kernel and for both backward kernels.

    ``block_q_bwd``/``block_kv_bwd`` serve the dQ and the dK/dV kernels; the backward
    keeps more [block_q, block_kv] f32 intermediates live (P, dP, dS), so its TPU default
    tiles are smaller than the forward's.  All must be positive multiples of 8.
    """

    block_q: int = 128
    block_kv: int = 128
    block_q_bwd: int = 128
    block_kv_bwd: int = 128

    @classmethod
    def default(cls, platform: str | None = None) -> BlockSizes:
        """Per-backend defaults: large MXU-friendly tiles on TPU; moderate ones elsewhere,
        where the kernel only runs interpreted and fewer grid steps is what matters."""
        platform = platform or target_platform()
        if platform == "tpu":
            return cls(block_q=512, block_kv=512, block_q_bwd=256, block_kv_bwd=256)
        return cls()

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value <= 0 or value % _SUBLANES:
                raise ValueError(
                    f"BlockSizes.{field.name}={value!r} must be a positive multiple of {_SUBLANES}"
                )


@dataclasses.dataclass(frozen=True)
class Tiling:
    """Tiles actually used for one problem and the padded lengths they divide."""

    block_q: int
    block_kv: int
    block_q_bwd: int
    block_kv_bwd: int
    q_padded: int
    kv_padded: int


def _fit_axis(blocks: tuple[int, ...], length: int) -> tuple[tuple[int, ...], int]:
    """Tiles for one sequence axis and the padded length that all of them divide.

    Smallest tile first, each is capped at the length rounded up to the tiles before it, so
    power-of-two tiles stay powers of two and the padding stays below the largest tile.
    """
    unit, tiles = _SUBLANES, {}
    for block in sorted(set(blocks)):
        tiles[block] = min(block, _round_up(length, unit))
        unit = math.lcm(unit, tiles[block])
    return tuple(tiles[b] for b in blocks), _round_up(length, unit)


def plan_tiling(blocks: BlockSizes, q_len: int, kv_len: int, *, check_tpu_layout: bool) -> Tiling:
    """Shrinks tiles to the sequence, pads lengths to a common multiple, checks TPU layout.

    On TPU a key tile is the lane dimension of the logits block and of the key segment-id
    block, so it must be a multiple of 128 unless one tile spans the whole padded sequence.
    """
    (bq, bq_bwd), q_padded = _fit_axis((blocks.block_q, blocks.block_q_bwd), q_len)
    (bk, bk_bwd), kv_padded = _fit_axis((blocks.block_kv, blocks.block_kv_bwd), kv_len)
    if check_tpu_layout:
        for name, b in (("block_kv", bk), ("block_kv_bwd", bk_bwd)):
            if b % _LANES and b != kv_padded:
                raise ValueError(
                    f"{name}={b} must be a multiple of {_LANES} on TPU (or cover the whole "
                    f"key sequence, padded length {kv_padded})"
                )
    return Tiling(bq, bk, bq_bwd, bk_bwd, q_padded, kv_padded)
