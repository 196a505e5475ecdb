"""COMA's counterfactual advantages against a slow numpy loop, and their zero mean under the
agent's own policy."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax import rl


@st.composite
def cases(draw):
    batch, agents, actions = (
        draw(st.integers(1, 3)),
        draw(st.integers(1, 4)),
        draw(st.integers(2, 5)),
    )
    q = draw(
        hnp.arrays(np.float32, (batch, agents, actions), elements=st.floats(-10, 10, width=32))
    )
    logits = draw(
        hnp.arrays(np.float32, (batch, agents, actions), elements=st.floats(-5, 5, width=32))
    )
    policy = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    taken = draw(hnp.arrays(np.int32, (batch, agents), elements=st.integers(0, actions - 1)))
    return q, policy.astype(np.float32), taken


@settings(max_examples=15, deadline=None)
@given(cases())
def test_counterfactual_advantages_match_a_loop_and_average_zero_under_the_policy(case):
    q, policy, taken = case
    got = np.asarray(rl.counterfactual_advantages(q, policy, taken))
    for b in range(q.shape[0]):
        for i in range(q.shape[1]):
            baseline = sum(policy[b, i, a] * q[b, i, a] for a in range(q.shape[2]))
            assert np.isclose(got[b, i], q[b, i, taken[b, i]] - baseline, atol=1e-4)
    # E_{u_i ~ π_i}[A_i] = 0: every action the agent could have taken, weighted by its policy
    every = np.stack(
        [
            np.asarray(rl.counterfactual_advantages(q, policy, np.full_like(taken, a)))
            for a in range(q.shape[2])
        ],
        axis=-1,
    )
    np.testing.assert_allclose(np.sum(policy * every, -1), 0.0, atol=1e-4)
