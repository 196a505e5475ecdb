"""Which problems a post-training run trains and evaluates on: generators, seeds, env sizes.

Train and held-out problems come from disjoint seed ranges of the same generators, so held-out
success measures generalisation to new problems of the trained kinds.  Configs name the
generators (``TaskSpec.generators = [@Arithmetic()]``, scoped bindings for several
difficulties) and the sizes the jitted env works with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import gin

from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.coding import Coding
from agentic_jax.envs.host import HostTextEnv
from agentic_jax.envs.text import (
    Arithmetic,
    ByFamily,
    CorpusQA,
    Countdown,
    Generator,
    MultiHop,
    MultiSessionRecall,
    PromptFile,
    TextEnv,
    TurnRewards,
    task_env,
)

gin.external_configurable(Arithmetic, module="agentic_jax.envs.text")
gin.external_configurable(Countdown, module="agentic_jax.envs.text")
gin.external_configurable(MultiHop, module="agentic_jax.envs.text")
gin.external_configurable(CorpusQA, module="agentic_jax.envs.text")
gin.external_configurable(MultiSessionRecall, module="agentic_jax.envs.text")
gin.external_configurable(PromptFile, module="agentic_jax.envs.text")
gin.external_configurable(TurnRewards, module="agentic_jax.envs.text")
gin.external_configurable(Coding, module="agentic_jax.envs.coding")

HELDOUT_SEED_OFFSET = 1_000_000


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """``num_train`` / ``num_heldout`` tasks from each generator; envs of ``max_length`` tokens
    with assistant turns of up to ``action_length`` tokens.

    Train problems are seeds ``first_seed .. first_seed + num_train - 1``: give stages that
    follow each other different ``first_seed``s (RL after SFT) so that the later one meets
    problems the earlier one never trained on."""

    generators: Sequence[Generator] = (Arithmetic(1),)
    first_seed: int = 0
    num_train: int = 2000
    num_heldout: int = 200
    max_length: int = 320
    action_length: int = 48
    turn_rewards: TurnRewards = TurnRewards()  # what a tool turn earns; default: nothing

    def __post_init__(self):
        if not self.generators:
            raise ValueError("TaskSpec.generators is empty")
        if self.first_seed < 0 or self.first_seed + self.num_train > HELDOUT_SEED_OFFSET:
            raise ValueError(
                f"TaskSpec train seeds [{self.first_seed}, {self.first_seed + self.num_train}) must "
                f"lie in [0, {HELDOUT_SEED_OFFSET}), below the held-out seeds"
            )
        if self.num_train < 1 or self.num_heldout < 1:
            raise ValueError(
                f"TaskSpec needs num_train >= 1 and num_heldout >= 1, got "
                f"{self.num_train} and {self.num_heldout}"
            )

    def seeds(self, split: str) -> range:
        if split == "train":
            return range(self.first_seed, self.first_seed + self.num_train)
        if split == "heldout":
            return range(HELDOUT_SEED_OFFSET, HELDOUT_SEED_OFFSET + self.num_heldout)
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")

    def env(self, tokenizer: Tokenizer, split: str = "train") -> TextEnv:
        """A `TextEnv` over the split's tasks (bank rows: generator by generator, seed by seed)."""
        return task_env(
            tokenizer,
            list(self.generators),
            self.seeds(split),
            max_length=self.max_length,
            action_length=self.action_length,
            turn_rewards=self.turn_rewards,
        )

    def host_env(self, tokenizer: Tokenizer, split: str = "train") -> HostTextEnv:
        """The host-side twin of `env` over the same tasks in the same order: the generators'
        tools run in Python (`HostTextEnv`), so a generator may offer host-only tools (the
        sandbox) and host-only verifiers (unit tests)."""
        tools = {}
        for tool in (t for g in self.generators for t in g.tools):  # the longest limit, as task_env
            if tool.argument_bytes >= tools.get(tool.name, tool).argument_bytes:
                tools[tool.name] = tool
        rewards = {g.family: g.reward for g in self.generators}
        reward = next(iter(rewards.values())) if len(rewards) == 1 else ByFamily(rewards)
        return HostTextEnv(
            tokenizer,
            self.tasks(split),
            reward,
            tools=tuple(tools.values()),
            max_length=self.max_length,
            action_length=self.action_length,
            max_turns=max(g.max_turns for g in self.generators),
            turn_rewards=self.turn_rewards,
        )

    def tasks(self, split: str = "train"):
        """The split's `Task`s in bank order (demonstrations for SFT and preference pairs)."""
        return [t for g in self.generators for t in g.tasks(self.seeds(split))]

    @property
    def context_length(self) -> int:
        """The model context a rollout needs: a full transcript plus one generated turn."""
        return self.max_length + self.action_length
