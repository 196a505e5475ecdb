"""Stability monitoring for RL (agentic_jax.post_training.monitors): the per-step collapse
signals against hand-computed values, and each alarm on a constructed run."""

import dataclasses
import itertools
import json
import math
import pickle

import gin
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.post_training.monitors import (
    ALARM_THRESHOLD,
    ALARMS,
    Alarm,
    MonitorConfig,
    RLStopped,
    StabilityMonitor,
    step_diagnostics,
)


def diagnostics(rewards, lengths, group_size, answers, prompts, responses, **kw):
    return step_diagnostics(
        rewards=np.asarray(rewards, np.float32),
        lengths=np.asarray(lengths, np.int32),
        group_size=group_size,
        answers=list(answers),
        prompt_ids=[np.asarray(p, np.int32) for p in prompts],
        response_ids=[np.asarray(r, np.int32) for r in responses],
        **kw,
    )


def grouped_prompts(num_prompts, group_size):
    return [[7, 100 + p] for p in range(num_prompts) for _ in range(group_size)]


# ----------------------------------------------------------------------------- step_diagnostics
def test_hand_computed_batch():
    # two groups of two; responses {1,2,3},{1,2,4} (J = 2/4) and {5,6},{5,6} (J = 1)
    d = diagnostics(
        rewards=[1, 0, 1, 1],
        lengths=[3, 1, 2, 2],
        group_size=2,
        answers=["4", "5", "7", "7"],
        prompts=grouped_prompts(2, 2),
        responses=[[1, 2, 3, 3], [4, 1, 2], [5, 6], [6, 5, 5]],
        importance_weights=np.array([1.0, 2.0, 0.0, 1.0]),
    )
    # r − r̄ = (.25, −.75, .25, .25), L − L̄ = (1, −1, 0, 0): cov 1, Σ 0.75 and 2
    assert d["reward_length_corr"] == pytest.approx(1 / math.sqrt(1.5))
    assert d["distinct_answers"] == pytest.approx((2 / 2 + 1 / 2) / 2)
    assert d["reward_std_within_group"] == pytest.approx((0.5 + 0.0) / 2)
    assert d["pairwise_overlap"] == pytest.approx((0.5 + 1.0) / 2)
    # leave-one-out scores: episodes 0, 1 score 0.5 at their prompt and 0 at the other; 2, 3
    # score 1 and 0: log q = −log(1 + e^{−Δ/τ})
    tau = 0.05
    log_q = [-math.log1p(math.exp(-delta / tau)) for delta in (0.5, 0.5, 1.0, 1.0)]
    assert d["prompt_response_mi"] == pytest.approx((math.log(2) + np.mean(log_q)) / math.log(2))
    # nonzero weights (1, 2, 1): 4² / (3 · 6)
    assert d["is_ess"] == pytest.approx(16 / 18)
    assert all(type(v) is float for v in d.values())


def test_mi_temperature_changes_the_critic():
    kw = dict(
        rewards=[0] * 4,
        lengths=[1] * 4,
        group_size=2,
        answers="abcd",
        prompts=grouped_prompts(2, 2),
        responses=[[1, 2, 3], [1, 2, 4], [1, 5, 6], [1, 5, 7]],
    )
    # own prompt: J = 2/4; other prompt: J = 1/5 → Δ = 0.3
    for tau in (0.05, 0.2, 1.0):
        d = diagnostics(**kw, mi_temperature=tau)
        expected = (math.log(2) - math.log1p(math.exp(-0.3 / tau))) / math.log(2)
        assert d["prompt_response_mi"] == pytest.approx(max(0.0, expected))
    with pytest.raises(ValueError, match="mi_temperature"):
        diagnostics(**kw, mi_temperature=0.0)


def test_identical_responses_have_no_mutual_information():
    g, p = 4, 3
    d = diagnostics(
        rewards=np.arange(g * p) % 2,
        lengths=np.arange(g * p) + 1,
        group_size=g,
        answers=["same"] * (g * p),
        prompts=grouped_prompts(p, g),
        responses=[[3, 1, 4, 1, 5]] * (g * p),
    )
    assert d["prompt_response_mi"] == pytest.approx(0.0, abs=1e-9)
    assert d["distinct_answers"] == pytest.approx(1 / g)
    assert d["pairwise_overlap"] == pytest.approx(1.0)


