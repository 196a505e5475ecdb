"""The workflow patterns of Anthropic's *Building effective agents* (2024) as state graphs.

Workflows are LLM calls wired by fixed code paths, as opposed to agents, which choose their own
path.  Each function here builds a :class:`~agentic_jax.agents.loops.graph.CompiledGraph` over a
policy; invoke it with ``{"input": ...}`` and read ``output`` from the final state.

* :func:`prompt_chain`: a fixed sequence of calls, each on the previous output, with an optional
  gate (a check between steps that stops a chain gone wrong);
* :func:`routing`: classify the input, then hand it to a specialised prompt;
* :func:`parallelization`: independent calls run concurrently, then aggregated (sectioning, or
  voting over several takes on the same question);
* :func:`orchestrator_workers`: a call splits the task into subtasks decided at run time, workers
  solve them concurrently, a last call synthesises;
* :func:`evaluator_optimizer`: one call drafts, another critiques, until accepted or out of rounds.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Callable, Mapping, Sequence

import pydantic

from agentic_jax.agents.loops.graph import END, CompiledGraph, StateGraph, parallel
from agentic_jax.agents.loops.plan_execute import parse_plan
from agentic_jax.agents.policies.base import Policy
from agentic_jax.data.chat import Message


def ask(policy: Policy, instruction: str, text: str) -> str:
    """One call: ``instruction`` as the system prompt, ``text`` as the user turn."""
    return policy.respond([Message("system", instruction), Message("user", text)]).text.strip()


class ChainState(pydantic.BaseModel):
    input: str
    outputs: list[str] = []
    output: str | None = None
    stopped_by_gate: bool = False


def prompt_chain(
    policy: Policy,
    prompts: Sequence[str],
    gate: Callable[[int, str], bool] | None = None,
    **compile_args,
) -> CompiledGraph:
    """Calls ``prompts`` in order; ``gate(i, output)`` False after step ``i`` ends the chain."""
    graph = StateGraph(ChainState)
    for i, prompt in enumerate(prompts):

        def step(state: ChainState, i=i, prompt=prompt):
            out = ask(policy, prompt, state.outputs[-1] if state.outputs else state.input)
            passed = gate is None or gate(i, out)
            return {"outputs": state.outputs + [out], "output": out, "stopped_by_gate": not passed}

        graph.add_node(f"step_{i}", step)
        nxt = f"step_{i + 1}" if i + 1 < len(prompts) else END
        graph.add_conditional_edges(
            f"step_{i}", lambda s, nxt=nxt: END if s.stopped_by_gate else nxt
        )
    return graph.compile(**compile_args)


class RouteState(pydantic.BaseModel):
    input: str
    route: str | None = None
    output: str | None = None


def routing(policy: Policy, routes: Mapping[str, str], **compile_args) -> CompiledGraph:
    """``routes``: name -> instruction.  A classifier call picks a name (the first route if its
    reply names none); that route's instruction answers.  A name counts only as a whole word of
    the reply, the longest one found winning, so ``code_review`` is not taken for ``code``, nor
    ``aftermath`` for ``math``."""
    names = list(routes)
    if not names:
        raise ValueError("routing needs at least one route")
    classify_prompt = (
        "Classify the request into exactly one category and reply with its name "
        "only. Categories: " + ", ".join(names)
    )
    patterns = {n: re.compile(rf"(?<!\w){re.escape(n.lower())}(?!\w)") for n in names}

    def classify(state: RouteState):
        reply = ask(policy, classify_prompt, state.input).lower()
        named = [n for n in names if patterns[n].search(reply)]
        return {"route": max(named, key=len) if named else names[0]}

    graph = StateGraph(RouteState).add_node("classify", classify)
    for name, instruction in routes.items():
        graph.add_node(
            name, lambda s, instruction=instruction: {"output": ask(policy, instruction, s.input)}
        )
        graph.add_edge(name, END)
    graph.add_conditional_edges("classify", lambda s: s.route)
    return graph.compile(**compile_args)


class ParallelState(pydantic.BaseModel):
    input: str
    results: dict[str, str] = {}
    output: str | None = None


def parallelization(
    policy: Policy,
    prompts: Mapping[str, str],
    aggregate: Callable[[dict[str, str]], str] | None = None,
    **compile_args,
) -> CompiledGraph:
    """Runs every ``prompts`` instruction on the input concurrently; ``aggregate`` (default: the
    results as ``name: result`` lines) makes the output, e.g. a majority vote."""
    branches = {
        name: (lambda s, p=prompt: ask(policy, p, s.input)) for name, prompt in prompts.items()
    }
    join = aggregate or (lambda results: "\n".join(f"{k}: {v}" for k, v in results.items()))
    node = parallel(branches, merge=lambda results: {"results": results, "output": join(results)})
    return StateGraph(ParallelState).add_node("fan_out", node).compile(**compile_args)


class OrchestratorState(pydantic.BaseModel):
    input: str
    subtasks: list[str] = []
    results: list[str] = []
    output: str | None = None


def orchestrator_workers(
    policy: Policy,
    worker_prompt: str = "Solve this subtask concisely.",
    synthesis_prompt: str = "Combine the subtask results into one answer.",
    max_workers: int = 4,
    **compile_args,
) -> CompiledGraph:
    def orchestrate(state: OrchestratorState):
        plan = ask(
            policy,
            "Split the task into independent subtasks: a numbered list, one per "
            "line, nothing else.",
            state.input,
        )
        return {"subtasks": parse_plan(plan)}

    def work(state: OrchestratorState):
        with concurrent.futures.ThreadPoolExecutor(max_workers) as pool:
            results = list(
                pool.map(
                    lambda t: ask(policy, worker_prompt, f"Task: {state.input}\nSubtask: {t}"),
                    state.subtasks,
                )
            )
        return {"results": results}

    def synthesize(state: OrchestratorState):
        lines = "\n".join(f"- {t}: {r}" for t, r in zip(state.subtasks, state.results))
        return {"output": ask(policy, synthesis_prompt, f"Task: {state.input}\nResults:\n{lines}")}

    return (
        StateGraph(OrchestratorState)
        .add_node("orchestrate", orchestrate)
        .add_node("workers", work)
        .add_node("synthesize", synthesize)
        .add_edge("orchestrate", "workers")
        .add_edge("workers", "synthesize")
        .compile(**compile_args)
    )


class OptimizerState(pydantic.BaseModel):
    input: str
    output: str | None = None
    feedback: str | None = None
    rounds: int = 0
    accepted: bool = False


# ACCEPT as the first word, past markdown emphasis or quoting ("**ACCEPT**", "> _Accept_"), but
# not as the start of another word ("ACCEPTABLE? No").
_ACCEPT = re.compile(r"^[\W_]*ACCEPT(?![^\W_])", re.IGNORECASE)


def accepts(verdict: str) -> bool:
    """Whether a reviewer's ``verdict`` starts with the word ACCEPT."""
    return bool(_ACCEPT.match(verdict))


def evaluator_optimizer(
    policy: Policy,
    generator_prompt: str = "Write the best answer you can.",
    evaluator_prompt: str = (
        "Evaluate the answer. Reply ACCEPT if it is good, otherwise say what to improve."
    ),
    max_rounds: int = 3,
    **compile_args,
) -> CompiledGraph:
    def generate(state: OptimizerState):
        text = (
            state.input
            if state.feedback is None
            else (f"{state.input}\nPrevious answer: {state.output}\nFeedback: {state.feedback}")
        )
        return {"output": ask(policy, generator_prompt, text), "rounds": state.rounds + 1}

    def evaluate(state: OptimizerState):
        verdict = ask(policy, evaluator_prompt, f"Task: {state.input}\nAnswer: {state.output}")
        return {"accepted": accepts(verdict), "feedback": verdict}

    return (
        StateGraph(OptimizerState)
        .add_node("generate", generate)
        .add_node("evaluate", evaluate)
        .add_edge("generate", "evaluate")
        .add_conditional_edges(
            "evaluate", lambda s: END if s.accepted or s.rounds >= max_rounds else "generate"
        )
        .compile(**compile_args)
    )
