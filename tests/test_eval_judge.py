"""LLM-as-judge with scripted judges: parsing, position bias, verbosity bias, panel agreement."""

import dataclasses
import re
from collections import Counter

import numpy as np
import pytest
import scipy.special
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import cohen_kappa_score

from agentic_jax.agents.policies.base import AssistantMessage, ScriptedPolicy
from agentic_jax.eval import stats
from agentic_jax.eval.judge import (
    PAIRWISE_PROMPT,
    POINTWISE_PROMPT,
    JudgePanel,
    JudgePrompt,
    PairwiseJudge,
    PointwiseJudge,
    length_controlled_win_rate,
    length_matched,
    outcomes,
    position_bias_report,
)


class HiddenQualityJudge:
    """Prefers the answer of higher hidden quality plus ``per_char`` per character of length,
    whatever the order; answers are found in the prompt by their ``<id>`` tags."""

    def __init__(self, answers: dict[str, tuple[str, float]], per_char: float = 0.0):
        self.answers, self.per_char = answers, per_char

    def utility(self, key: str) -> float:
        text, quality = self.answers[key]
        return quality + self.per_char * len(text)

    def respond(self, messages, tools=(), **sampling):
        first, second = map(self.utility, re.findall(r"<(\w+)>", messages[-1].content))
        verdict = "A" if first > second else "B" if second > first else "tie"
        return AssistantMessage(f"Having compared them,\nVerdict: {verdict}")


class LongerJudge:
    """Always prefers the longer answer, and knows nothing else."""

    def respond(self, messages, tools=(), **sampling):
        a, b = re.search(
            r"\[Answer A\]\n(.*)\n\n\[Answer B\]\n(.*)\n\n", messages[-1].content
        ).groups()
        return AssistantMessage("Verdict: A" if len(a) > len(b) else "Verdict: B")


def tagged(answers: dict[str, tuple[str, float]], key: str, length: int, quality: float) -> str:
    text = f"<{key}> " + "x" * max(length - len(key) - 3, 1)
    answers[key] = (text, quality)
    return text


def test_prompt_hash_is_stable_and_changes_with_every_field():
    copy = JudgePrompt(**dataclasses.asdict(POINTWISE_PROMPT))
    assert copy.sha256 == POINTWISE_PROMPT.sha256
    # Pinned: rewording a shipped prompt must bump its version (and this hash) deliberately.
    assert (
        POINTWISE_PROMPT.sha256
        == "0b6ba2c21d05a75796aa594619021bb93df1bbefd7d503a5e64b53dbff50fa17"
    )
    changed = [
        dataclasses.replace(POINTWISE_PROMPT, template=POINTWISE_PROMPT.template + " "),
        dataclasses.replace(POINTWISE_PROMPT, system="Be lenient."),
        dataclasses.replace(POINTWISE_PROMPT, version="2"),
        dataclasses.replace(POINTWISE_PROMPT, name="other"),
        PAIRWISE_PROMPT,
    ]
    assert len({p.sha256 for p in [POINTWISE_PROMPT, *changed]}) == 6
    # A result records the hash of the prompt that produced it.
    judge = PointwiseJudge(ScriptedPolicy(["Score: 5"]), prompt=changed[0], name="j")
    assert judge.score("q", "a").prompt_sha256 == changed[0].sha256 != POINTWISE_PROMPT.sha256


def test_templates_with_bad_or_unknown_fields_are_rejected():
    for template in ["{}", "{0}", "{a.b}", "{a[0]}", "unclosed {"]:
        with pytest.raises(ValueError, match="template"):
            JudgePrompt("p", "1", "sys", template)
    prompt = JudgePrompt("p", "1", "sys", "{question} {answer} {{literal}} {tone}")
    assert prompt.fields == {"question", "answer", "tone"}
    with pytest.raises(ValueError, match=r"missing \['tone'\], unknown \['extra'\]"):
        prompt.render(question="q", answer="a", extra=1)
    with pytest.raises(ValueError, match=r"\['tone'\] unknown to PointwiseJudge"):
        PointwiseJudge(ScriptedPolicy([]), prompt=prompt)
    with pytest.raises(ValueError, match=r"needs template field\(s\) \['answer_b'\]"):
        PairwiseJudge(ScriptedPolicy([]), prompt=JudgePrompt("p", "1", "s", "{question}{answer_a}"))
    with pytest.raises(ValueError, match="needs a name"):
        JudgePrompt("", "1", "s", "{question}")


