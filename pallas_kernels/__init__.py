"""Custom attention and loss kernels, and the pure-jnp references they are tested against."""

from pallas_kernels.block_sizes import BlockSizes
from pallas_kernels.cross_entropy import cross_entropy_reference, fused_cross_entropy
from pallas_kernels.dispatch import choose_attention_backend, gpu_attention
from pallas_kernels.flash_attention import flash_attention
from pallas_kernels.paged_attention import paged_attention, paged_attention_reference
from pallas_kernels.paged_attention_triton import paged_attention_triton
from pallas_kernels.reference import reference_attention
from pallas_kernels.sharded import sharded_flash_attention

__all__ = [
    "BlockSizes",
    "choose_attention_backend",
    "cross_entropy_reference",
    "flash_attention",
    "fused_cross_entropy",
    "gpu_attention",
    "paged_attention",
    "paged_attention_reference",
    "paged_attention_triton",
    "reference_attention",
    "sharded_flash_attention",
]