@pytest.mark.parametrize("num_prompts", [2, 8])
def test_fully_prompt_dependent_responses_have_high_mutual_information(num_prompts):
    g = 4
    # each prompt's responses share tokens only with each other (and vary within the group)
    responses = [
        [1000 * p + 1, 1000 * p + 2, 1000 * p + 3 + i] for p in range(num_prompts) for i in range(g)
    ]
    d = diagnostics(
        rewards=[0] * len(responses),
        lengths=[3] * len(responses),
        group_size=g,
        answers=[str(i) for i in range(len(responses))],
        prompts=grouped_prompts(num_prompts, g),
        responses=responses,
    )
    assert d["prompt_response_mi"] > 0.95
    assert d["pairwise_overlap"] == pytest.approx(2 / 4)
    assert d["distinct_answers"] == 1.0


def test_partly_prompt_dependent_responses_sit_in_between():
    rng = np.random.default_rng(0)
    g, p = 8, 8
    template = list(range(30))

    def mi(specific):
        responses = [
            template
            + [5000 + 10 * q + s for s in rng.choice(10, specific)]
            + list(rng.integers(100, 2000, 20))
            for q in range(p)
            for _ in range(g)
        ]
        return diagnostics([0] * 64, [1] * 64, g, "a" * 64, grouped_prompts(p, g), responses)[
            "prompt_response_mi"
        ]

    collapsed, weak, strong = mi(0), mi(2), mi(8)
    assert collapsed < 0.02 < weak < strong < 1.0


def test_one_group():
    g = 4
    d = diagnostics(
        rewards=[1, 0, 0, 1],
        lengths=[5, 2, 2, 5],
        group_size=g,
        answers=["x", "y", "x", "x"],
        prompts=grouped_prompts(1, g),
        responses=[[1, 2], [3, 4], [1, 2], [1, 2]],
    )
    assert d["prompt_response_mi"] == 0.0  # a single prompt carries no information
    assert d["reward_length_corr"] == pytest.approx(1.0)
    assert d["distinct_answers"] == pytest.approx(2 / 4)
    assert d["reward_std_within_group"] == pytest.approx(0.5)
    assert d["pairwise_overlap"] == pytest.approx(3 / 6)  # 3 identical pairs of 6


def test_groups_with_the_same_prompt_are_one_prompt():
    # two groups, one prompt, different responses per group: I(P; R) = 0
    d = diagnostics(
        rewards=[0] * 4,
        lengths=[1] * 4,
        group_size=2,
        answers="abcd",
        prompts=[[1, 2]] * 4,
        responses=[[1], [1], [2], [2]],
    )
    assert d["prompt_response_mi"] == 0.0


def test_constant_rewards_or_lengths():
    base = dict(
        group_size=2,
        answers="abab",
        prompts=grouped_prompts(2, 2),
        responses=[[1], [2], [3], [4]],
    )
    d = diagnostics(rewards=[1, 1, 1, 1], lengths=[1, 2, 3, 4], **base)
    assert d["reward_length_corr"] == 0.0
    assert d["reward_std_within_group"] == 0.0
    assert diagnostics(rewards=[0, 1, 0, 1], lengths=[3] * 4, **base)["reward_length_corr"] == 0.0
    assert "is_ess" not in d


def test_group_size_one_leaves_out_the_pair_signals():
    d = diagnostics(
        rewards=[0, 1, 1],
        lengths=[1, 2, 4],
        group_size=1,
        answers="abc",
        prompts=grouped_prompts(3, 1),
        responses=[[1], [2], [3]],
    )
    assert "pairwise_overlap" not in d and "prompt_response_mi" not in d
    assert d["distinct_answers"] == 1.0
    assert d["reward_std_within_group"] == 0.0


def test_empty_responses_overlap_fully():
    d = diagnostics([0, 1], [0, 0], 2, "ab", grouped_prompts(1, 2), [[], []])
    assert d["pairwise_overlap"] == 1.0


