"""A coding task for RL from execution feedback: write a function, scored by hidden unit tests.

Each problem asks for one small Python function (a template with a seeded parameter: add a
constant, count a character, clamp to a range, ...).  The policy may try code with the ``python``
tool (the guarded sandbox, `envs.host.PythonSandbox`) and answers with the function's source in
``<answer>...</answer>``.  The reward is the fraction of the task's hidden unit tests that pass
when the answer runs in the sandbox (RLEF: Gehring et al. 2024, "RLEF: Grounding Code LLMs in
Execution Feedback with Reinforcement Learning", arXiv:2410.02089), plus a small format term.
The tests stay hidden: the prompt shows one example call, the verifier runs several.

Host only: the sandbox runs Python in a subprocess, so the task plays in a `HostTextEnv`
(``TaskSpec.host_env``, ``train_rl(host_tools=True)``); its verifier has no jitted form.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agentic_jax.data.chat import Message, ToolCall
from agentic_jax.envs.host import PythonSandbox
from agentic_jax.envs.text.generators import FORMAT, Generator, final_turn, task_prompt
from agentic_jax.envs.text.rewards import Reward, ThinkAnswerFormat, answer_text
from agentic_jax.envs.text.tasks import Task
from agentic_jax.sandbox import run_python

# name, signature, description with {k}, body with {k}, an input generator, the reference.
_TEMPLATES = (
    (
        "add_k",
        "x",
        "returns x + {k}",
        "return x + {k}",
        lambda r: int(r.integers(-50, 50)),
        lambda k, x: x + k,
    ),
    (
        "times_k",
        "x",
        "returns x * {k}",
        "return x * {k}",
        lambda r: int(r.integers(-20, 20)),
        lambda k, x: x * k,
    ),
    (
        "is_multiple",
        "n",
        "returns True when n is a multiple of {k}, else False",
        "return n % {k} == 0",
        lambda r: int(r.integers(0, 100)),
        lambda k, n: n % k == 0,
    ),
    (
        "clamp",
        "x",
        "returns x limited to the range [0, {k}]",
        "return min(max(x, 0), {k})",
        lambda r: int(r.integers(-30, 60)),
        lambda k, x: min(max(x, 0), k),
    ),
    (
        "count_k",
        "s",
        "returns how many times the digit '{k}' occurs in the string s",
        "return s.count('{k}')",
        lambda r: "".join(map(str, r.integers(0, 10, 6))),
        lambda k, s: s.count(str(k)),
    ),
)
_PARAMETER = {
    "add_k": (1, 20),
    "times_k": (2, 9),
    "is_multiple": (2, 9),
    "clamp": (5, 40),
    "count_k": (0, 9),
}


@dataclasses.dataclass(frozen=True)
class HiddenTests:
    """A task's hidden tests: calls of ``function`` and the values they must return."""

    function: str
    cases: tuple[tuple[object, object], ...]

    def program(self, source: str) -> str:
        """``source`` followed by a check of every case; prints one line of 0/1 results."""
        checks = repr([(arg, expected) for arg, expected in self.cases])
        return (
            f"{source}\n\n"
            f"_results = []\n"
            f"for _arg, _expected in {checks}:\n"
            f"    try:\n"
            f"        _results.append(int({self.function}(_arg) == _expected))\n"
            f"    except Exception:\n"
            f"        _results.append(0)\n"
            f"print('RESULTS', ' '.join(map(str, _results)))\n"
        )


def passed_fraction(source: str, tests: HiddenTests, *, timeout_s: float = 5.0) -> float:
    """The fraction of ``tests`` that ``source`` passes in the sandbox (0 if it fails to run)."""
    done = run_python(tests.program(source), timeout_s=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS")]
    if done.timed_out or not lines:
        return 0.0
    results = lines[-1].split()[1:]
    return sum(r == "1" for r in results) / max(len(tests.cases), 1)


class UnitTests(Reward):
    """``weight`` × the fraction of the task's hidden tests the answer passes, plus ``format``
    × `ThinkAnswerFormat`; host only (the tests run in the sandbox)."""

    def __init__(self, weight: float = 0.9, format_weight: float = 0.1, timeout_s: float = 5.0):
        self.weight, self.format_weight, self.timeout_s = weight, format_weight, timeout_s
        self.max_value = weight + format_weight

    def __call__(self, content, task):
        raise TypeError("UnitTests runs code in a subprocess: it scores in a HostTextEnv only")

    def host(self, content, task):
        source, tests = answer_text(content), task.tests
        score = 0.0 if source is None else passed_fraction(source, tests, timeout_s=self.timeout_s)
        return self.weight * score + self.format_weight * ThinkAnswerFormat().host(content, task)


@dataclasses.dataclass(frozen=True)
class CodingTask(Task):
    """A `Task` with its hidden unit tests."""

    tests: HiddenTests = HiddenTests("f", ())


class Coding(Generator):
    """Write one function from a description and an example call; see the module docstring.

    ``difficulty`` is the number of hidden tests beyond the example (at least 1).  With
    ``use_tools`` the demonstration first runs the function on the example with the ``python``
    tool, then answers (two turns); without, it answers at once.
    """

    def __init__(self, difficulty: int = 3, use_tools: bool = True, timeout_s: float = 5.0):
        super().__init__(difficulty)
        self.tools = (PythonSandbox(timeout_s=timeout_s),) if use_tools else ()
        self.reward = UnitTests(timeout_s=timeout_s)

    @property
    def max_turns(self) -> int:
        return 2 if self.tools else 1

    def sample(self, seed: int) -> CodingTask:
        rng = np.random.default_rng(seed)
        name, arg, description, body, draw, reference = _TEMPLATES[seed % len(_TEMPLATES)]
        k = int(rng.integers(*_PARAMETER[name]))
        example, *hidden = [draw(rng) for _ in range(self.difficulty + 1)]
        source = f"def {name}({arg}):\n    {body.format(k=k)}"
        prompt = task_prompt(
            FORMAT,
            f"Write a Python function {name}({arg}) that {description.format(k=k)}. "
            f"For example, {name}({example!r}) == {reference(k, example)!r}. "
            "Answer with the function's source code only.",
            self.tools,
        )
        tests = HiddenTests(name, tuple((x, reference(k, x)) for x in [example, *hidden]))
        calls = ()
        if self.tools:
            code = f"{source}\nprint({name}({example!r}))"
            calls = (
                Message("assistant", "", (ToolCall("python", {"code": code}),)),
                Message("tool", str(reference(k, example))),
            )
        wrong = f"def {name}({arg}):\n    return {arg}"
        return CodingTask(
            prompt,
            source,
            seed=seed,
            difficulty=self.difficulty,
            family=self.family,
            demonstration=(*calls, final_turn(f"{name} {description.format(k=k)}", source)),
            corrupted=(*calls, final_turn(f"{name} returns its input", wrong)),
            tests=tests,
        )
