"""Test helper: a model's cached decoders (``generate``'s KV cache, the paged serving engine)
against its own full forward pass, token by token."""

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.inference.decoding.generate import generate
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.engine import Engine, EngineConfig, Request
from agentic_jax.models import forward, param_shapes

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


def random_params(config, std=0.3, seed=0):
    """Parameters large enough that logits differ clearly between tokens (unit norms kept)."""
    rng = np.random.default_rng(seed)

    def make(path, s):
        if "norm" in jax.tree_util.keystr(path) and "bias" not in jax.tree_util.keystr(path):
            return jnp.asarray(1.0 + rng.normal(0.0, 0.1, s.shape), s.dtype)
        return jnp.asarray(rng.normal(0.0, std, s.shape), s.dtype)

    return jax.tree_util.tree_map_with_path(make, param_shapes(config))


def prompts(config, lengths=(5, 3)):
    rng = np.random.default_rng(1)
    return [rng.integers(0, config.vocab_size, n).tolist() for n in lengths]


def assert_generate_matches_forward(params, config, rows, atol=2e-4):
    """Greedy ``generate`` (prefill, then one cached token per step) gives, at every step, the
    logits of a full forward pass over the prompt and the tokens generated so far."""
    out = generate(params, config, rows, sampling=GREEDY, key=jax.random.key(0), return_logits=True)
    for b, prompt in enumerate(rows):
        tokens = prompt + np.asarray(out.tokens[b]).tolist()
        full = forward(params, config, jnp.asarray([tokens]))[0]
        want = full[len(prompt) - 1 : len(tokens) - 1]
        np.testing.assert_allclose(out.logits[b], want, atol=atol, rtol=1e-4)


def assert_engine_matches_forward(params, config, rows, atol=2e-4):
    """The paged engine's greedy tokens are the forward pass's argmax and their log-probabilities
    its log-softmax, token by token (prefill, then paged decoding)."""
    engine = Engine(params, config, EngineConfig(num_slots=2, block_size=4, max_model_len=32))
    done = engine.generate([Request(r, GREEDY) for r in rows])
    for prompt, completion in zip(rows, done):
        tokens = list(prompt) + list(completion.tokens)
        logp = jax.nn.log_softmax(forward(params, config, jnp.asarray([tokens]))[0])
        steps = logp[len(prompt) - 1 : len(tokens) - 1]
        assert list(completion.tokens) == np.asarray(steps.argmax(-1)).tolist()
        picked = jnp.take_along_axis(steps, jnp.asarray(completion.tokens)[:, None], axis=1)
        np.testing.assert_allclose(completion.logprobs, picked[:, 0], atol=atol)


def loss_decreases(config, steps=3, lr=0.1):
    """A few full-batch SGD steps on a random batch lower the next-token loss."""
    params = random_params(config, std=0.1)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, config.vocab_size, (2, 12)))

    def loss(p):
        logp = jax.nn.log_softmax(forward(p, config, tokens[:, :-1]))
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

    step = jax.jit(jax.value_and_grad(loss))
    first, _ = step(params)
    for _ in range(steps):
        _, grads = step(params)
        assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
        params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    return float(first), float(step(params)[0])
