"""Decoding: KV-cache generation, sampling, beam and contrastive search, constrained and
speculative decoding, over padded prompt batches inside one jitted loop."""
