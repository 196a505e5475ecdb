"""KTO from a file of unpaired, labelled completions through `train_preference`."""

import json

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import make_model_dir

from agentic_jax.data.datasets import read_unpaired
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.pairs import evaluate_loss, unpaired_rows
from agentic_jax.post_training.preference import (
    UnpairedObjective,
    completion_logps,
    pair_loss,
    train_preference,
)
from agentic_jax.post_training.tasks import TaskSpec

SPEC = TaskSpec(num_train=2, num_heldout=1, max_length=64, action_length=16)
WEIGHTS = {"desirable_weight": 1.0, "undesirable_weight": 2.0}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def kto_by_hand(logps, ref, kl, ref_kl, desirable, beta, desirable_weight, undesirable_weight):
    """KTO's per-completion losses in numpy (Ethayarajh et al. 2024, eq. 8)."""
    z0 = max(0.0, float(np.mean(kl - ref_kl)))
    rho = logps - ref
    return np.where(
        desirable,
        desirable_weight * (1.0 - _sigmoid(beta * (rho - z0))),
        undesirable_weight * (1.0 - _sigmoid(beta * (z0 - rho))),
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    make_model_dir(path, max_seq_len=SPEC.max_length)
    return path


@pytest.fixture(scope="module")
def kto_file(tmp_path_factory):
    """Six questions, each with a right (desirable) or a wrong (undesirable) answer."""
    records = [
        {"prompt": f"What is {a} + {b}?", "completion": str(a + b + (not good)), "label": good}
        for a, b, good in [(2, 2, True), (3, 1, False), (1, 5, True), (4, 4, False), (2, 6, True)]
        + [(3, 3, False)]
    ]
    path = tmp_path_factory.mktemp("kto") / "kto.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.tuples(*[st.floats(-20, 0)] * 4, st.booleans()), min_size=1, max_size=6),
    beta=st.floats(0.01, 2.0),
    weights=st.tuples(st.floats(0.1, 3.0), st.floats(0.1, 3.0)),
)
def test_unpaired_objective_is_kto_with_the_mismatched_rows_as_reference_point(
    values, beta, weights
):
    logps, kl, ref, ref_kl, desirable = (np.asarray(v, np.float32) for v in zip(*values))
    options = {"desirable_weight": weights[0], "undesirable_weight": weights[1]}
    objective = UnpairedObjective("kto", beta, options=tuple(options.items()))
    losses, stats = objective(logps, kl, ref, ref_kl, None, None, desirable)
    expected = kto_by_hand(logps, ref, kl, ref_kl, desirable > 0, beta, *weights)
    np.testing.assert_allclose(losses, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats["kl"], max(0.0, np.mean(kl - ref_kl)), atol=1e-4)


def test_mismatched_rows_continue_each_prompt_with_the_previous_completion(model_dir, kto_file):
    _, _, tokenizer = load_checkpoint(str(model_dir))
    records = read_unpaired(kto_file)
    rows = unpaired_rows(records, tokenizer, SPEC.max_length)
    np.testing.assert_array_equal(rows["desirable"], [r.desirable for r in records])
    for i, record in enumerate(records):
        for key, completion in (("completion", record), ("mismatched", records[i - 1])):
            trained = rows[key][i][rows[f"{key}_mask"][i] == 1].tolist()
            assert tokenizer.decode(trained).startswith(completion.completion[0].content)
        assert (rows["completion"][i, :3] == rows["mismatched"][i, :3]).all()  # the same prompt
    with pytest.raises(ValueError, match=">= 2 records"):
        unpaired_rows(records[:1], tokenizer, SPEC.max_length)


def test_bad_kto_settings_fail_before_any_work(model_dir, kto_file, tmp_path):
    common = {"init_from": str(model_dir), "tasks": SPEC, "steps": 1, "progress": False}
    with pytest.raises(ValueError, match="set loss_type to one of"):
        train_preference(str(tmp_path / "a"), unpaired_file=kto_file, **common)
    with pytest.raises(ValueError, match="set unpaired_file"):
        train_preference(str(tmp_path / "b"), loss_type="kto", **common)
    with pytest.raises(ValueError, match="no label_smoothing"):
        train_preference(
            str(tmp_path / "c"),
            loss_type="kto",
            label_smoothing=0.1,
            unpaired_file=kto_file,
            **common,
        )
    with pytest.raises(ValueError, match="set heldout_unpaired_file"):
        train_preference(
            str(tmp_path / "d"), loss_type="kto", unpaired_file=kto_file, eval_every=1, **common
        )


def _kto(workdir, model_dir, kto_file, steps):
    return train_preference(
        str(workdir),
        init_from=str(model_dir),
        tasks=SPEC,
        unpaired_file=kto_file,
        heldout_unpaired_file=kto_file,
        loss_type="kto",
        beta=0.5,
        loss_options=WEIGHTS,
        prompts_per_step=6,
        steps=steps,
        peak_lr=1e-2,
        eval_every=steps,
        progress=False,
    )


def test_first_kto_step_is_the_closed_form_at_policy_equal_reference(model_dir, kto_file, tmp_path):
    first = _kto(tmp_path / "kto", model_dir, kto_file, steps=1)
    # ρ = 0 and z₀ = 0: each loss is its weight times 1 − σ(0); 3 desirable, 3 undesirable rows
    assert np.isclose(first["loss"], (3 * 1.0 + 3 * 2.0) * 0.5 / 6, atol=1e-5)
    assert first["kl"] == 0.0 and first["rewards/margins"] == 0.0


def test_kto_steps_raise_desirable_over_undesirable_and_match_the_loss_by_hand(
    model_dir, kto_file, tmp_path
):
    last = _kto(tmp_path / "kto", model_dir, kto_file, steps=6)
    config, reference, tokenizer = load_checkpoint(str(model_dir))
    _, policy, _ = load_checkpoint(str(tmp_path / "kto"))
    batch = unpaired_rows(read_unpaired(kto_file), tokenizer, SPEC.max_length)
    rows = UnpairedObjective.rows
    logps = jax.jit(lambda p: completion_logps(p, config, batch, rows)[:2])
    (pol, pol_kl), (ref, ref_kl) = (np.asarray(logps(p)) for p in (policy, reference))
    desirable = batch["desirable"] > 0
    gain = pol - ref
    assert gain[desirable].mean() > gain[~desirable].mean() + 0.1
    # the trainer's loss on the trained policy (ρ ≠ 0 now) is KTO's formula computed by hand
    expected = kto_by_hand(pol, ref, pol_kl, ref_kl, desirable, 0.5, *WEIGHTS.values()).mean()
    objective = UnpairedObjective("kto", 0.5, options=tuple(WEIGHTS.items()))
    batch = {**batch, "ref_completion": ref, "ref_mismatched": ref_kl}
    loss, _, _ = evaluate_loss(jax.jit(pair_loss(config, objective)), policy, batch, len(ref))
    assert np.isclose(loss, expected, rtol=1e-4) and np.isclose(
        last["eval_loss"], expected, rtol=1e-3
    )