def test_token_level_weights_ignore_padding():
    w = np.array([[1.0, 1.0, 0.0], [2.0, 0.0, 0.0]])  # nonzero: 1, 1, 2
    d = diagnostics(
        [0, 1], [2, 1], 2, "ab", grouped_prompts(1, 2), [[1], [2]], importance_weights=w
    )
    assert d["is_ess"] == pytest.approx(16 / (3 * 6))
    d = diagnostics(
        [0, 1],
        [2, 1],
        2,
        "ab",
        grouped_prompts(1, 2),
        [[1], [2]],
        importance_weights=np.zeros((2, 3)),
    )
    assert "is_ess" not in d


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(group_size=3), "whole groups"),
        (dict(group_size=0), "group_size"),
        (dict(answers="abc"), "answers"),
        (dict(responses=[[1]] * 3), "response_ids"),
        (dict(importance_weights=np.array([1.0, -1.0, 1.0, 1.0])), "nonnegative"),
        (dict(importance_weights=np.array([1.0, np.inf, 1.0, 1.0])), "finite"),
        (dict(importance_weights=np.ones(3)), "rows"),
    ],
)
def test_invalid_batches(change, match):
    kw = dict(
        rewards=[0, 1, 0, 1],
        lengths=[1, 2, 3, 4],
        group_size=2,
        answers="abcd",
        prompts=grouped_prompts(2, 2),
        responses=[[1], [2], [3], [4]],
    )
    with pytest.raises(ValueError, match=match):
        diagnostics(**{**kw, **change})


@given(
    st.integers(2, 24).flatmap(
        lambda n: st.tuples(
            hnp.arrays(np.float64, n, elements=st.floats(-10, 10)),
            hnp.arrays(np.int64, n, elements=st.integers(0, 500)),
        )
    )
)
def test_reward_length_corr_is_numpys_corrcoef(arrays):
    rewards, lengths = arrays
    assume(np.std(rewards) > 1e-3 and np.std(lengths) > 0)
    n = rewards.size
    d = step_diagnostics(
        rewards=rewards,
        lengths=lengths,
        group_size=1,
        answers=["a"] * n,
        prompt_ids=[np.array([i]) for i in range(n)],
        response_ids=[np.array([i]) for i in range(n)],
    )
    assert d["reward_length_corr"] == pytest.approx(np.corrcoef(rewards, lengths)[0, 1], abs=1e-9)
    assert -1 - 1e-9 <= d["reward_length_corr"] <= 1 + 1e-9


def _diagnostics_of_weights(weights):
    """`step_diagnostics` of ``len(weights)`` one-episode groups with these importance weights."""
    n = weights.shape[0]
    return step_diagnostics(
        rewards=np.zeros(n),
        lengths=np.ones(n),
        group_size=1,
        answers=["a"] * n,
        prompt_ids=[np.array([i]) for i in range(n)],
        response_ids=[np.array([i]) for i in range(n)],
        importance_weights=weights,
    )


@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=6),
        elements=st.floats(0, 1e3),
    )
)
def test_ess_lies_in_unit_interval(weights):
    assume(np.any(weights > 0))
    d = _diagnostics_of_weights(weights)
    nonzero = np.count_nonzero(weights)
    assert 1 / nonzero - 1e-12 <= d["is_ess"] <= 1 + 1e-12


@given(st.floats(1e-3, 1e3), st.integers(1, 6), st.integers(1, 5))
def test_ess_of_equal_weights_is_one(value, n, t):
    d = _diagnostics_of_weights(np.full((n, t), value))
    assert d["is_ess"] == pytest.approx(1.0)


@given(
    st.integers(1, 3).flatmap(
        lambda p: st.tuples(
            st.just(p),
            st.integers(2, 3).flatmap(
                lambda g: st.tuples(
                    st.just(g),
                    st.lists(
                        st.lists(st.integers(0, 12), max_size=8), min_size=p * g, max_size=p * g
                    ),
                    st.lists(st.sampled_from("xyz"), min_size=p * g, max_size=p * g),
                )
            ),
        )
    )
)
def test_overlap_and_diversity_match_a_direct_computation(case):
    p, (g, responses, answers) = case
    d = diagnostics([0] * (p * g), [1] * (p * g), g, answers, grouped_prompts(p, g), responses)

    def jaccard(a, b):
        a, b = set(a), set(b)
        return 1.0 if not a | b else len(a & b) / len(a | b)

    groups = [range(k * g, (k + 1) * g) for k in range(p)]
    overlap = np.mean(
        [
            np.mean(
                [jaccard(responses[i], responses[j]) for i, j in itertools.combinations(grp, 2)]
            )
            for grp in groups
        ]
    )
    assert d["pairwise_overlap"] == pytest.approx(overlap)
    assert d["distinct_answers"] == pytest.approx(
        np.mean([len({answers[i] for i in grp}) / g for grp in groups])
    )
    assert 1 / g - 1e-12 <= d["distinct_answers"] <= 1.0
    assert 0.0 <= d["prompt_response_mi"] <= 1.0


