"""Small functional MLPs for the classic agents (params are plain pytrees).

Orthogonal initialisation with gain √2 on hidden layers and a small gain on
policy heads, as in PPO implementations (Engstrom et al., 2020,
arXiv:2005.12729; Huang et al., 2022, "The 37 implementation details of PPO").
"""

import jax
import jax.numpy as jnp


def mlp_init(
    key: jax.Array, sizes: tuple[int, ...], head_gain: float = 1.0
) -> list[dict[str, jax.Array]]:
    """Layers `sizes[0] → … → sizes[-1]`: [{"w", "b"}, …]."""
    keys = jax.random.split(key, len(sizes) - 1)
    gains = [jnp.sqrt(2.0)] * (len(sizes) - 2) + [head_gain]
    return [
        {
            "w": jax.nn.initializers.orthogonal(gain)(k, (n_in, n_out), jnp.float32),
            "b": jnp.zeros((n_out,), jnp.float32),
        }
        for k, n_in, n_out, gain in zip(keys, sizes[:-1], sizes[1:], gains, strict=True)
    ]


def mlp_apply(params: list[dict[str, jax.Array]], x: jax.Array, activation=jnp.tanh) -> jax.Array:
    """Applies the MLP on the last axis of `x` (any leading axes)."""
    x = jnp.asarray(x, jnp.float32)
    for layer in params[:-1]:
        x = activation(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def actor_critic_init(
    key: jax.Array, obs_dim: int, num_actions: int, hidden: tuple[int, ...] = (64, 64)
) -> dict:
    """Separate policy and value MLPs: {"actor": …, "critic": …}."""
    key_actor, key_critic = jax.random.split(key)
    return {
        "actor": mlp_init(key_actor, (obs_dim, *hidden, num_actions), head_gain=0.01),
        "critic": mlp_init(key_critic, (obs_dim, *hidden, 1), head_gain=1.0),
    }


def actor_critic_apply(params: dict, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logits [..., A], value [...])."""
    return mlp_apply(params["actor"], obs), mlp_apply(params["critic"], obs)[..., 0]
