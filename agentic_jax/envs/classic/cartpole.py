"""Cart-pole balancing with the classic dynamics, in `jnp`.

A pole hinged on a cart; push left or right (force ±10 N). Reward +1 per
step; the episode terminates when the pole leans past 12° or the cart leaves
±2.4 m, and is truncated after `max_steps` (500, as CartPole-v1). Euler
integration of the equations of Barto, Sutton & Anderson (1983), "Neuronlike
adaptive elements that can solve difficult learning control problems",
with the constants of OpenAI Gym's CartPole-v1. Solved: average return ≥ 475.
"""

import jax
import jax.numpy as jnp
from flax import struct

from agentic_jax.envs import spaces
from agentic_jax.envs.core import Env


@struct.dataclass
class CartPoleParams:
    gravity: float = 9.8
    mass_cart: float = 1.0
    mass_pole: float = 0.1
    half_length: float = 0.5
    force: float = 10.0
    tau: float = 0.02
    theta_limit: float = 12 * 2 * jnp.pi / 360
    x_limit: float = 2.4
    max_steps: int = 500


@struct.dataclass
class CartPoleState:
    physics: jax.Array  # [x, x_dot, theta, theta_dot]
    time: jax.Array


class CartPole(Env):
    """Observation: [x, ẋ, θ, θ̇] (float32); actions: 0 = push left, 1 = push right."""

    @property
    def default_params(self):
        return CartPoleParams()

    def reset_env(self, key, params):
        physics = jax.random.uniform(key, (4,), jnp.float32, -0.05, 0.05)
        return physics, CartPoleState(physics, jnp.int32(0))

    def step_env(self, key, state, action, params):
        x, x_dot, theta, theta_dot = state.physics
        force = jnp.where(action == 1, params.force, -params.force)
        total_mass = params.mass_cart + params.mass_pole
        pole_moment = params.mass_pole * params.half_length
        cos, sin = jnp.cos(theta), jnp.sin(theta)
        temp = (force + pole_moment * theta_dot**2 * sin) / total_mass
        theta_acc = (params.gravity * sin - cos * temp) / (
            params.half_length * (4.0 / 3.0 - params.mass_pole * cos**2 / total_mass)
        )
        x_acc = temp - pole_moment * theta_acc * cos / total_mass
        physics = jnp.stack(
            [
                x + params.tau * x_dot,
                x_dot + params.tau * x_acc,
                theta + params.tau * theta_dot,
                theta_dot + params.tau * theta_acc,
            ]
        )
        time = state.time + 1
        terminated = (jnp.abs(physics[0]) > params.x_limit) | (
            jnp.abs(physics[2]) > params.theta_limit
        )
        truncated = (time >= params.max_steps) & ~terminated
        return physics, CartPoleState(physics, time), jnp.float32(1.0), terminated, truncated, {}

    def observation_space(self, params=None):
        params = self.default_params if params is None else params
        high = [params.x_limit * 2, jnp.inf, params.theta_limit * 2, jnp.inf]
        return spaces.Box([-h for h in high], high, (4,))

    def action_space(self, params=None):
        return spaces.Discrete(2)
