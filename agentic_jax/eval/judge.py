"""LLM-as-judge: pointwise rubric scores and pairwise verdicts, with their known biases measured.

A strong model grading answers agrees with human preferences about as well as humans agree with
each other (Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena",
arXiv:2306.05685), but it is a biased instrument: it favours the answer shown first (position
bias; Wang et al. 2023, "Large Language Models are not Fair Evaluators", arXiv:2305.17926) and
the longer answer (verbosity bias; Dubois et al. 2024, "Length-Controlled AlpacaEval",
arXiv:2404.04475).  This module makes those biases visible and controls for them:

* :class:`PairwiseJudge.compare_both_orders` judges a pair in both orders and declares a win
  only when the orders agree; :func:`position_bias_report` counts how often they did not.
* :func:`length_controlled_win_rate` regresses outcomes on the length difference and reports
  the win rate predicted at equal length; :func:`length_matched` selects comparisons of answers
  of similar length.
* :class:`JudgePanel` runs several judges and reports their agreement (Cohen's and Fleiss'
  kappa), since one judge's verdicts are only as good as their agreement with another's.

Every result names its judge and the sha256 of the :class:`JudgePrompt` that produced it, so a
score is never separated from the exact instructions it was given.  A judge is any object with
the agent policy's ``respond(messages, tools=(), **sampling)`` method returning a turn with a
``.text`` (a local model, an HTTP endpoint, or a scripted policy in tests).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
import statistics
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import numpy as np
import scipy.optimize
import scipy.special

from agentic_jax.data.chat import Message
from agentic_jax.eval.stats import cohen_kappa, fleiss_kappa

Winner = Literal["A", "B", "tie"]
WINNERS: tuple[Winner, ...] = ("A", "B", "tie")
DEFAULT_SAMPLING: Mapping[str, Any] = {"temperature": 0.0}  # MT-Bench judges greedily.


class _Turn(Protocol):
    text: str


class JudgePolicy(Protocol):
    """The agent policy protocol, as far as a judge needs it."""

    def respond(self, messages: Sequence[Message], tools: Sequence = (), **sampling: Any) -> _Turn:
        """The next assistant turn after ``messages``."""


@dataclasses.dataclass(frozen=True)
class JudgePrompt:
    """A judge's instructions: a system message and a user-message ``template`` whose named
    ``{fields}`` the judge fills in (literal braces are written ``{{`` and ``}}``).

    ``sha256`` identifies the prompt exactly; bump ``version`` whenever the wording changes, so
    that a name and version always denote one hash.
    """

    name: str
    version: str
    system: str
    template: str

    def __post_init__(self):
        if not self.name:
            raise ValueError("a judge prompt needs a name")
        try:
            parsed = list(string.Formatter().parse(self.template))
        except ValueError as error:
            raise ValueError(f"prompt {self.name!r}: malformed template ({error})") from None
        for _, field, _, _ in parsed:
            if field is not None and not field.isidentifier():
                raise ValueError(
                    f"prompt {self.name!r}: template field {{{field}}} is not a plain name "
                    "(positional, attribute and index fields are not allowed)"
                )

    @property
    def fields(self) -> frozenset[str]:
        """The names of the template's fields."""
        parsed = string.Formatter().parse(self.template)
        return frozenset(field for _, field, _, _ in parsed if field is not None)

    @property
    def sha256(self) -> str:
        """Hex sha256 of name, version, system and template (as a JSON object)."""
        payload = json.dumps(
            {
                "name": self.name,
                "version": self.version,
                "system": self.system,
                "template": self.template,
            },
            sort_keys=True,
            ensure_ascii=False,
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    def render(self, **values: Any) -> list[Message]:
        """The judge's conversation: the system message, then the filled-in template.  Every
        template field must be given, and nothing else."""
        missing, unknown = self.fields - values.keys(), values.keys() - self.fields
        if missing or unknown:
            raise ValueError(
                f"prompt {self.name!r} v{self.version} has fields {sorted(self.fields)}; "
                f"missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        return [Message("system", self.system), Message("user", self.template.format(**values))]


DEFAULT_RUBRIC = """\
- Correctness: are the facts, reasoning and any final answer right?
- Helpfulness: does it do what the user asked, completely?
- Clarity: is it organised and easy to follow?
- Economy: no padding, repetition or material the question did not call for."""

POINTWISE_PROMPT = JudgePrompt(
    name="pointwise-rubric",
    version="1",
    system=(
        "You are an impartial grader of answers written by AI assistants. You grade what an "
        "answer says, not how long or confident it sounds."
    ),
    template="""\
Grade the answer below to the user's question.

[Question]
{question}

[Answer]
{answer}

[Rubric]
{rubric}

Weigh the answer against each point of the rubric. Extra length earns nothing unless the extra \
text helps the user. Write a brief justification, then end with one final line of the form \
"Score: N", where N is a whole number from {low} (worst) to {high} (best).""",
)

PAIRWISE_PROMPT = JudgePrompt(
    name="pairwise-preference",
    version="1",
    system=(
        "You are an impartial judge comparing two answers written by AI assistants. The order in "
        "which the answers are shown is arbitrary and must not influence you, and neither must "
        "their length."
    ),
    template="""\
Decide which of two answers to the user's question is better.

[Question]
{question}

[Answer A]
{answer_a}

[Answer B]
{answer_b}

Consider correctness, helpfulness, relevance and depth; a longer answer is better only if its \
extra content is. Write a brief comparison, then end with one final line that is exactly one \
of "Verdict: A" (A is better), "Verdict: B" (B is better) or "Verdict: tie".""",
)

_DECOR = r"[\s*_\[\]]*"  # markdown bold/italics and [[brackets]] models put around answers.
_SCORE = re.compile(rf"(?i:\bscore){_DECOR}[:=]{_DECOR}(-?\d+(?:\.\d+)?)")
_VERDICT = re.compile(
    rf"(?i:\bverdict){_DECOR}[:=]{_DECOR}(?:(?i:assistant|answer)\s+)?(A|B|(?i:tie))\b"
)


def _check_fields(prompt: JudgePrompt, required: set[str], optional: set[str], judge: str):
    unknown, missing = prompt.fields - required - optional, required - prompt.fields
    if unknown:
        raise ValueError(
            f"prompt {prompt.name!r}: template field(s) {sorted(unknown)} unknown to {judge}, "
            f"which fills {sorted(required | optional)}"
        )
    if missing:
        raise ValueError(
            f"prompt {prompt.name!r}: {judge} needs template field(s) {sorted(missing)}"
        )


def _judge_name(name: str | None, policy: JudgePolicy) -> str:
    return name or getattr(policy, "name", None) or type(policy).__name__


@dataclasses.dataclass(frozen=True)
class JudgeScore:
    """A pointwise grade: ``score`` on the judge's scale, or None with the reason in ``error``
    when the reply had no valid ``Score: N`` line; ``raw`` is the judge's reply."""

    score: int | None
    raw: str
    judge: str
    prompt_sha256: str
    error: str | None = None


class PointwiseJudge:
    """Grades one answer at a time against a rubric on an integer scale (MT-Bench's "single
    answer grading", Zheng et al. 2023).  The template may use ``question``, ``answer``,
    ``rubric``, ``low`` and ``high``."""

    def __init__(
        self,
        policy: JudgePolicy,
        prompt: JudgePrompt = POINTWISE_PROMPT,
        rubric: str = DEFAULT_RUBRIC,
        scale: tuple[int, int] = (1, 10),
        sampling: Mapping[str, Any] | None = None,
        name: str | None = None,
    ):
        low, high = scale
        if not (isinstance(low, int) and isinstance(high, int) and low < high):
            raise ValueError(f"scale must be two integers (low, high) with low < high, got {scale}")
        _check_fields(prompt, {"question", "answer"}, {"rubric", "low", "high"}, "PointwiseJudge")
        self.policy, self.prompt, self.rubric, self.scale = policy, prompt, rubric, (low, high)
        self.sampling = dict(DEFAULT_SAMPLING if sampling is None else sampling)
        self.name = _judge_name(name, policy)

    def parse(self, text: str) -> tuple[int | None, str | None]:
        """``(score, None)`` from the reply's last ``Score: N``, or ``(None, reason)``."""
        matches = _SCORE.findall(text)
        if not matches:
            return None, "no 'Score: N' line"
        value = float(matches[-1])
        low, high = self.scale
        if not value.is_integer():
            return None, f"score {matches[-1]} is not a whole number"
        if not low <= value <= high:
            return None, f"score {matches[-1]} is outside the scale [{low}, {high}]"
        return int(value), None

    def score(self, question: str, answer: str) -> JudgeScore:
        """The judge's grade of ``answer`` to ``question``."""
        low, high = self.scale
        values = dict(question=question, answer=answer, rubric=self.rubric, low=low, high=high)
        messages = self.prompt.render(
            **{k: v for k, v in values.items() if k in self.prompt.fields}
        )
        text = self.policy.respond(messages, **self.sampling).text
        score, error = self.parse(text)
        return JudgeScore(score, text, self.name, self.prompt.sha256, error)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A pairwise verdict: ``winner`` is ``"A"`` (the first answer given), ``"B"``, ``"tie"`` or
    None when a reply had no valid ``Verdict:`` line.

    ``positions`` holds each judged order's verdict by *position shown* (``"A"``: the answer
    shown first won), one entry for :meth:`PairwiseJudge.compare`, two for
    :meth:`~PairwiseJudge.compare_both_orders` (the second with the answers swapped), with the
    replies in ``raw``.  ``consistent`` says whether both orders named the same answer (None
    for one order, or when a reply was unparseable).
    """

    winner: Winner | None
    positions: tuple[Winner | None, ...]
    raw: tuple[str, ...]
    judge: str
    prompt_sha256: str
    consistent: bool | None = None


_SWAPPED: dict[Winner | None, Winner | None] = {"A": "B", "B": "A", "tie": "tie", None: None}


class PairwiseJudge:
    """Says which of two answers to a question is better (MT-Bench's pairwise comparison, Zheng
    et al. 2023).  The template must use ``question``, ``answer_a`` and ``answer_b``."""

    def __init__(
        self,
        policy: JudgePolicy,
        prompt: JudgePrompt = PAIRWISE_PROMPT,
        sampling: Mapping[str, Any] | None = None,
        name: str | None = None,
    ):
        _check_fields(prompt, {"question", "answer_a", "answer_b"}, set(), "PairwiseJudge")
        self.policy, self.prompt = policy, prompt
        self.sampling = dict(DEFAULT_SAMPLING if sampling is None else sampling)
        self.name = _judge_name(name, policy)

    @staticmethod
    def parse(text: str) -> Winner | None:
        """The position named by the reply's last ``Verdict: A|B|tie`` line, or None."""
        matches = _VERDICT.findall(text)
        if not matches:
            return None
        return "tie" if matches[-1].lower() == "tie" else matches[-1]

    def _judge(self, question: str, first: str, second: str) -> tuple[Winner | None, str]:
        messages = self.prompt.render(question=question, answer_a=first, answer_b=second)
        text = self.policy.respond(messages, **self.sampling).text
        return self.parse(text), text

    def compare(self, question: str, answer_a: str, answer_b: str) -> Verdict:
        """One judgement, ``answer_a`` shown first: exposed to position bias."""
        winner, text = self._judge(question, answer_a, answer_b)
        return Verdict(winner, (winner,), (text,), self.name, self.prompt.sha256)

    def compare_both_orders(self, question: str, answer_a: str, answer_b: str) -> Verdict:
        """Judges ``(a, b)`` and ``(b, a)``; an answer wins only if it wins in both orders, and
        conflicting or tied orders are a tie (Zheng et al. 2023; Wang et al. 2023)."""
        first, first_text = self._judge(question, answer_a, answer_b)
        second, second_text = self._judge(question, answer_b, answer_a)
        back = _SWAPPED[second]  # the swapped order's verdict in terms of answer_a / answer_b
        if first is None or back is None:
            winner, consistent = None, None
        else:
            winner, consistent = (first, True) if first == back else ("tie", False)
        return Verdict(
            winner,
            (first, second),
            (first_text, second_text),
            self.name,
            self.prompt.sha256,
            consistent,
        )


@dataclasses.dataclass(frozen=True)
class PositionBiasReport:
    """How position-biased a judge's verdicts are.

    ``pairs``: both-order verdicts with both replies parsed; in ``inconsistent`` of them the
    two orders disagreed (a win against a loss or a tie; ``inconsistent_rate`` is their share,
    NaN without pairs).  ``judgements``: parsed single-order judgements (each order of a pair counts);
    ``first_position_win_rate``: the share in which the answer shown first won.  An unbiased
    judge shown every pair in both orders has equal first- and second-position rates.
    """

    pairs: int
    inconsistent: int
    inconsistent_rate: float
    judgements: int
    first_position_wins: int
    second_position_wins: int
    ties: int
    first_position_win_rate: float


def position_bias_report(verdicts: Sequence[Verdict]) -> PositionBiasReport:
    """Counts of inconsistent verdicts and of first-position wins (Wang et al. 2023's
    "conflict rate" and Zheng et al. 2023's position-consistency table)."""
    if not verdicts:
        raise ValueError("position_bias_report needs at least one verdict")
    paired = [v for v in verdicts if v.consistent is not None]
    inconsistent = sum(not v.consistent for v in paired)
    counts = Counter(p for v in verdicts for p in v.positions if p is not None)
    judgements = sum(counts.values())
    return PositionBiasReport(
        pairs=len(paired),
        inconsistent=inconsistent,
        inconsistent_rate=inconsistent / len(paired) if paired else float("nan"),
        judgements=judgements,
        first_position_wins=counts["A"],
        second_position_wins=counts["B"],
        ties=counts["tie"],
        first_position_win_rate=counts["A"] / judgements if judgements else float("nan"),
    )


def outcomes(verdicts: Sequence[Verdict]) -> np.ndarray:
    """Each verdict as answer A's outcome: 1 for a win, 0 for a loss, 0.5 for a tie."""
    value = {"A": 1.0, "B": 0.0, "tie": 0.5}
    for i, verdict in enumerate(verdicts):
        if verdict.winner is None:
            raise ValueError(f"verdict {i} is unparseable (winner None): drop or re-judge it")
    return np.array([value[v.winner] for v in verdicts], np.float64)


@dataclasses.dataclass(frozen=True)
class LengthControlledWinRate:
    """``raw``: the mean outcome; ``length_controlled``: ``sigmoid(intercept)``, the win rate the
    fit predicts at zero length difference; ``slope``: the effect of the normalised length
    difference (positive: the judge rewards length)."""

    raw: float
    length_controlled: float
    intercept: float
    slope: float
    n: int


def _negative_log_likelihood(theta: np.ndarray, x: np.ndarray, y: np.ndarray):
    z = theta[0] + theta[1] * x
    value = -np.sum(y * scipy.special.log_expit(z) + (1 - y) * scipy.special.log_expit(-z))
    residual = scipy.special.expit(z) - y
    return value, np.array([residual.sum(), residual @ x])


def length_controlled_win_rate(wins, length_diff) -> LengthControlledWinRate:
    """Win rate controlled for answer length (the idea of AlpacaEval-LC, Dubois et al. 2024).

    ``wins``: outcomes of the evaluated model against a baseline (1 win, 0 loss, 0.5 tie, e.g.
    from :func:`outcomes`); ``length_diff``: its answer's length minus the baseline's, per
    comparison.  Fits ``P(win) = sigmoid(a + b·x)`` with ``x = tanh(d / std(d))`` by maximum
    likelihood (ties count half a win and half a loss; no penalty) and returns ``sigmoid(a)``,
    the win rate had both answers been of equal length.  This is AlpacaEval-LC's length term
    (the tanh bounds the pull of a few very long answers) without its per-instruction
    difficulty term and regularisation.
    """
    y = np.asarray(wins, np.float64)
    d = np.asarray(length_diff, np.float64)
    if y.ndim != 1 or y.size == 0 or y.shape != d.shape:
        raise ValueError(
            f"need equally long, non-empty 1-D wins and length_diff, got {y.shape} and {d.shape}"
        )
    if not np.all(np.isin(y, (0.0, 0.5, 1.0))):
        raise ValueError("wins must be 1 (win), 0 (loss) or 0.5 (tie)")
    if not np.all(np.isfinite(d)):
        raise ValueError("length_diff must be finite")
    raw = float(y.mean())
    if np.all(d == 0) or np.all(y == y[0]):  # nothing to control for, or a constant outcome
        return LengthControlledWinRate(raw, raw, float(scipy.special.logit(raw)), 0.0, y.size)
    if np.all(d == d[0]):
        raise ValueError(
            "every length difference is the same nonzero value: its effect on the "
            "outcome cannot be told apart from the model's"
        )
    x = np.tanh(d / d.std())
    # Without overlap the likelihood keeps rising as the slope grows: no finite fit exists.
    has_loss, has_win = x[y < 1], x[y > 0]
    if has_loss.max() <= has_win.min() or has_win.max() <= has_loss.min():
        raise ValueError(
            "length separates the outcomes (every win is longer, or shorter, than every loss): "
            "the logistic fit has no finite optimum; compare length_matched() pairs instead"
        )
    fit = scipy.optimize.minimize(
        _negative_log_likelihood,
        np.zeros(2),
        args=(x, y),
        jac=True,
        method="BFGS",
        options={"gtol": 1e-10},
    )
    gradient = np.abs(fit.jac).max() / y.size
    if not np.all(np.isfinite(fit.x)) or gradient > 1e-6:
        raise RuntimeError(f"the length-controlled fit did not converge: {fit.message}")
    intercept, slope = map(float, fit.x)
    return LengthControlledWinRate(
        raw, float(scipy.special.expit(intercept)), intercept, slope, y.size
    )


def length_matched(
    pairs: Sequence[tuple[str, str]], max_ratio: float = 1.25, length: Callable[[str], float] = len
) -> list[int]:
    """Indices of the comparisons whose answers' lengths (``length``: characters by default,
    or a token counter) are within ``max_ratio`` of each other: a subset on which verbosity
    bias cannot decide the verdict (two empty answers match)."""
    if max_ratio < 1:
        raise ValueError(f"max_ratio must be >= 1, got {max_ratio}")
    kept = []
    for i, (a, b) in enumerate(pairs):
        short, long = sorted((length(a), length(b)))
        if long == 0 or (short > 0 and long / short <= max_ratio):
            kept.append(i)
    return kept


@dataclasses.dataclass(frozen=True)
class PanelResult:
    """Several judges on the same items.

    ``results[j][i]``: judge ``judges[j]``'s result on item ``i`` (its prompt's hash in
    ``prompt_sha256s[j]``); ``consensus[i]``: the plurality verdict (a split vote is a tie) or
    the median score, None if no judge's reply parsed.  Agreement is computed on the
    ``agreement_items`` items that every judge's reply parsed: Cohen's kappa for each pair of
    judges (``pairwise_kappa[(j, k)]``, ``j < k``), their mean, and Fleiss' kappa (NaN with no
    such items).
    """

    judges: tuple[str, ...]
    prompt_sha256s: tuple[str, ...]
    results: tuple[tuple[Verdict, ...] | tuple[JudgeScore, ...], ...]
    consensus: tuple[Winner | float | None, ...]
    pairwise_kappa: Mapping[tuple[int, int], float]
    mean_cohen_kappa: float
    fleiss_kappa: float
    agreement_items: int


def _plurality(votes: Sequence[Winner | None]) -> Winner | None:
    ranked = Counter(v for v in votes if v is not None).most_common()
    if not ranked:
        return None
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return "tie"
    return ranked[0][0]


def _median(scores: Sequence[int | None]) -> float | None:
    parsed = [s for s in scores if s is not None]
    return float(statistics.median(parsed)) if parsed else None


class JudgePanel:
    """Runs several judges of one kind on the same items and measures their agreement: a
    verdict several judges agree on is more trustworthy than one judge's (Zheng et al. 2023
    report judge–human and judge–judge agreement side by side)."""

    def __init__(self, judges: Sequence[PairwiseJudge] | Sequence[PointwiseJudge]):
        judges = tuple(judges)
        if len(judges) < 2:
            raise ValueError(f"a panel needs at least two judges, got {len(judges)}")
        kinds = {type(j) for j in judges}
        if len(kinds) != 1 or not kinds <= {PairwiseJudge, PointwiseJudge}:
            raise TypeError(
                "a panel's judges must all be PairwiseJudge or all PointwiseJudge, got "
                f"{sorted(k.__name__ for k in kinds)}"
            )
        self.judges = judges

    def _need(self, kind: type) -> None:
        if not isinstance(self.judges[0], kind):
            raise TypeError(f"this panel's judges are {type(self.judges[0]).__name__}s")

    def compare(
        self, items: Sequence[tuple[str, str, str]], *, both_orders: bool = True
    ) -> PanelResult:
        """Every pairwise judge on every ``(question, answer_a, answer_b)``; with
        ``both_orders`` through :meth:`PairwiseJudge.compare_both_orders`."""
        self._need(PairwiseJudge)
        items = _check_items(items, 3)
        results = tuple(
            tuple(
                (judge.compare_both_orders if both_orders else judge.compare)(*item)
                for item in items
            )
            for judge in self.judges
        )
        labels = [[v.winner for v in row] for row in results]
        consensus = tuple(_plurality(column) for column in zip(*labels))
        return self._result(results, labels, consensus, WINNERS, None)

    def score(
        self,
        items: Sequence[tuple[str, str]],
        *,
        weights: Literal["linear", "quadratic"] | None = "quadratic",
    ) -> PanelResult:
        """Every pointwise judge on every ``(question, answer)``; Cohen's kappa is ``weights``-
        weighted over the judges' common scale (scores are ordinal), Fleiss' is unweighted."""
        self._need(PointwiseJudge)
        scales = {j.scale for j in self.judges}
        if len(scales) != 1:
            raise ValueError(f"a panel's pointwise judges must share one scale, got {scales}")
        low, high = scales.pop()
        items = _check_items(items, 2)
        results = tuple(tuple(judge.score(*item) for item in items) for judge in self.judges)
        labels = [[s.score for s in row] for row in results]
        consensus = tuple(_median(column) for column in zip(*labels))
        return self._result(results, labels, consensus, tuple(range(low, high + 1)), weights)

    def _result(self, results, labels, consensus, categories, weights) -> PanelResult:
        complete = [i for i, column in enumerate(zip(*labels)) if None not in column]
        rows = [[row[i] for i in complete] for row in labels]
        pairwise, fleiss = {}, float("nan")
        if complete:
            for j, k in itertools.combinations(range(len(rows)), 2):
                pairwise[j, k] = float(
                    cohen_kappa(rows[j], rows[k], weights=weights, labels=list(categories))
                )
            index = {c: n for n, c in enumerate(categories)}
            counts = np.zeros((len(complete), len(categories)), np.int64)
            for row in rows:
                counts[np.arange(len(complete)), [index[label] for label in row]] += 1
            fleiss = float(fleiss_kappa(counts))
        return PanelResult(
            judges=tuple(j.name for j in self.judges),
            prompt_sha256s=tuple(j.prompt.sha256 for j in self.judges),
            results=results,
            consensus=consensus,
            pairwise_kappa=pairwise,
            mean_cohen_kappa=float(np.mean(list(pairwise.values()))) if pairwise else float("nan"),
            fleiss_kappa=fleiss,
            agreement_items=len(complete),
        )


def _check_items(items: Sequence[tuple], arity: int) -> list[tuple]:
    items = [tuple(item) for item in items]
    if not items:
        raise ValueError("the panel needs at least one item to judge")
    for i, item in enumerate(items):
        if len(item) != arity:
            raise ValueError(f"item {i} has {len(item)} fields, expected {arity}")
    return items