def test_pointwise_judge_parses_the_last_score_line_and_enforces_the_scale():
    replies = {
        "Accurate and complete.\nScore: 7": (7, None),
        "**Score:** [[9]]": (9, None),
        "Score: 3 at first, but on reflection\nscore = 8": (8, None),
        "An excellent answer!": (None, "no 'Score: N' line"),
        "Score: 11": (None, "outside the scale [1, 10]"),
        "Score: 0": (None, "outside the scale"),
        "Score: -2": (None, "outside the scale"),
        "Score: 7.5": (None, "not a whole number"),
    }
    policy = ScriptedPolicy(list(replies))
    judge = PointwiseJudge(policy, rubric="Is it right?", name="grader")
    for reply, (score, error) in replies.items():
        result = judge.score("What is 2+2?", "4")
        assert (result.score, result.raw, result.judge) == (score, reply, "grader")
        assert (error is None and result.error is None) or error in result.error
        assert result.prompt_sha256 == POINTWISE_PROMPT.sha256
    system, user = policy.calls[0][0]
    assert system.content == POINTWISE_PROMPT.system
    assert "What is 2+2?" in user.content and "Is it right?" in user.content
    assert "from 1 (worst) to 10 (best)" in user.content
    assert policy.calls[0][2] == {"temperature": 0.0}  # greedy unless told otherwise

    five = PointwiseJudge(ScriptedPolicy(["Score: 7", "Score: 5"]), scale=(1, 5), sampling={})
    assert five.score("q", "a").score is None and five.score("q", "a").score == 5
    assert five.policy.calls[0][2] == {}
    for scale in [(5, 1), (3, 3), (1.0, 10)]:
        with pytest.raises(ValueError, match="scale"):
            PointwiseJudge(ScriptedPolicy([]), scale=scale)


def test_pairwise_verdict_parsing():
    cases = {
        "Verdict: A": "A",
        "B is clearer.\n**Verdict:** [[B]]": "B",
        "verdict: TIE": "tie",
        "Verdict: Assistant A": "A",
        "Verdict: A\nOn second thought... Verdict: B": "B",
        "Verdict: a tie": None,  # not the asked-for form
        "Verdict: Both": None,
        "A is better.": None,
    }
    for text, winner in cases.items():
        assert PairwiseJudge.parse(text) == winner, text


def test_a_judge_that_prefers_the_first_answer_is_flagged():
    n = 6
    policy = ScriptedPolicy(["Answer A is better.\nVerdict: A"] * (2 * n + 1))
    judge = PairwiseJudge(policy, name="first-lover", sampling={"temperature": 0.0, "seed": 1})
    verdicts = [judge.compare_both_orders(f"q{i}", f"good {i}", f"bad {i}") for i in range(n)]
    assert all(v.consistent is False and v.winner == "tie" for v in verdicts)
    assert all(v.positions == ("A", "A") for v in verdicts)
    assert {(v.judge, v.prompt_sha256) for v in verdicts} == {
        ("first-lover", PAIRWISE_PROMPT.sha256)
    }
    # The second call showed the answers swapped.
    first, second = policy.calls[0][0][1].content, policy.calls[1][0][1].content
    assert first.index("good 0") < first.index("bad 0") and second.index("bad 0") < second.index(
        "good 0"
    )
    report = position_bias_report(verdicts)
    assert (report.pairs, report.inconsistent, report.inconsistent_rate) == (n, n, 1.0)
    assert (report.judgements, report.first_position_wins) == (2 * n, 2 * n)
    assert report.first_position_win_rate == 1.0
    # One order alone cannot see the bias: it just reports answer A winning.
    assert judge.compare("q", "bad", "good").winner == "A"
    assert all(call[2] == {"temperature": 0.0, "seed": 1} for call in policy.calls)