# ----------------------------------------------------------------------------- the monitor
# every alarm on, with a short KL streak, so one healthy run exercises them all
ALL_ON = MonitorConfig(kl_growth_steps=5, min_distinct_answers=0.2)
STEPS = 30


def healthy_run():
    """A run that is learning: entropy drifting down gently, reward rising, everything in bounds,
    with some step-to-step noise."""
    rng = np.random.default_rng(0)
    records = []
    for step in range(STEPS):
        records.append(
            {
                "step": step,
                "loss": 0.1,
                "reward_mean": 0.2 + 0.02 * step + 0.02 * rng.standard_normal(),
                "reward_std": 0.4,
                "entropy": 1.0 - 0.01 * step + 0.02 * rng.standard_normal(),
                "approx_kl": 0.001,
                "kl": 0.1 + 0.02 * (step % 2) + 0.001 * step,
                "clip_frac_low": 0.02,
                "clip_frac_high": 0.01,
                "response_length": 40.0,
                "tool_calls": 1.5,
                "zero_variance_groups": 0.3 + 0.1 * rng.random(),
                "grad_norm": 0.5,
                "reward_length_corr": 0.1 * rng.standard_normal(),
                "distinct_answers": 0.6,
                "pairwise_overlap": 0.4,
                "reward_std_within_group": 0.4 + 0.05 * rng.standard_normal(),
                "prompt_response_mi": 0.3 + 0.05 * rng.random(),
                "is_ess": 0.9,
                "mismatch_mean": 0.01,
            }
        )
    records[0]["entropy"] = 1.0
    return records


def observe_all(monitor, records):
    return [alarm for record in records for alarm in monitor.observe(record)]


AT = 15  # the step the constructed failures start


def set_from(key, value, start=AT):
    def change(records):
        for r in records[start:]:
            r[key] = value

    return change


def kl_streak(reward_slope):
    def change(records):
        for i, r in enumerate(records[AT - 5 :]):  # kl rises from step AT − 4 on
            r["kl"] = 0.05 + 0.01 * i
            r["reward_mean"] = 0.5 + reward_slope * i

    return change


def both(*changes):
    def change(records):
        for c in changes:
            c(records)

    return change


# name: (change to the healthy run, expected value, expected threshold, key named in message)
CASES = {
    "entropy_collapse": (set_from("entropy", 0.05), 0.05, 0.1 * 1.0, "entropy"),
    "kl_bound": (set_from("kl", 2.0), 2.0, 1.0, "kl"),
    "kl_growth": (kl_streak(0.0), 5.0, 5.0, "kl"),
    "reward_length_corr": (set_from("reward_length_corr", 0.9), 0.9, 0.6, "reward_length_corr"),
    "variance_cliff": (
        set_from("reward_std_within_group", 0.05),
        0.05,
        None,  # 0.25 × the running max, checked below
        "reward_std_within_group",
    ),
    "distinct_answers": (set_from("distinct_answers", 0.125), 0.125, 0.2, "distinct_answers"),
    "prompt_response_mi": (
        set_from("prompt_response_mi", 0.0),
        0.0,
        0.02,
        "prompt_response_mi",
    ),
    "is_ess": (set_from("is_ess", 0.2), 0.2, 0.5, "is_ess"),
    "zero_variance_groups": (
        set_from("zero_variance_groups", 0.95),
        0.95,
        0.9,
        "zero_variance_groups",
    ),
    "clip_fraction": (
        both(set_from("clip_frac_low", 0.2), set_from("clip_frac_high", 0.15)),
        0.35,
        0.3,
        "clip_frac",
    ),
    "mismatch": (set_from("mismatch_mean", 0.2), 0.2, 0.05, "mismatch_mean"),
}


def failing_run(name):
    records = healthy_run()
    CASES[name][0](records)
    return records


def test_every_alarm_has_a_case():
    assert set(CASES) == set(ALARMS)


