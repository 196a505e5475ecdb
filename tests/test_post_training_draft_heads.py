"""Draft-head training: the head loss falls, checkpoints resume, the saved head decodes."""

import json

import jax
import numpy as np
import pytest
from tiny_models import CORPUS, make_model_dir

from agentic_jax.inference import SamplingParams, generate
from agentic_jax.inference.decoding.draft_heads import load_head
from agentic_jax.inference.decoding.draft_tree import TreeShape
from agentic_jax.inference.decoding.tree_speculative import tree_speculative_generate
from agentic_jax.post_training.draft_heads import train_draft_heads


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_training_lowers_the_head_loss_resumes_and_saves_a_usable_head(tmp_path, kind):
    config, params, _ = make_model_dir(tmp_path / "target", max_seq_len=64)
    run = dict(
        init_from=str(tmp_path / "target"),
        kind=kind,
        num_heads=2,
        files=[CORPUS],
        batch_size=4,
        seq_len=32,
        peak_lr=5e-2,
        warmup_steps=0,
        checkpoint_every=6,
        progress=False,
    )
    workdir = str(tmp_path / kind)
    train_draft_heads(workdir, steps=6, **run)
    last = train_draft_heads(workdir, steps=12, **run)  # resumes from step 6
    lines = (tmp_path / kind / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == list(range(1, 13)) and last["step"] == 12
    losses = [r["loss"] for r in records]
    assert np.mean(losses[-3:]) < 0.98 * np.mean(losses[:3]), losses
    head = load_head(f"{workdir}/head", params, config)
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    prompts = [[5, 9, 30, 7], [40, 41]]
    result = tree_speculative_generate(
        params,
        config,
        prompts,
        head=head,
        sampling=greedy,
        key=jax.random.key(0),
        shape=TreeShape(depth=2, branching=2, budget=4),
    )
    want = generate(params, config, prompts, sampling=greedy, key=jax.random.key(0))
    np.testing.assert_array_equal(result.generation.tokens, want.tokens)