def test_a_judge_that_prefers_the_better_answer_is_consistent():
    answers: dict[str, tuple[str, float]] = {}
    rng = np.random.default_rng(0)
    items = [
        (
            f"q{i}",
            tagged(answers, f"a{i}", 50, rng.normal()),
            tagged(answers, f"b{i}", 50, rng.normal()),
        )
        for i in range(10)
    ]
    judge = PairwiseJudge(HiddenQualityJudge(answers))
    verdicts = [judge.compare_both_orders(*item) for item in items]
    assert all(v.consistent for v in verdicts)
    truth = ["A" if answers[f"a{i}"][1] > answers[f"b{i}"][1] else "B" for i in range(10)]
    assert [v.winner for v in verdicts] == truth
    assert [v.positions for v in verdicts] == [(w, "B" if w == "A" else "A") for w in truth]
    report = position_bias_report(verdicts)
    assert (report.inconsistent_rate, report.first_position_win_rate) == (0.0, 0.5)
    assert judge.name == "HiddenQualityJudge"


def test_an_unparseable_order_leaves_the_verdict_undecided():
    replies = ["Verdict: tie", "I cannot decide.", "Verdict: tie", "Verdict: tie", "Verdict: B"]
    judge = PairwiseJudge(ScriptedPolicy(replies))
    undecided = judge.compare_both_orders("q", "a", "b")
    assert (undecided.winner, undecided.consistent, undecided.positions) == (
        None,
        None,
        ("tie", None),
    )
    report = position_bias_report([undecided])
    assert (report.pairs, report.judgements, report.ties) == (0, 1, 1)
    assert np.isnan(report.inconsistent_rate) and report.first_position_win_rate == 0.0
    with pytest.raises(ValueError, match="verdict 0 is unparseable"):
        outcomes([undecided])
    tied = judge.compare_both_orders("q", "a", "b")
    assert (tied.winner, tied.consistent, tied.positions) == ("tie", True, ("tie", "tie"))
    lost = judge.compare("q", "a", "b")
    assert outcomes([tied, lost]).tolist() == [0.5, 0.0]
    with pytest.raises(ValueError, match="at least one verdict"):
        position_bias_report([])


def verbose_comparisons(quality_shift: float, seed: int = 0):
    """A model whose answers are longer than the baseline's by ~30 ± 40 characters and whose
    quality is independent of length: at each length pair the quality difference runs through
    8 quantiles of the logistic distribution, shifted by ``quality_shift``.  Judged in both
    orders by a judge that adds 1/8 per character, so P(win | d) = sigmoid(shift + d/8)."""
    rng = np.random.default_rng(seed)
    deltas = scipy.special.logit((np.arange(8) + 0.5) / 8) + quality_shift
    answers: dict[str, tuple[str, float]] = {}
    items, diffs = [], []
    for i, d in enumerate(np.round(rng.normal(30, 40, 60)).astype(int)):
        base = int(rng.integers(120, 300))
        for k, delta in enumerate(deltas):
            model = tagged(answers, f"m{i}x{k}", base + d, delta / 2)
            baseline = tagged(answers, f"b{i}x{k}", base, -delta / 2)
            items.append((f"q{i}", model, baseline))
            diffs.append(len(model) - len(baseline))
    judge = PairwiseJudge(HiddenQualityJudge(answers, per_char=1 / 8))
    verdicts = [judge.compare_both_orders(*item) for item in items]
    assert all(v.consistent for v in verdicts)  # biased by length, not by position
    return outcomes(verdicts), np.array(diffs, np.float64)


def test_length_control_removes_a_judges_verbosity_bias():
    wins, diffs = verbose_comparisons(quality_shift=0.0)
    result = length_controlled_win_rate(wins, diffs)
    assert result.raw == wins.mean() and result.raw > 0.7  # length buys wins
    assert result.length_controlled == pytest.approx(0.5, abs=0.05)  # equal quality
    assert result.slope > 1 and result.n == len(wins)
    # A genuinely better model keeps its advantage: sigmoid(1) ≈ 0.73 at equal length.
    better = length_controlled_win_rate(*verbose_comparisons(quality_shift=1.0))
    assert better.length_controlled == pytest.approx(scipy.special.expit(1.0), abs=0.05)


