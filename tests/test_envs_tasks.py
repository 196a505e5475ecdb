"""Task generators: demonstrations earn the full reward in the jitted env and reproduce render_ids."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import task_tokenizer

from agentic_jax.envs.text import (
    Arithmetic,
    Countdown,
    MultiHop,
    calculator,
    demonstration_actions,
    demonstration_batch,
    task_env,
)

GENERATORS = (
    Arithmetic(2),
    Arithmetic(2, use_tools=False),
    Countdown(2),
    MultiHop(2),
    MultiHop(2, tool="search"),
)
SEEDS = range(3)
ACTION = 64


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return task_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def replayed(tokenizer):
    """Every task's correct and corrupted demonstration replayed in one multi-task env."""
    env = task_env(tokenizer, GENERATORS, SEEDS, max_length=640, action_length=ACTION)
    tasks = [t for g in GENERATORS for t in g.tasks(SEEDS)]
    episodes = [(i, correct) for i in range(len(tasks)) for correct in (True, False)]
    rendered = [tasks[i].render(tokenizer, correct) for i, correct in episodes]
    actions = [demonstration_actions(r, ACTION) for r in rendered]
    params = env.default_params
    reset, step = (
        jax.jit(env.reset),
        jax.jit(env.step),
    )  # one episode at a time: cheaper to compile than vmap
    results = []
    for (i, correct), r, a in zip(episodes, rendered, actions):
        _, state = reset(
            jax.random.key(0), params.replace(task_weights=jnp.zeros(len(tasks)).at[i].set(1.0))
        )
        ended_early = False
        for t, action in enumerate(a):
            _, state, reward, terminated, truncated, info = step(
                jax.random.key(t), state, action, params
            )
            ended_early |= t < len(a) - 1 and bool(terminated | truncated)
        results.append(
            {
                "task": tasks[i],
                "correct": correct,
                "rendered": r,
                "reward": float(reward),
                "early_end": ended_early,
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "final": jax.tree.map(np.asarray, info["final_observation"]),
            }
        )
    return env, results


def test_demonstrations_earn_the_full_reward_and_corrupted_ones_do_not(replayed):
    env, results = replayed
    families = set()
    for r in results:
        task, full = r["task"], env.reward.rewards[r["task"].family].max_value
        assert r["terminated"] and not r["truncated"] and not r["early_end"]
        content = task.conversation(r["correct"])[-1].content
        assert r["reward"] == pytest.approx(
            env.reward.host(content, task), abs=1e-6
        )  # jit == host verifier
        if r["correct"]:
            assert r["reward"] == pytest.approx(full)
        else:
            assert r["reward"] < full - 0.5
        families.add(task.family)
    assert families == {"Arithmetic", "Countdown", "MultiHop"}


def test_replayed_demonstration_is_render_ids_with_the_assistant_mask(replayed):
    _, results = replayed
    for r in results:
        ids, mask = r["rendered"]
        n = int(r["final"]["length"])
        assert (
            n == len(ids) - 1
        )  # everything but the newline render_ids puts after the last <|im_end|>
        np.testing.assert_array_equal(r["final"]["tokens"][:n], ids[:n])
        np.testing.assert_array_equal(r["final"]["loss_mask"][:n], mask[:n])
        assert r["final"]["loss_mask"][n:].sum() == 0


def test_tool_messages_in_demonstrations_come_from_the_tools():
    arithmetic, countdown, hop, search = (
        Arithmetic(3).sample(5),
        Countdown(3).sample(5),
        MultiHop(3).sample(5),
        MultiHop(3, tool="search").sample(5),
    )
    steps = [m for m in arithmetic.demonstration if m.role == "tool"]
    assert len(steps) == 3 and steps[-1].content == arithmetic.answer
    assert [m.content for m in countdown.demonstration if m.role == "tool"] == [
        str(countdown.value)
    ]
    facts = dict(hop.facts)
    calls = [m.tool_calls[0].arguments["key"] for m in hop.demonstration if m.tool_calls]
    results = [m.content for m in hop.demonstration if m.role == "tool"]
    assert len(calls) == 3 and results == [facts[k] for k in calls] and results[-1] == hop.answer
    assert all(
        any(d in m.content for d in search.documents)
        for m in search.demonstration
        if m.role == "tool"
    )