@pytest.mark.parametrize("config", [ALL_ON, MonitorConfig()], ids=["all_on", "defaults"])
def test_healthy_run_raises_nothing(config):
    assert observe_all(StabilityMonitor(config), healthy_run()) == []


@pytest.mark.parametrize("name", ALARMS)
def test_alarm_fires_at_the_right_step(name):
    records = failing_run(name)
    alarms = observe_all(StabilityMonitor(ALL_ON), records)
    assert {a.name for a in alarms} == {name}
    first = alarms[0]
    assert first.step == AT
    _, value, threshold, key = CASES[name]
    assert first.value == pytest.approx(value)
    if name == "variance_cliff":
        running_max = max(r["reward_std_within_group"] for r in records[:AT])
        threshold = 0.25 * running_max
    assert first.threshold == pytest.approx(threshold)
    assert key in first.message
    assert isinstance(first, Alarm)
    # level-triggered: it keeps firing while the condition holds (the run stays broken)
    assert [a.step for a in alarms] == list(range(AT, STEPS))


@pytest.mark.parametrize("name", ALARMS)
def test_disabled_threshold_raises_nothing(name):
    config = dataclasses.replace(ALL_ON, **{ALARM_THRESHOLD[name]: None})
    assert observe_all(StabilityMonitor(config), failing_run(name)) == []


def test_everything_disabled_raises_nothing():
    monitor = StabilityMonitor(MonitorConfig(**dict.fromkeys(ALARM_THRESHOLD.values())))
    assert observe_all(monitor, [r for n in ALARMS for r in failing_run(n)]) == []


def test_kl_growth_is_silent_while_reward_rises_and_fires_while_it_falls():
    rising, falling = healthy_run(), healthy_run()
    kl_streak(0.05)(rising)
    kl_streak(-0.05)(falling)
    assert observe_all(StabilityMonitor(ALL_ON), rising) == []
    alarms = observe_all(StabilityMonitor(ALL_ON), falling)
    assert {a.name for a in alarms} == {"kl_growth"} and alarms[0].step == AT
    assert "reward_mean changed by -0.25" in alarms[0].message


def test_kl_growth_streak_breaks_when_kl_falls():
    records = failing_run("kl_growth")
    records[AT - 1]["kl"] = 0.0  # the streak restarts at AT − 1: 5 rises by AT + 4
    alarms = observe_all(StabilityMonitor(ALL_ON), records)
    assert alarms[0].name == "kl_growth" and alarms[0].step == AT + 4


def test_variance_cliff_waits_for_warmup():
    records = healthy_run()
    config = dataclasses.replace(ALL_ON, warmup_steps=5)
    records[2]["reward_std_within_group"] = 0.01  # a cliff during warmup: silent
    records[5]["reward_std_within_group"] = 0.01  # the 6th observation: after warmup
    alarms = observe_all(StabilityMonitor(config), records)
    assert [(a.name, a.step) for a in alarms] == [("variance_cliff", 5)]
    assert "Echo Trap" in alarms[0].message


def test_entropy_alarm_is_relative_to_the_first_step():
    monitor = StabilityMonitor(ALL_ON)
    assert monitor.observe({"step": 0, "entropy": 2.0}) == []
    assert monitor.observe({"step": 1, "entropy": 0.21}) == []
    (alarm,) = monitor.observe({"step": 2, "entropy": 0.19})
    assert alarm.name == "entropy_collapse" and alarm.threshold == pytest.approx(0.2)
    assert "first-step value 2" in alarm.message


def test_missing_keys_skip_their_alarms():
    monitor = StabilityMonitor(ALL_ON)
    for step in range(20):
        assert monitor.observe({"step": step}) == []
    assert monitor.observe({"kl": 5.0}) != []  # the step defaults to the records seen
    assert monitor.observe({"kl": 5.0})[0].step == 21


def test_nan_is_out_of_bounds():
    monitor = StabilityMonitor(ALL_ON)
    (alarm,) = monitor.observe({"step": 0, "kl": float("nan")})
    assert alarm.name == "kl_bound" and math.isnan(alarm.value)
    (alarm,) = monitor.observe({"step": 1, "is_ess": float("nan")})
    assert alarm.name == "is_ess"
    assert json.loads(json.dumps(monitor.state(), allow_nan=False)) == monitor.state()


