"""Seeded task generators with a difficulty knob, and their demonstrations.

Each generator maps an integer seed to a `Task` deterministically (numpy's
``default_rng(seed)``), so a seed *is* a level for Prioritized Level Replay
and a bank of tasks is reproducible from its seeds.  Every task carries

* ``demonstration``: a correct continuation in chat messages -- tool calls
  with the tool messages the tools really return (computed by the tools'
  host implementations, which equal the jitted ones), then a
  ``<think>...</think><answer>...</answer>`` turn.  Rendered with
  ``chat.render_ids`` (``Task.render``) it is a supervised warm-start
  example; it earns the generator's full reward;
* ``corrupted``: the same shape with a wrong final answer (a preference
  pair's rejected side), which does not.

Families: `Arithmetic` (multi-step integer arithmetic; difficulty = number
of operators, each a calculator call whose result the next one carries),
`Countdown` (reach a target from given numbers; difficulty = how many
numbers), `MultiHop` (chained fact lookups; difficulty = hops).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from agentic_jax.data.chat import Message, ToolCall, with_tools
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.text import calculator
from agentic_jax.envs.text.env import TextEnv
from agentic_jax.envs.text.rewards import (
    ByFamily,
    CountdownAnswer,
    ExactAnswer,
    NumericCloseness,
    Reward,
    ThinkAnswerFormat,
    Weighted,
)
from agentic_jax.envs.text.tasks import Task
from agentic_jax.envs.text.tools import Calculator, Lookup, Search, Tool

FORMAT = "Think inside <think></think>, then give only the final answer inside <answer></answer>."
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def task_prompt(system: str, user: str, tools: Sequence[Tool]) -> tuple[Message, ...]:
    """A task's opening messages: the system message with the tools' section
    (``chat.with_tools``, as the serving layer renders an agent's tools), then the question."""
    return tuple(
        with_tools([Message("system", system), Message("user", user)], [t.spec for t in tools])
    )


def final_turn(thought: str, answer: str) -> Message:
    return Message("assistant", f"<think>{thought}</think><answer>{answer}</answer>")


def tool_turns(tool: Tool, arguments: Iterable[str], task: Task) -> tuple[Message, ...]:
    """One call per argument, each followed by the tool message the tool returns for ``task``."""
    turns = []
    for argument in arguments:
        turns += [
            Message("assistant", "", (ToolCall(tool.name, {tool.argument: argument}),)),
            Message("tool", tool.run_host(argument, task)),
        ]
    return tuple(turns)


def _combine(left: tuple[str, int], op: str, right: tuple[str, int]) -> str:
    """Infix text of ``left op right`` with the parentheses Python's precedence needs
    (operands: (text, prec))."""
    left_text = f"({left[0]})" if left[1] < _PRECEDENCE[op] else left[0]
    right_text = f"({right[0]})" if right[1] <= _PRECEDENCE[op] else right[0]
    return f"{left_text} {op} {right_text}"


class Generator:
    """A family of tasks; ``sample(seed)`` is deterministic, ``difficulty`` scales the reasoning needed."""

    tools: tuple[Tool, ...] = ()
    reward: Reward
    env_type: type[TextEnv] = TextEnv  # the env its tasks need (`memory.MemoryEnv`: sessions)

    def __init__(self, difficulty: int):
        if difficulty < 1:
            raise ValueError(f"difficulty must be >= 1, got {difficulty}")
        self.difficulty = difficulty

    @property
    def max_turns(self) -> int:
        """Assistant turns the demonstrations take (the least turn limit that lets them finish)."""
        return 1

    def sample(self, seed: int) -> Task:
        raise NotImplementedError

    @property
    def family(self) -> str:
        return type(self).__name__

    def tasks(self, seeds: Iterable[int]) -> list[Task]:
        return [self.sample(int(s)) for s in seeds]


def task_env(
    tokenizer: Tokenizer,
    generators: Generator | Sequence[Generator],
    seeds: Iterable[int],
    **kwargs,
) -> TextEnv:
    """A `TextEnv` over the tasks of ``seeds`` from each generator, with their tools, verifiers
    and turn limit (the generators' ``env_type``: a `memory.MemoryEnv` for tasks that span
    sessions).

    Several generators make one multi-task env: the union of their tools
    (by name) and a `ByFamily` reward that scores each task with its own
    family's verifier.  Tools of one name may differ only in
    ``argument_bytes``; the longest limit is kept, so that every family's
    demonstrations still fit (a hard `Countdown` needs a longer calculator
    input than `Arithmetic`).
    """
    generators = [generators] if isinstance(generators, Generator) else list(generators)
    seeds = list(seeds)
    tools = {}
    for tool in (t for g in generators for t in g.tools):
        kept = tools.setdefault(tool.name, tool)
        if type(kept) is not type(tool) or {**vars(kept), "argument_bytes": 0} != {
            **vars(tool),
            "argument_bytes": 0,
        }:
            raise ValueError(f"generators define the tool {tool.name!r} differently")
        if tool.argument_bytes > kept.argument_bytes:
            tools[tool.name] = tool
    rewards = {g.family: g.reward for g in generators}
    kwargs.setdefault("max_turns", max(g.max_turns for g in generators))
    env_types = {g.env_type for g in generators}
    if len(env_types) > 1:
        raise ValueError(f"generators need different envs: {sorted(t.__name__ for t in env_types)}")
    return env_types.pop()(
        tokenizer,
        [t for g in generators for t in g.tasks(seeds)],
        rewards[generators[0].family] if len(rewards) == 1 else ByFamily(rewards),
        tools=tuple(tools.values()),
        **kwargs,
    )


class Arithmetic(Generator):
    """Evaluate an expression of ``difficulty`` operators (``+ - *`` on small integers).

    With tools, the demonstration computes one operation per calculator call
    (so it takes ``difficulty + 1`` turns); without, it answers at once.
    Reward: exact answer (0.8) + numeric closeness as partial credit (0.1) + format (0.1);
    ``partial_credit=False`` drops the closeness term (exact 0.9 + format 0.1).  RL should
    usually do without it: a policy that always answers one typical number earns closeness
    credit on every problem, a constant reward that competes with learning to be right.
    """

    def __init__(self, difficulty: int, use_tools: bool = True, partial_credit: bool = True):
        super().__init__(difficulty)
        self.tools = (Calculator(),) if use_tools else ()
        self.reward = (
            Weighted((0.8, ExactAnswer()), (0.1, NumericCloseness()), (0.1, ThinkAnswerFormat()))
            if partial_credit
            else Weighted((0.9, ExactAnswer()), (0.1, ThinkAnswerFormat()))
        )

    @property
    def max_turns(self):
        return self.difficulty + 1 if self.tools else 1

    def sample(self, seed):
        rng = np.random.default_rng(seed)
        high = 10 + 5 * self.difficulty
        while True:
            value = int(rng.integers(1, high))
            text, precedence, steps = str(value), 3, []
            for _ in range(self.difficulty):
                op, operand = str(rng.choice(["+", "-", "*"])), int(rng.integers(1, high))
                pair = [(text, precedence, value), (str(operand), 3, operand)]
                if rng.random() < 0.5:
                    pair.reverse()
                (a_text, a_prec, a), (b_text, b_prec, b) = pair
                result = {"+": a + b, "-": a - b, "*": a * b}[op]
                steps.append((f"{a} {op} {b}", result))
                text, precedence, value = (
                    _combine((a_text, a_prec), op, (b_text, b_prec)),
                    _PRECEDENCE[op],
                    result,
                )
            results = [result for _, result in steps]
            # Redraw when the int32 calculator (tool and verifier) could not evaluate a step, or
            # when an intermediate result already is the answer (a last "* 1", "+ 3" then "- 3"): a
            # problem of d steps needs exactly d calls, and difficulty is the number of steps.
            if all(abs(r) <= calculator.INT_MAX for r in results) and value not in results[:-1]:
                break
        prompt = task_prompt(FORMAT, f"What is {text}?", self.tools)
        task = Task(
            prompt,
            str(value),
            value=value,
            seed=seed,
            difficulty=self.difficulty,
            family=self.family,
        )
        thought = "; ".join(f"{step} = {result}" for step, result in steps)
        calls = tool_turns(self.tools[0], [step for step, _ in steps], task) if self.tools else ()
        wrong = value + int(rng.choice([-10, -1, 1, 10]))
        return dataclasses.replace(
            task,
            demonstration=calls + (final_turn(thought, str(value)),),
            corrupted=calls + (final_turn(thought, str(wrong)),),
        )


class Countdown(Generator):
    """Make a target from ``difficulty + 1`` numbers with ``+ - * /`` (each number at most
    once, exact division).

    The target comes from a random solution that uses every number with
    positive intermediate results.  With tools, the demonstration checks its
    expression with the calculator before answering.  Reward: a legal
    expression equal to the target (0.9) + format (0.1).  Goal-conditioned:
    `relabel` turns any legal answer into a task it solves (hindsight).
    """

    def __init__(self, difficulty: int, use_tools: bool = True, max_number: int = 25):
        super().__init__(difficulty)
        self.max_number = max_number
        # The calculator and verifier read expressions of up to `max_bytes` (48 by default); leave room for
        # the longest solution: every number, " op " and one pair of parentheses per operator.
        self.max_bytes = max(48, (difficulty + 1) * len(str(max_number)) + 5 * difficulty)
        self.tools = (Calculator(self.max_bytes),) if use_tools else ()
        self.reward = Weighted((0.9, CountdownAnswer(self.max_bytes)), (0.1, ThinkAnswerFormat()))

    @property
    def max_turns(self):
        return 2 if self.tools else 1

    def _solution(self, rng: np.random.Generator, numbers: Sequence[int]) -> tuple[str, int]:
        text, precedence, value = str(numbers[0]), 3, numbers[0]
        for n in numbers[1:]:
            legal = ["+", "*"] + ["-"] * (value > n) + ["/"] * (n > 1 and value % n == 0)
            op = str(rng.choice(legal))
            value = {"+": value + n, "-": value - n, "*": value * n, "/": value // max(n, 1)}[op]
            text, precedence = _combine((text, precedence), op, (str(n), 3)), _PRECEDENCE[op]
        return text, value

    def _task(self, numbers: tuple[int, ...], target: int, solution: str, seed: int) -> Task:
        question = (
            f"Using the numbers {list(numbers)}, each at most once, and + - * / (exact division only) "
            f"with parentheses, write an expression equal to {target}."
        )
        task = Task(
            task_prompt(FORMAT, question, self.tools),
            solution,
            value=target,
            numbers=numbers,
            seed=seed,
            difficulty=self.difficulty,
            family=self.family,
        )
        calls = tool_turns(self.tools[0], [solution], task) if self.tools else ()
        return dataclasses.replace(
            task,
            demonstration=calls + (final_turn(f"{solution} = {target}", solution),),
            corrupted=calls + (final_turn(f"{solution} = {target}", f"{solution} + 1"),),
        )

    def sample(self, seed):
        rng = np.random.default_rng(seed)
        while True:
            numbers = tuple(
                int(n) for n in rng.integers(1, self.max_number + 1, size=self.difficulty + 1)
            )
            solution, target = self._solution(
                rng, [numbers[i] for i in rng.permutation(len(numbers))]
            )
            if calculator.evaluate_text(solution, len(solution.encode())).error == calculator.OK:
                break  # else redraw: an intermediate value overflows the int32 calculator
        return self._task(numbers, target, solution, seed)

    def relabel(self, task: Task, answer: str) -> Task | None:
        """Hindsight relabelling: the task whose target is what ``answer`` achieved, if it is legal."""
        result = calculator.evaluate_text(answer, self.max_bytes)
        if result.error != calculator.OK or result.inexact or result.value < 1:
            return None
        relabelled = self._task(task.numbers, result.value, answer, task.seed)
        solved = (
            self.reward.host(relabelled.demonstration[-1].content, relabelled)
            == self.reward.max_value
        )
        return relabelled if solved else None  # e.g. a literal that is not among the numbers


_SYLLABLES = (
    "ka",
    "ri",
    "mo",
    "ne",
    "lu",
    "ta",
    "vi",
    "so",
    "pe",
    "da",
    "zu",
    "ho",
    "mi",
    "ga",
    "be",
    "fo",
)


class MultiHop(Generator):
    """Follow a chain of "reports to" facts: "Who is the boss of the boss of X?"; ``difficulty`` hops.

    The facts live only in the tool's data: a key -> value table for
    ``tool="lookup"`` (key: a name, value: their boss), or one sentence per
    fact for ``tool="search"`` (top-k retrieval).  ``distractors`` extra
    people with bosses of their own make the table larger than the chain.
    Reward: exact answer (0.9) + format (0.1).
    """

    def __init__(self, difficulty: int, tool: str = "lookup", distractors: int = 3, top_k: int = 2):
        super().__init__(difficulty)
        if tool not in ("lookup", "search"):
            raise ValueError(f"tool must be 'lookup' or 'search', got {tool!r}")
        self.distractors = distractors
        self.tools = (Lookup(),) if tool == "lookup" else (Search(top_k=top_k),)
        self.reward = Weighted((0.9, ExactAnswer()), (0.1, ThinkAnswerFormat()))

    @property
    def max_turns(self):
        return self.difficulty + 1

    def _attempt(self, rng: np.random.Generator, seed: int) -> Task | None:
        names: list[str] = []
        while len(names) < self.difficulty + 1 + self.distractors:
            name = "".join(rng.choice(_SYLLABLES, size=int(rng.integers(2, 4)))).capitalize()
            if name not in names:
                names.append(name)
        chain, others = names[: self.difficulty + 1], names[self.difficulty + 1 :]
        facts = list(itertools.pairwise(chain)) + [(o, str(rng.choice(names))) for o in others]
        facts = [facts[i] for i in rng.permutation(len(facts))]
        question = f"Who is {'the boss of ' * self.difficulty}{chain[0]}?"
        tool = self.tools[0]
        hint = (
            "The lookup tool takes a person's name as key and returns their boss."
            if isinstance(tool, Lookup)
            else "The search tool finds sentences about who reports to whom."
        )
        task = Task(
            task_prompt(f"{hint} {FORMAT}", question, self.tools),
            chain[-1],
            facts=tuple(facts),
            documents=tuple(f"{a} reports to {b}." for a, b in facts),
            seed=seed,
            difficulty=self.difficulty,
            family=self.family,
        )
        calls = tool_turns(tool, chain[:-1], task)
        if any(
            f"{a} reports to {b}." not in m.content and m.content != b
            for (a, b), m in zip(itertools.pairwise(chain), calls[1::2])
        ):
            return None  # retrieval missed a needed fact: draw another table
        thought = " -> ".join(chain)
        return dataclasses.replace(
            task,
            demonstration=calls + (final_turn(thought, chain[-1]),),
            corrupted=calls + (final_turn(thought, chain[-2]),),
        )

    def sample(self, seed):
        rng = np.random.default_rng(seed)
        while (task := self._attempt(rng, seed)) is None:
            pass
        return task