def test_generators_are_seeded_and_difficulty_scales_the_task():
    assert Countdown(4).sample(7) == Countdown(4).sample(7) and Countdown(4).sample(7) != Countdown(
        4
    ).sample(8)
    for difficulty in (1, 4):
        arithmetic = Arithmetic(difficulty).sample(0)
        assert sum(arithmetic.prompt[-1].content.count(op) for op in "+-*") == difficulty
        assert (
            eval(arithmetic.prompt[-1].content.removeprefix("What is ").removesuffix("?"))
            == arithmetic.value
        )
        assert len(Countdown(difficulty).sample(0).numbers) == difficulty + 1
        assert (
            sum(1 for m in MultiHop(difficulty).sample(0).demonstration if m.tool_calls)
            == difficulty
        )
    assert len(Arithmetic(3, use_tools=False).sample(0).demonstration) == 1
    with pytest.raises(ValueError):
        Arithmetic(0)


def test_preference_batches_share_the_prompts_and_differ_in_the_answers(tokenizer):
    tasks = Countdown(3).tasks(range(4))
    chosen, chosen_mask = demonstration_batch(tasks, tokenizer, 320)
    rejected, _ = demonstration_batch(tasks, tokenizer, 320, correct=False)
    for row, task in enumerate(tasks):
        prompt, rendered = task.prompt_ids(tokenizer), task.render(tokenizer)
        assert (
            chosen[row, : len(prompt)].tolist()
            == rejected[row, : len(prompt)].tolist()
            == prompt.tolist()
        )
        assert chosen[row].tolist() != rejected[row].tolist()
        assert chosen_mask[row, : len(rendered.ids)].tolist() == rendered.assistant_mask.tolist()
        assert (
            chosen_mask[row, : len(prompt)].sum() == 0
            and chosen_mask[row, len(rendered.ids) :].sum() == 0
        )
    with pytest.raises(ValueError):
        demonstration_batch(tasks, tokenizer, 16)


def test_arithmetic_without_partial_credit_pays_only_for_exact_answers():
    task = Arithmetic(1).sample(4)
    close = f"<think>x</think><answer>{task.value + 1}</answer>"
    exact = f"<think>x</think><answer>{task.value}</answer>"
    with_credit, exact_only = Arithmetic(1).reward, Arithmetic(1, partial_credit=False).reward
    assert with_credit.host(close, task) == pytest.approx(0.1 + 0.1 * 0.5)
    assert exact_only.host(close, task) == pytest.approx(0.1)
    assert with_credit.host(exact, task) == exact_only.host(exact, task) == pytest.approx(1.0)


@pytest.mark.parametrize("generator, seeds", [(Arithmetic(8), [13, 42]), (Countdown(10), range(3))])
def test_hard_tasks_stay_within_the_calculator_and_their_demonstrations_earn_the_full_reward(
    generator, seeds
):
    # Long products leave int32 (the bank's value, the tool's arithmetic); long solutions the tool's 48 bytes.
    for task in generator.tasks(seeds):
        assert abs(task.value) <= calculator.INT_MAX
        assert not [
            m.content
            for m in task.demonstration
            if m.role == "tool" and m.content.startswith("error")
        ]
        assert generator.reward.host(task.demonstration[-1].content, task) == pytest.approx(
            generator.reward.max_value
        )


@pytest.mark.parametrize("order", [1, -1])
def test_a_mixed_env_keeps_the_calculator_every_family_needs(tokenizer, order):
    """Countdown(10)'s solutions pass the 48 bytes of Arithmetic's calculator: the merged tool
    still runs them."""
    generators = [Arithmetic(1), Countdown(10)][::order]
    env = task_env(tokenizer, generators, range(2), max_length=640, action_length=ACTION)
    (tool,) = env.tools
    calls = [
        (m.tool_calls[0].arguments["expression"], result.content, task)
        for task in Countdown(10).tasks(range(2))
        for m, result in zip(task.demonstration, task.demonstration[1:])
        if m.tool_calls
    ]
    assert max(len(expression) for expression, _, _ in calls) > 48
    assert all(tool.run_host(expression, task) == content for expression, content, task in calls)
    with pytest.raises(ValueError, match="differently"):
        task_env(
            tokenizer, [MultiHop(1, tool="search"), MultiHop(1, tool="search", top_k=3)], range(1)
        )
