"""Evaluation suites: which problems, how many trials under which seeds, which variants.

A `Suite` is a gin configurable; ``configs/eval_<name>.gin`` binds one, and
``agentic-jax eval --suite <name>`` runs it (the gin files are the registry).  Problems come
from the task generators at held-out seeds (those no post-training run trains on).  Every
(variant, seed, trial, task) episode is appended to ``episodes.jsonl`` as it finishes, so an
interrupted run resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import gin
from tqdm import tqdm

from agentic_jax.data.chat import Message, render, with_tools
from agentic_jax.envs.orders import Orders
from agentic_jax.envs.text import Arithmetic, Generator
from agentic_jax.envs.users import PolicyUser, RuleUser
from agentic_jax.eval.agent_metrics import Episode
from agentic_jax.eval.suites.episodes import describe, play, system_prompt, task_id
from agentic_jax.eval.suites.robustness import variant
from agentic_jax.post_training.tasks import HELDOUT_SEED_OFFSET

gin.external_configurable(Orders, module="agentic_jax.envs.orders")
gin.external_configurable(RuleUser, module="agentic_jax.envs.users")
gin.external_configurable(PolicyUser, module="agentic_jax.envs.users")


@gin.configurable(module="eval")
@dataclasses.dataclass(frozen=True)
class Suite:
    """``num_tasks`` problems per generator from seed ``first_seed``; each played ``trials``
    times under each sampling seed of ``seeds`` (the seed goes into the policy's sampling), for
    each robustness variant (``"original"`` first).  ``ks``: the k of pass@k and pass^k.
    Stateful tasks (`Orders`) are conversations with the simulated ``user`` (`RuleUser`, or a
    `PolicyUser`) of at most ``max_user_turns`` replies to it."""

    name: str = "arithmetic"
    generators: Sequence[Generator] = (Arithmetic(2),)
    num_tasks: int = 20
    first_seed: int = HELDOUT_SEED_OFFSET
    seeds: Sequence[int] = (0,)
    trials: int = 1
    temperature: float = 0.0
    max_tokens: int = 128
    max_steps: int = 6
    variants: Sequence[str] = ("original",)
    ks: Sequence[int] = (1,)
    user: RuleUser | PolicyUser = dataclasses.field(default_factory=RuleUser)
    max_user_turns: int = 10

    def __post_init__(self):
        for name in self.variants:
            changed = variant(name)  # fails on an unknown name before any work
            for g in self.generators:
                changed.tools(g.tools)  # and on tools it cannot change (one argument each)
        if self.variants and self.variants[0] != "original":
            raise ValueError(f"Suite.variants must start with 'original', got {self.variants}")
        if self.num_tasks < 1 or self.trials < 1 or not self.seeds:
            raise ValueError("Suite needs num_tasks >= 1, trials >= 1 and at least one seed")
        if self.max_user_turns < 1:
            raise ValueError(f"Suite.max_user_turns must be >= 1, got {self.max_user_turns}")
        if max(self.ks) > self.trials * len(self.seeds):
            raise ValueError(
                f"Suite.ks={self.ks} needs as many trials per task; it has "
                f"{self.trials * len(self.seeds)} (trials x seeds)"
            )

    def problems(self):
        """``(task, tools, reward)`` for every problem, generator by generator."""
        seeds = range(self.first_seed, self.first_seed + self.num_tasks)
        return [(t, g.tools, g.reward) for g in self.generators for t in g.tasks(seeds)]

    def settings(self) -> dict:
        """What a result must match to be compared with another."""
        return {
            "name": self.name,
            "generators": [describe(g) for g in self.generators],
            "user": self.user.id,
            **{
                f.name: getattr(self, f.name)
                for f in dataclasses.fields(self)
                if f.name not in ("name", "generators", "user")
            },
        }


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prompt_hashes(suite: Suite) -> dict[str, str]:
    """Per variant, a hash of the first problem's prompt as the harness shows it (system text and
    the variant's tools' section), and of the chat template rendering a fixed conversation."""
    task, tools, _ = suite.problems()[0]
    out = {}
    for name in suite.variants:
        specs = [t.spec for t in variant(name).tools(tools)]
        shown = with_tools([Message("system", system_prompt(task, tools))], specs)
        out[name] = _sha(shown[0].content)
    probe = [Message("system", "s"), Message("user", "u"), Message("assistant", "a")]
    out["chat_template"] = _sha(render(probe))
    return out


def _key(variant_name, seed, trial, task_id):
    return f"{variant_name}|{seed}|{trial}|{task_id}"


def run_suite(suite: Suite, policy, out_dir: str | Path, *, progress: bool = True) -> dict:
    """Plays every episode of ``suite`` with ``policy`` (resuming ``out_dir/episodes.jsonl``);
    returns ``{variant: [Episode]}``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "episodes.jsonl"
    done: dict[str, Episode] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                key = record.pop("key")
                done[key] = Episode.from_json(record)
    problems = suite.problems()
    total = len(suite.variants) * len(suite.seeds) * suite.trials * len(problems)
    sampling = {"temperature": suite.temperature, "max_tokens": suite.max_tokens}
    episodes: dict[str, list[Episode]] = {name: [] for name in suite.variants}
    with (
        path.open("a", encoding="utf-8") as sink,
        tqdm(total=total, desc=f"eval {suite.name}", disable=not progress) as bar,
    ):
        for name in suite.variants:
            for seed in suite.seeds:
                for trial in range(suite.trials):
                    for task, tools, reward in problems:
                        key = _key(name, seed, trial, task_id(task))
                        if key not in done:
                            done[key] = play(
                                policy,
                                task,
                                tools,
                                reward,
                                variant=variant(name),
                                max_steps=suite.max_steps,
                                sampling=sampling,
                                # distinct seeds per trial, reproducible from (seed, trial)
                                seed=seed * 1000 + trial,
                                trial=trial,
                                user=suite.user,
                                max_user_turns=suite.max_user_turns,
                            )
                            sink.write(json.dumps({"key": key, **done[key].to_json()}) + "\n")
                            sink.flush()
                        episodes[name].append(done[key])
                        bar.update()
    return episodes
