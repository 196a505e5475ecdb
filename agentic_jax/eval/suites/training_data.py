"""Which evaluated problems a model of this project trained on: a suite report's contamination.

A suite draws its problems from held-out seeds, but a new seed need not make a new problem: a
small problem space repeats (one-operator arithmetic has 588 distinct questions and the main
job's SFT set draws 1,500), and the pretraining corpus may hold a question too.  So every
problem is checked against the texts a model of this project trains on, built as the pipeline
builds them:

* ``pretraining corpus``: the documents of the shipped corpus's train split (or ``corpus``);
* ``SFT demonstrations``: each train task's conversation through the chat template
  (``render(task.conversation())``, what ``train_sft`` and the task tokenizer read);
* ``RL prompts``: each train task's prompt with the assistant turn opened (where a rollout
  starts).

``configs/training_data.gin`` binds the SFT and RL task sets to the main job's
(``configs/post_training_task_sets.gin``, seeds ``TaskSpec.seeds("train")``).  The item checked
is the problem as the user poses it (the last prompt message, what the harness hands the
agent): the system prompt and the tools' section are shared by a whole family and would match
every training conversation.

The check is `agentic_jax.eval.contamination`'s, 13-grams by default, with two settings these
problems need.  They are a few words long (``What is 3 + 4?``), so the index keeps grams down to
the shortest problem's length and a problem shorter than ``n`` tokens is looked up whole, as one
gram (the GPT-3 rule, Brown et al. 2020, appendix C); and arithmetic operators stay tokens
(``symbols``), or ``3 + 4`` and ``3 * 4`` would be one question.  Each source gets its own
index, built once per suite run, so the report says which training data holds a problem.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

import gin
import numpy as np

from agentic_jax.data.chat import render
from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.documents import read_documents
from agentic_jax.data.tokenizer import SPECIAL_TOKENS
from agentic_jax.eval.agent_metrics import Episode
from agentic_jax.eval.contamination import (
    NgramIndex,
    clean_subset_score,
    contamination_report,
    normalise,
)
from agentic_jax.eval.suites.episodes import task_id
from agentic_jax.eval.suites.suite import Suite
from agentic_jax.post_training.tasks import TaskSpec

_SPECIAL = re.compile("|".join(map(re.escape, SPECIAL_TOKENS)))
SHOWN = 10  # flagged problems named in report.md (results.json has every one)


def model_text(messages, *, add_generation_prompt: bool = False) -> str:
    """``render(messages)`` with each special token set apart by spaces: the model reads it as a
    token of its own, where normalising would glue it to the word before (``13?<|im_end|>``
    would become ``13imend``)."""
    return _SPECIAL.sub(r" \g<0> ", render(messages, add_generation_prompt=add_generation_prompt))


@gin.configurable(module="eval")
@dataclasses.dataclass(frozen=True)
class TrainingData:
    """The training sources of the check (see the module docstring) and its settings:
    ``corpus`` text files (``None``: the shipped corpus's train split, ``[]``: none), ``sft``
    and ``rl`` task sets; ``n``-grams down to ``min_n`` tokens (``None``: the shortest problem's
    length), ``symbols`` kept as tokens; a problem is flagged when more than ``threshold`` of
    its grams occur in a source.  ``enabled=False`` skips the check."""

    corpus: Sequence[str] | None = None
    sft: Sequence[TaskSpec] = ()
    rl: Sequence[TaskSpec] = ()
    n: int = 13
    min_n: int | None = None
    symbols: str = "+-*/="
    threshold: float = 0.0
    enabled: bool = True

    def sources(self) -> dict[str, tuple[Iterable[str], bool]]:
        """Each configured source: its documents, produced as they are read, and whether they
        are chat transcripts."""
        files = corpus_files("train") if self.corpus is None else list(self.corpus)
        sft = (model_text(t.conversation()) for s in self.sft for t in s.tasks("train"))
        rl = (
            model_text(t.prompt, add_generation_prompt=True)
            for s in self.rl
            for t in s.tasks("train")
        )
        named = (
            ("pretraining corpus", files, read_documents(files), False),
            ("SFT demonstrations", self.sft, sft, True),
            ("RL prompts", self.rl, rl, True),
        )
        return {name: (documents, chat) for name, given, documents, chat in named if given}


def _number(value: float) -> float | None:
    """JSON has no NaN: the mean over an empty subset is null."""
    return None if np.isnan(value) else value


def contamination(
    suite: Suite, episodes: dict[str, list[Episode]], data: TrainingData | None
) -> dict:
    """The contamination section of ``suite``'s result: per problem (task id) whether it is
    flagged and by which sources, the fraction flagged, and per variant the success over all,
    clean and flagged problems (`clean_subset_score`).  ``{"checked": False}`` without ``data``
    or when it is disabled."""
    if data is None or not data.enabled:
        return {"checked": False}
    problems = [task for task, _, _ in suite.problems()]
    # In a transcript a problem is looked up as the user's turn, delimiters included, so that it
    # matches whole and not as the start of a longer one ("What is 3 + 4?", "What is 3 + 4 * 5?").
    items = {
        False: [t.prompt[-1].content for t in problems],
        True: [model_text(t.prompt[-1:]) for t in problems],
    }
    lengths = [len(normalise(q, data.symbols)) for q in items[False]]
    min_n = min(data.n, max(1, min(lengths))) if data.min_n is None else data.min_n
    ids = [task_id(t) for t in problems]
    found_in: dict[str, list[str]] = {t: [] for t in ids}
    sources = {}
    for name, (documents, chat) in data.sources().items():
        documents = list(documents)
        index = NgramIndex.build(documents, data.n, min_n=min_n, symbols=data.symbols)
        report = contamination_report(items[chat], index, data.threshold)
        sources[name] = {"documents": len(documents), "flagged": report.n_flagged}
        for task, flagged in zip(ids, report.flagged):
            if flagged and name not in found_in[task]:
                found_in[task].append(name)
    variants = {}
    for name, eps in episodes.items():
        flags = np.array([bool(found_in[e.task_id]) for e in eps])
        scores = clean_subset_score([float(e.success) for e in eps], flags)
        variants[name] = dict(zip(("success", "clean", "flagged"), map(_number, scores)))
    return {
        "checked": True,
        "n": data.n,
        "min_n": min_n,
        "symbols": data.symbols,
        "threshold": data.threshold,
        "short": sum(length < min_n for length in lengths),
        "sources": sources,
        "items": {t: {"flagged": bool(s), "sources": s} for t, s in found_in.items()},
        "fraction_flagged": float(np.mean([bool(s) for s in found_in.values()])),
        "variants": variants,
    }


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def contamination_markdown(section: dict) -> list[str]:
    """The report's short "Contamination" section."""
    lines = ["", "## Contamination", ""]
    if not section["checked"]:
        return lines + ["Not checked (`eval.TrainingData.enabled = False`)."]
    items = section["items"]
    flagged = [t for t, v in items.items() if v["flagged"]]
    sources = "; ".join(
        f"{name}: {s['flagged']} ({s['documents']:,} document{'s' * (s['documents'] != 1)})"
        for name, s in section["sources"].items()
    )
    lines += [
        f"{len(flagged)} of {len(items)} problems ({section['fraction_flagged']:.1%}) occur in "
        f"the training data: they share a {section['n']}-gram with it, or, when shorter, all "
        f"their tokens in a row (grams of {section['min_n']} to {section['n']} tokens "
        f"indexed). Flagged per source: {sources or 'no sources configured'}.",
        "",
        "| variant | success | clean problems | flagged problems |",
        "| --- | --- | --- | --- |",
    ]
    for name, v in section["variants"].items():
        lines.append(
            f"| {name} | {_cell(v['success'])} | {_cell(v['clean'])} | {_cell(v['flagged'])} |"
        )
    if section["short"]:
        lines += [
            "",
            f"{section['short']} problems are shorter than {section['min_n']} tokens: only a whole "
            "training document equal to one of them would flag it.",
        ]
    if flagged:
        more = f" and {len(flagged) - SHOWN} more" if len(flagged) > SHOWN else ""
        lines += ["", "Flagged: " + ", ".join(f"`{t}`" for t in flagged[:SHOWN]) + more + "."]
    return lines
