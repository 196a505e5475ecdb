"""`evaluate_policy` against a scripted policy whose per-problem outcomes are known in advance."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import task_tokenizer

from agentic_jax.data.tokenizer import IM_END
from agentic_jax.envs.text import Arithmetic
from agentic_jax.eval import pass_at_k
from agentic_jax.models import TransformerConfig
from agentic_jax.post_training.evaluate import evaluate_policy
from agentic_jax.post_training.tasks import TaskSpec

SPEC = TaskSpec(
    generators=(Arithmetic(1, use_tools=False),),
    num_heldout=24,
    max_length=96,
    action_length=24,
)


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """The held-out env, the bank rows with distinct prompts, and a policy that answers a row's
    problem correctly exactly when its bank index is odd (identified by its prompt tokens)."""
    tokenizer = task_tokenizer(tmp_path_factory.mktemp("tok"))
    env = SPEC.env(tokenizer, "heldout")
    bank = env.default_params.tasks
    prompts = [tuple(np.asarray(bank.prompt[i, : bank.prompt_length[i]])) for i in range(24)]
    distinct = [i for i, p in enumerate(prompts) if prompts.count(p) == 1]
    assert len(distinct) >= 16, "too few distinct held-out problems for the test"
    tasks = SPEC.tasks("heldout")
    pad = env.default_params.vocab.pad_id

    def reply(index):
        answer = tasks[index].answer if index % 2 else "nothing"
        ids = tokenizer.encode(f"<think>so</think><answer>{answer}</answer>")
        ids = ids + [tokenizer.token_id(IM_END)]
        return ids + [pad] * (SPEC.action_length - len(ids))

    def scripted(tokens, length, active, key):
        rows = [
            next(i for i, p in enumerate(prompts) if tuple(row[: len(p)]) == p) for row in tokens
        ]
        actions = np.asarray([reply(i) for i in rows], np.int32)
        return actions, np.where(actions != pad, -1.0, 0.0).astype(np.float32)

    config = TransformerConfig(vocab_size=tokenizer.vocab_size, max_seq_len=SPEC.context_length)
    return env, np.asarray(distinct), scripted, config


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.integers(1, 9),  # batch_rows: chunks of every size, the last one padded
    st.integers(0, 3),  # samples
    st.integers(1, 20),  # how many problems
    st.randoms(use_true_random=False),
)
def test_per_problem_success_is_exactly_the_scripted_one_whatever_the_chunking(
    problems, batch_rows, samples, count, rng
):
    env, distinct, scripted, config = problems
    chosen = np.asarray(rng.sample(list(distinct), min(count, len(distinct))))
    result = evaluate_policy(
        None, config, env, samples=samples, batch_rows=batch_rows, tasks=chosen, backend=scripted
    )
    odd = chosen % 2 == 1
    np.testing.assert_array_equal(result.success, odd)
    assert result.summary()["success"] == pytest.approx(odd.mean())
    if samples == 0:
        assert result.sampled_correct is None and "pass@1" not in result.summary()
        return
    np.testing.assert_array_equal(result.sampled_correct, np.where(odd, samples, 0))
    for k in {1, samples}:
        expected = np.mean(pass_at_k(samples, result.sampled_correct, k))
        assert result.summary()[f"pass@{k}"] == pytest.approx(expected)
        assert expected == pytest.approx(odd.mean())
