"""RL problems from a prompt file: `envs.text.PromptFile` in a `TaskSpec`, scored by a named
verifier, split by a seeded row permutation, and trained on by GRPO."""

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import make_model_dir

from agentic_jax.data.datasets import DatasetError
from agentic_jax.data.tokenizer import IM_END, load_tokenizer
from agentic_jax.envs.text import PromptFile
from agentic_jax.post_training.rl import RLConfig, train_rl
from agentic_jax.post_training.tasks import TaskSpec

QUESTIONS = [(a, b) for a in range(1, 4) for b in range(2, 6)][:10]
ACTION = 32
LENGTH = 192  # the system message with the answer format takes ~100 tokens


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    records = [
        {"prompt": f"What is {a} + {b}?", "answer": str(a + b), "verifier": "exact"}
        for a, b in QUESTIONS
    ]
    return _write(tmp_path_factory.mktemp("rl") / "prompts.jsonl", records)


def _spec(path, **kwargs):
    return TaskSpec(
        generators=(PromptFile(path, heldout_fraction=0.2, **kwargs),),
        num_train=8,
        num_heldout=2,
        max_length=LENGTH,
        action_length=ACTION,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    make_model_dir(path, max_seq_len=LENGTH + ACTION)
    return path


def test_the_seeded_split_holds_out_other_rows_of_the_file(prompt_file):
    spec = _spec(prompt_file)
    train, heldout = ([t.prompt[-1].content for t in spec.tasks(s)] for s in ("train", "heldout"))
    assert sorted(train + heldout) == sorted(f"What is {a} + {b}?" for a, b in QUESTIONS)
    assert [t.prompt[-1].content for t in _spec(prompt_file).tasks("train")] == train
    other = [t.prompt[-1].content for t in _spec(prompt_file, split_seed=1).tasks("heldout")]
    assert other != heldout  # another permutation (fixed seeds: a fixed outcome)
    assert all(t.prompt[0].role == "system" for t in spec.tasks("train"))


def test_reward_is_one_for_the_reference_answer_and_zero_otherwise(prompt_file, model_dir):
    tokenizer = load_tokenizer(model_dir / "tokenizer.json")
    spec = _spec(prompt_file)
    env, tasks = spec.env(tokenizer, "train"), spec.tasks("train")
    step = jax.jit(env.step)

    def reward(row, content):
        ids = tokenizer.encode(content) + [tokenizer.token_id(IM_END)]
        _, state = env.reset_task(row, env.default_params)
        action = jnp.asarray(ids + [0] * (ACTION - len(ids)), jnp.int32)
        return float(step(jax.random.key(0), state, action, env.default_params)[2])

    for row, task in enumerate(tasks[:3]):
        right, wrong = f"<answer>{task.answer}</answer>", f"<answer>{int(task.answer) + 1}</answer>"
        got = [reward(row, right), reward(row, wrong), reward(row, task.answer)]
        assert got == [1.0, 0.0, 0.0]  # the bare answer lacks the tags the verifier reads
        host = spec.generators[0].reward.host
        assert [host(right, task), host(wrong, task)] == [1.0, 0.0]


def test_bad_files_and_settings_name_the_problem(prompt_file, tmp_path):
    with pytest.raises(ValueError, match=r"has 8 train rows, no row 8: set TaskSpec\.num_train"):
        TaskSpec(generators=(PromptFile(prompt_file, heldout_fraction=0.2),), num_train=9).tasks()
    with pytest.raises(ValueError, match="expected one of"):
        PromptFile(prompt_file, verifier="fuzzy")
    mixed = [{"prompt": "Q", "answer": "1", "verifier": v} for v in ("exact", "numeric")]
    with pytest.raises(ValueError, match="several verifiers"):
        PromptFile(_write(tmp_path / "mixed.jsonl", mixed))
    words = [{"prompt": "Q", "answer": "1"}, {"prompt": "R", "answer": "one"}]
    with pytest.raises(DatasetError, match=r"words.jsonl, line 2, field 'answer'.*integer"):
        PromptFile(_write(tmp_path / "words.jsonl", words), verifier="numeric")
    with pytest.raises(ValueError, match="too few"):
        PromptFile(_write(tmp_path / "one.jsonl", words[:1]))


def test_numeric_verifier_gives_partial_credit(tmp_path):
    records = [{"prompt": f"Q{i}", "answer": str(i), "verifier": "numeric"} for i in range(4)]
    generator = PromptFile(_write(tmp_path / "n.jsonl", records), heldout_fraction=0.25)
    task = generator.sample(0)
    value = int(task.answer)
    assert task.value == value
    assert generator.reward.host(f"<answer>{value + 3}</answer>", task) == pytest.approx(0.25)


def test_a_gin_config_names_the_file_and_one_grpo_step_trains_on_it(
    prompt_file, model_dir, tmp_path
):
    gin.clear_config()
    try:
        gin.parse_config(
            [
                "import agentic_jax.post_training.tasks",
                "TaskSpec.generators = [@PromptFile()]",
                f"PromptFile.path = '{prompt_file}'",
                "PromptFile.heldout_fraction = 0.2",
                "PromptFile.system = None",  # the bare question: short rows, a quick step
                "TaskSpec.num_train = 8",
                "TaskSpec.num_heldout = 2",
                "TaskSpec.max_length = 64",
                f"TaskSpec.action_length = {ACTION}",
            ]
        )
        spec = TaskSpec()
    finally:
        gin.clear_config()
    assert spec.tasks("heldout") == _spec(prompt_file, system=None).tasks("heldout")
    last = train_rl(
        str(tmp_path / "grpo"),
        init_from=str(model_dir),
        tasks=spec,
        algorithm=RLConfig(group_size=2, prompts_per_step=2),
        steps=1,
        peak_lr=1e-3,
        progress=False,
    )
    assert last["step"] == 1 and np.isfinite(last["loss"]) and 0.0 <= last["reward_mean"] <= 1.0