@pytest.mark.parametrize("name", ALARMS)
@pytest.mark.parametrize("split", [1, 6, AT - 3, AT, AT + 1, STEPS - 1])
def test_state_round_trip_reproduces_future_alarms(name, split):
    records = failing_run(name)
    config = dataclasses.replace(ALL_ON, warmup_steps=8)
    uninterrupted = StabilityMonitor(config)
    observe_all(uninterrupted, records[:split])
    state = json.loads(json.dumps(uninterrupted.state(), allow_nan=False))

    first = StabilityMonitor(config)
    observe_all(first, records[:split])
    resumed = StabilityMonitor.from_state(config, state)
    assert resumed.state() == first.state()
    assert observe_all(resumed, records[split:]) == observe_all(uninterrupted, records[split:])


def test_should_stop_picks_only_stop_on_alarms():
    records = healthy_run()
    set_from("kl", 2.0)(records)
    set_from("mismatch_mean", 0.3)(records)
    set_from("entropy", 0.0)(records)
    config = dataclasses.replace(ALL_ON, stop_on=("mismatch", "kl_bound"))
    monitor = StabilityMonitor(config)
    for record in records[:AT]:
        assert monitor.should_stop(monitor.observe(record)) is None
    alarms = monitor.observe(records[AT])
    assert [a.name for a in alarms] == ["entropy_collapse", "kl_bound", "mismatch"]
    assert monitor.should_stop(alarms).name == "kl_bound"  # the first of the step's alarms
    assert StabilityMonitor(ALL_ON).should_stop(alarms) is None  # stop_on = ()
    assert monitor.should_stop([]) is None


def test_rl_stopped_says_which_alarm_and_why():
    alarm = Alarm("kl_bound", 12, 2.5, 1.0, "kl = 2.5 is above its bound 1: drifted")
    err = RLStopped(alarm)
    assert err.alarm is alarm
    assert "kl_bound" in str(err) and "step 12" in str(err) and "drifted" in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert copy.alarm == alarm and str(copy) == str(err)
    with pytest.raises(RLStopped, match="kl_bound"):
        raise err


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(stop_on=("no_such_alarm",)), "no_such_alarm"),
        (dict(stop_on=("kl_bound",), kl_bound=None), "disabled"),
        (dict(entropy_collapse_fraction=1.5), "fraction"),
        (dict(variance_cliff_fraction=0.0), "fraction"),
        (dict(kl_growth_steps=0), "kl_growth_steps"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(flat_reward_tolerance=-0.1), "flat_reward_tolerance"),
    ],
)
def test_invalid_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MonitorConfig(**kwargs)


def test_config_is_gin_configurable():
    gin.parse_config(
        [
            "MonitorConfig.kl_bound = 0.5",
            "MonitorConfig.min_is_ess = None",
            "MonitorConfig.stop_on = ['kl_bound', 'mismatch']",
        ]
    )
    try:
        config = MonitorConfig()
    finally:
        gin.clear_config()
    assert config.kl_bound == 0.5 and config.min_is_ess is None
    assert config.stop_on == ("kl_bound", "mismatch")
    hash(config)  # frozen, hashable after the list became a tuple


def test_diagnostics_feed_the_monitor():
    """End to end: a batch collapsing onto one template trips the MI and diversity alarms."""
    g, p = 8, 4  # all answers alike: distinct_answers = 1/8 < 0.2
    prompts = grouped_prompts(p, g)
    healthy = diagnostics(
        rewards=[1, 0] * (p * g // 2),
        lengths=[5, 6] * (p * g // 2),
        group_size=g,
        answers=[f"{q}{i % 2}" for q in range(p) for i in range(g)],
        prompts=prompts,
        responses=[[1, 2, 100 + q, 200 + i] for q in range(p) for i in range(g)],
    )
    collapsed = diagnostics(
        rewards=[0] * (p * g),
        lengths=[5] * (p * g),
        group_size=g,
        answers=["0"] * (p * g),
        prompts=prompts,
        responses=[[1, 2, 3, 200 + i] for q in range(p) for i in range(g)],
    )
    monitor = StabilityMonitor(ALL_ON)
    assert monitor.observe({"step": 0, **healthy}) == []
    names = [a.name for a in monitor.observe({"step": 1, **collapsed})]
    assert names == ["distinct_answers", "prompt_response_mi"]