def test_length_controlled_fit_matches_sklearn_with_ties():
    rng = np.random.default_rng(1)
    diffs = rng.normal(40, 100, 300)
    p = scipy.special.expit(0.3 + diffs / 80)
    wins = np.where(rng.random(300) < 0.2, 0.5, (rng.random(300) < p).astype(float))
    result = length_controlled_win_rate(wins, diffs)
    # The same likelihood for sklearn: a tie is half a win and half a loss.
    x = np.tanh(diffs / diffs.std())
    rows = np.r_[x, x][:, None]
    labels = np.r_[np.ones_like(x), np.zeros_like(x)]
    weights = np.r_[wins, 1 - wins]
    keep = weights > 0
    reference = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000)
    reference.fit(rows[keep], labels[keep], sample_weight=weights[keep])
    assert result.intercept == pytest.approx(reference.intercept_[0], abs=1e-6)
    assert result.slope == pytest.approx(reference.coef_[0, 0], abs=1e-6)
    assert result.length_controlled == pytest.approx(scipy.special.expit(reference.intercept_[0]))
    assert result.raw == pytest.approx(wins.mean())


def test_length_controlled_win_rate_edge_cases_and_errors():
    # Outcomes a pure length judge decides: wins and losses never overlap, no finite fit.
    answers = [("x" * n, "x" * 50) for n in (20, 40, 60, 80, 100, 30)]
    judge = PairwiseJudge(LongerJudge())
    wins = outcomes([judge.compare("q", a, b) for a, b in answers])
    assert wins.tolist() == [0, 0, 1, 1, 1, 0]
    diffs = [len(a) - len(b) for a, b in answers]
    with pytest.raises(ValueError, match="length separates the outcomes"):
        length_controlled_win_rate(wins, diffs)
    constant = length_controlled_win_rate([1, 1, 1], [5, -3, 2])
    assert (constant.raw, constant.length_controlled, constant.slope) == (1.0, 1.0, 0.0)
    unmeasured = length_controlled_win_rate([1, 0, 0.5, 1], [0, 0, 0, 0])
    assert unmeasured.length_controlled == unmeasured.raw == 0.625
    with pytest.raises(ValueError, match="same nonzero value"):
        length_controlled_win_rate([1, 0, 1], [7, 7, 7])
    with pytest.raises(ValueError, match="non-empty"):
        length_controlled_win_rate([], [])
    with pytest.raises(ValueError, match="equally long"):
        length_controlled_win_rate([1, 0], [1, 2, 3])
    with pytest.raises(ValueError, match=r"1 \(win\), 0 \(loss\) or 0.5"):
        length_controlled_win_rate([1, 0.3], [1, 2])
    with pytest.raises(ValueError, match="finite"):
        length_controlled_win_rate([1, 0], [1, np.nan])


def test_length_matched_keeps_pairs_within_the_ratio():
    pairs = [("x" * 100, "x" * 125), ("x" * 100, "x" * 126), ("", ""), ("", "x"), ("ab", "a")]
    assert length_matched(pairs) == [0, 2]
    assert length_matched(pairs, max_ratio=2) == [0, 1, 2, 4]
    words = [("one two", "three four"), ("one", "two three four")]
    assert length_matched(words, max_ratio=1.0, length=lambda t: len(t.split())) == [0]
    with pytest.raises(ValueError, match="max_ratio must be >= 1"):
        length_matched(pairs, max_ratio=0.9)


def test_panel_agreement_equals_the_kappas_computed_directly():
    scripts = ["AABtBAtABB", "ABBtBAAABt", "AAB?BttABB"]  # "?" is an unparseable reply
    replies = {"A": "Verdict: A", "B": "Verdict: B", "t": "Verdict: tie", "?": "No idea."}
    judges = [
        PairwiseJudge(ScriptedPolicy([replies[c] for c in s]), name=f"j{n}")
        for n, s in enumerate(scripts)
    ]
    items = [(f"q{i}", f"a{i}", f"b{i}") for i in range(10)]
    result = JudgePanel(judges).compare(items, both_orders=False)
    assert result.judges == ("j0", "j1", "j2")
    assert result.prompt_sha256s == (PAIRWISE_PROMPT.sha256,) * 3
    assert [[v.winner for v in row[:2]] for row in result.results] == [
        ["A", "A"],
        ["A", "B"],
        ["A", "A"],
    ]
    assert result.consensus == ("A", "A", "B", "tie", "B", "A", "tie", "A", "B", "B")

    kept = [i for i in range(10) if i != 3]  # item 3 has an unparseable reply
    labels = [[{"t": "tie"}.get(s[i], s[i]) for i in kept] for s in scripts]
    assert result.agreement_items == 9
    for (j, k), kappa in result.pairwise_kappa.items():
        assert kappa == stats.cohen_kappa(labels[j], labels[k], labels=["A", "B", "tie"])
        assert kappa == pytest.approx(cohen_kappa_score(labels[j], labels[k]))
    assert sorted(result.pairwise_kappa) == [(0, 1), (0, 2), (1, 2)]
    assert result.mean_cohen_kappa == pytest.approx(np.mean(list(result.pairwise_kappa.values())))
    counts = [[Counter(column)[c] for c in ("A", "B", "tie")] for column in zip(*labels)]
    assert result.fleiss_kappa == pytest.approx(stats.fleiss_kappa(np.array(counts)))


