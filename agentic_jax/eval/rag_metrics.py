"""Citation metrics of retrieval-augmented answers: citation precision and citation recall
(faithfulness), support decided by a pluggable judge.

An answer that cites chunks is faithful when what it says is in what it cites.  Following ALCE
(Gao, Yen, Yu & Chen 2023, "Enabling Large Language Models to Generate Text with Citations",
arXiv:2305.14627) the answer is cut into sentences ``s_1..s_S`` and judged against its cited
chunks ``c_1..c_C``; with ``M[i, j] = 1`` when chunk ``j`` supports sentence ``i``:

* **citation recall** (faithfulness) ``= |{i : ∃ j M[i, j]}| / S``: the share of sentences
  that some cited chunk supports (an answer's claims that its sources back);
* **citation precision** ``= |{j : ∃ i M[i, j]}| / C``: the share of cited chunks that support
  some sentence (citations that earn their place).

ALCE judges the concatenation of a sentence's citations with an NLI model; here every pair is
judged alone, by any ``judge(sentence, chunk) -> bool``: :class:`OverlapJudge` (content words,
no model) or :class:`LLMSupportJudge` (an LLM through ``eval.judge``'s machinery).

Conventions: an answer that cites nothing scores 0 precision (it earned no citation) and 0
recall (nothing it cites supports it); an answer without a word to judge is an error, since
no share of its sentences is defined.  Retrieval quality (recall@k, MRR, nDCG@k) is in
``eval.ranking`` and answer exact match and token F1 in ``eval.text_metrics``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from agentic_jax.eval.judge import JudgePolicy, JudgePrompt, JudgeScore, PointwiseJudge
from agentic_jax.eval.text_metrics import normalize_answer

SupportJudge = Callable[[str, str], bool]

# A sentence ends at ., ! or ? followed by whitespace, or at a line break.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
# Citation markers an answer carries, "[1]", "[2, 3]", "[1][4]": no claim, so never judged.
_CITATION = re.compile(r"\[\d+(?:\s*[,;]\s*\d+)*\]")
# Function words: they carry no claim a chunk could support, so overlap ignores them (written
# as text, the way a word list reads).
STOP_WORDS = frozenset(
    """a an the and or but nor so yet if then than that this these those there here it its
    is are was were be been being am do does did done has have had having of in on at by for
    with from to into onto over under about as not no can could will would shall should may
    might must also very just only such which who whom whose what when where why how all any
    each both some i you he she we they me him her us them my your his our their""".split()  # noqa: SIM905
)


def sentences_of(answer: str | Sequence[str]) -> list[str]:
    """The sentences to judge: ``answer`` cut after ``.``, ``!`` or ``?`` followed by
    whitespace and at line breaks (or the given list of sentences), citation markers such as
    ``[2]`` removed, those without a word (:func:`~agentic_jax.eval.text_metrics.
    normalize_answer` empty) dropped."""
    parts = _SENTENCE_END.split(answer) if isinstance(answer, str) else list(answer)
    cleaned = (" ".join(_CITATION.sub(" ", part).split()) for part in parts)
    return [sentence for sentence in cleaned if normalize_answer(sentence)]


def _words(text: str) -> list[str]:
    return normalize_answer(text).split()


@dataclasses.dataclass(frozen=True)
class OverlapJudge:
    """Support by lexical overlap: chunk ``c`` supports sentence ``s`` when
    ``|W(s) ∩ words(c)| / |W(s)| ≥ threshold``, with ``W(s)`` the distinct content words of
    ``s`` (SQuAD-normalised words, :data:`STOP_WORDS` left out; all its words if every one is a
    stop word) and ``words(c)`` the chunk's normalised words.  The default threshold, one half,
    asks that most of what the sentence names appears in the chunk: a sentence copied or
    paraphrased around the chunk's terms passes, one about other things fails.  A judge of
    words, not meaning: a negation or swapped roles go unseen, which an LLM judge catches."""

    threshold: float = 0.5

    def __post_init__(self):
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")

    def share(self, sentence: str, chunk: str) -> float:
        """``|W(s) ∩ words(c)| / |W(s)|`` (0 for a sentence without words)."""
        words = set(_words(sentence))
        content = (words - STOP_WORDS) or words
        return len(content & set(_words(chunk))) / len(content) if content else 0.0

    def __call__(self, sentence: str, chunk: str) -> bool:
        return self.share(sentence, chunk) >= self.threshold


# PointwiseJudge fills ``question`` and ``answer``: here the cited chunk and the sentence.
SUPPORT_PROMPT = JudgePrompt(
    name="citation-support",
    version="1",
    system=(
        "You check whether a source passage supports a statement. You judge only what the "
        "passage says, not what you know."
    ),
    template="""\
Does the passage below support the statement?

[Passage]
{question}

[Statement]
{answer}

The passage supports the statement when everything the statement claims can be read in the \
passage or follows from it directly. Write a brief justification, then end with one final \
line "Score: 1" (supported) or "Score: 0" (not supported).""",
)


class LLMSupportJudge:
    """Support judged by an LLM: a :class:`~agentic_jax.eval.judge.PointwiseJudge` on the 0-1
    scale with :data:`SUPPORT_PROMPT` (or another ``prompt`` filling ``question`` with the chunk
    and ``answer`` with the sentence), greedy unless ``sampling`` says otherwise.  ``Score: 1``
    is support; a reply without a valid score counts as no support (the judge vouched for
    nothing).  ``scores`` keeps every :class:`~agentic_jax.eval.judge.JudgeScore` (reply, judge,
    prompt hash, parse error), so unparsed replies can be counted and the grades audited."""

    def __init__(
        self,
        policy: JudgePolicy,
        prompt: JudgePrompt = SUPPORT_PROMPT,
        sampling: Mapping[str, Any] | None = None,
        name: str | None = None,
    ):
        self.judge = PointwiseJudge(policy, prompt, scale=(0, 1), sampling=sampling, name=name)
        self.scores: list[JudgeScore] = []

    def __call__(self, sentence: str, chunk: str) -> bool:
        result = self.judge.score(question=chunk, answer=sentence)
        self.scores.append(result)
        return result.score == 1


@dataclasses.dataclass(frozen=True)
class CitationScores:
    """``precision`` and ``recall`` (faithfulness) of the module docstring, the ``sentences``
    judged and ``support [S, C]``, ``M[i, j]``: whether cited chunk ``j`` supports sentence
    ``i``."""

    precision: float
    recall: float
    sentences: tuple[str, ...]
    support: np.ndarray


def citation_scores(
    answer: str | Sequence[str], cited: Sequence[str], judge: SupportJudge | None = None
) -> CitationScores:
    """Citation precision and recall of ``answer`` (a text, or its sentences) citing the chunk
    texts ``cited`` (a chunk cited twice counts twice), each pair judged once by ``judge``
    (default :class:`OverlapJudge`)."""
    if isinstance(cited, str):
        raise TypeError("cited must be a list of chunk texts, not a single str")
    sentences = sentences_of(answer)
    if not sentences:
        raise ValueError("the answer has no sentence with a word: its citations cannot be judged")
    judge = OverlapJudge() if judge is None else judge
    support = np.array(
        [[bool(judge(sentence, chunk)) for chunk in cited] for sentence in sentences], bool
    ).reshape(len(sentences), len(cited))
    if not cited:
        return CitationScores(0.0, 0.0, tuple(sentences), support)
    return CitationScores(
        precision=float(support.any(axis=0).mean()),
        recall=float(support.any(axis=1).mean()),
        sentences=tuple(sentences),
        support=support,
    )
