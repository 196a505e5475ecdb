"""RL problems from a prompt file: each record's prompt, scored against its reference answer.

`PromptFile` is a `Generator` over the records of a JSONL or Parquet file in the ``prompt``
format (``data.datasets.read_prompts``: ``prompt``, ``answer``, optional ``verifier``), so a
`TaskSpec` (``TaskSpec.generators = [@PromptFile()]``) trains and evaluates on them like on any
generated family.  The rows are split once, by a permutation seeded with ``split_seed``: the
first ``heldout_fraction`` of them are held out.  A train seed ``s`` is train row ``s``, a
held-out seed ``HELDOUT_SEEDS + s`` held-out row ``s`` (`TaskSpec`'s seed ranges), so
``TaskSpec.num_train`` / ``num_heldout`` may not exceed the split's rows.

The answering turn is scored by the verifier named in `VERIFIERS` (the records' ``verifier``,
one for the whole file, or the generator's): ``exact`` (1 when the text inside
``<answer>...</answer>`` is the reference answer, else 0), ``exact_format`` (0.9 for that, 0.1
for the ``<think>...</think><answer>...</answer>`` format) and ``numeric`` (``1 / (1 + |answer −
reference|)``, for integer answers).  Tasks are single-turn and have no demonstrations (RL and
online preference only); a prompt without a system message gets ``system`` (the answer format).
"""

from __future__ import annotations

import os

import numpy as np

from agentic_jax.data.chat import Message
from agentic_jax.data.datasets import PromptTask, read_prompts
from agentic_jax.envs.text import calculator
from agentic_jax.envs.text.corpus_qa import HELDOUT_SEEDS
from agentic_jax.envs.text.generators import FORMAT, Generator
from agentic_jax.envs.text.rewards import (
    ExactAnswer,
    NumericCloseness,
    Reward,
    ThinkAnswerFormat,
    Weighted,
)
from agentic_jax.envs.text.tasks import Task

VERIFIERS: dict[str, Reward] = {
    "exact": ExactAnswer(),
    "exact_format": Weighted((0.9, ExactAnswer()), (0.1, ThinkAnswerFormat())),
    "numeric": NumericCloseness(),
}


class PromptFile(Generator):
    """The problems of prompt file ``path`` (see the module docstring); ``verifier`` (a
    `VERIFIERS` name) overrides the records' names, which must otherwise agree (none: ``exact``)."""

    def __init__(
        self,
        path: str | os.PathLike,
        verifier: str | None = None,
        heldout_fraction: float = 0.1,
        split_seed: int = 0,
        system: str | None = FORMAT,
    ):
        super().__init__(1)
        self.path = os.fspath(path)
        records = read_prompts(self.path)
        self.verifier = verifier or _file_verifier(records)
        if self.verifier not in VERIFIERS:
            raise ValueError(f"verifier={self.verifier!r}; expected one of {sorted(VERIFIERS)}")
        self.reward = VERIFIERS[self.verifier]
        for record in records:
            _check(record, self.verifier)
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must lie in (0, 1), got {heldout_fraction}")
        heldout = max(1, round(heldout_fraction * len(records)))
        if heldout >= len(records):
            raise ValueError(
                f"{self.path} has {len(records)} records: too few to hold out {heldout} and "
                "train on the rest"
            )
        order = np.random.default_rng(split_seed).permutation(len(records))
        self.heldout = [records[i] for i in order[:heldout]]
        self.train = [records[i] for i in order[heldout:]]
        self.system = system

    @property
    def family(self) -> str:
        return f"PromptFile:{self.verifier}"  # one verifier per family (`rewards.ByFamily`)

    def sample(self, seed: int) -> Task:
        split, rows, row = (
            ("heldout", self.heldout, seed - HELDOUT_SEEDS)
            if seed >= HELDOUT_SEEDS
            else ("train", self.train, seed)
        )
        if not 0 <= row < len(rows):
            raise ValueError(
                f"{self.path} has {len(rows)} {split} rows, no row {row}: set TaskSpec.num_"
                f"{split} (and first_seed) within them"
            )
        record = rows[row]
        prompt = record.prompt
        if self.system is not None and prompt[0].role != "system":
            prompt = (Message("system", self.system), *prompt)
        value = int(record.answer) if self.verifier == "numeric" else 0
        return Task(prompt, record.answer, value=value, seed=seed, family=self.family)


def _file_verifier(records: list[PromptTask]) -> str:
    """The one verifier the records name (``exact`` when none does)."""
    names = {r.verifier for r in records} - {None}
    if len(names) > 1:
        raise ValueError(
            f"{records[0].source.path} names several verifiers {sorted(names)}: split the file "
            "or choose one with PromptFile.verifier"
        )
    return names.pop() if names else "exact"


def _check(record: PromptTask, verifier: str) -> None:
    """Raises `DatasetError` for a record that ``verifier`` cannot score."""
    if record.verifier not in (None, verifier):
        raise record.source.error(
            "verifier", f"{record.verifier!r}, but the file uses {verifier!r}"
        )
    if record.tools:
        raise record.source.error("tools", "prompt-file tasks answer in one turn, without tools")
    if verifier == "numeric":
        try:
            value = int(record.answer)
        except ValueError:
            raise record.source.error("answer", "the numeric verifier needs an integer") from None
        if abs(value) > calculator.INT_MAX:
            raise record.source.error("answer", f"beyond the calculator's ±{calculator.INT_MAX}")