def test_identical_judges_agree_perfectly():
    answers: dict[str, tuple[str, float]] = {}
    qualities = [0.1, 0.9, 0.5, 0.5, 0.2, 0.7]
    items = [
        (f"q{i}", tagged(answers, f"a{i}", 40, q), tagged(answers, f"b{i}", 40, 0.5))
        for i, q in enumerate(qualities)
    ]
    panel = JudgePanel([PairwiseJudge(HiddenQualityJudge(answers), name=n) for n in "xyz"])
    result = panel.compare(items)
    assert result.consensus == ("B", "A", "tie", "tie", "B", "A")
    assert result.mean_cohen_kappa == pytest.approx(1.0) and result.fleiss_kappa == pytest.approx(
        1.0
    )

    scores = ["Score: 3", "Score: 8", "Score: 5", "Score: 10"]
    graders = [PointwiseJudge(ScriptedPolicy(scores), name=n) for n in "xy"]
    graded = JudgePanel(graders).score([(f"q{i}", f"a{i}") for i in range(4)])
    assert graded.consensus == (3.0, 8.0, 5.0, 10.0)
    assert graded.mean_cohen_kappa == pytest.approx(1.0) and graded.fleiss_kappa == pytest.approx(
        1.0
    )


def test_pointwise_panel_uses_weighted_kappa_over_the_scale():
    scripts = [[3, 8, 5, 10, 1], [4, 8, 6, 9, 2], [3, 7, 5, 10, 5]]
    graders = [PointwiseJudge(ScriptedPolicy([f"Score: {s}" for s in row])) for row in scripts]
    result = JudgePanel(graders).score([(f"q{i}", f"a{i}") for i in range(5)])
    assert result.consensus == (3.0, 8.0, 5.0, 10.0, 2.0)
    scale = list(range(1, 11))
    for (j, k), kappa in result.pairwise_kappa.items():
        expected = stats.cohen_kappa(scripts[j], scripts[k], weights="quadratic", labels=scale)
        assert kappa == pytest.approx(expected)
        assert kappa == pytest.approx(
            cohen_kappa_score(scripts[j], scripts[k], weights="quadratic", labels=scale)
        )
    counts = np.array([[Counter(column)[c] for c in scale] for column in zip(*scripts)])
    assert result.fleiss_kappa == pytest.approx(stats.fleiss_kappa(counts))


def test_panel_rejects_bad_configurations():
    pairwise = PairwiseJudge(ScriptedPolicy([]))
    pointwise = PointwiseJudge(ScriptedPolicy([]))
    with pytest.raises(ValueError, match="at least two judges"):
        JudgePanel([pairwise])
    with pytest.raises(TypeError, match="all be PairwiseJudge or all PointwiseJudge"):
        JudgePanel([pairwise, pointwise])
    with pytest.raises(TypeError, match="PairwiseJudges"):
        JudgePanel([pairwise, pairwise]).score([("q", "a")])
    with pytest.raises(ValueError, match="at least one item"):
        JudgePanel([pairwise, pairwise]).compare([])
    with pytest.raises(ValueError, match="item 0 has 2 fields, expected 3"):
        JudgePanel([pairwise, pairwise]).compare([("q", "a")])
    other_scale = PointwiseJudge(ScriptedPolicy([]), scale=(1, 5))
    with pytest.raises(ValueError, match="share one scale"):
        JudgePanel([pointwise, other_scale]).score([("q", "a")])
