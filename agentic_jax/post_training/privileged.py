"""The teacher's transcripts of on-policy self-distillation: the same episode, with privileged
context in the prompt.

On-policy self-distillation (OPSD/OPID) trains the policy on its own samples towards the same
model given information the student does not have.  The teacher's transcript of an episode is
its prompt with a hint added to the last user message, followed by exactly the episode's tokens
after the prompt (the policy's turns and the tool messages, as ids); ``positions[b, t]`` is the
index of the teacher's logits that predict the student's token ``t`` (`common.token_logits`
conventions), so the two distributions can be compared token by token.

Contexts: ``"solution"`` the task's reference solution (the demonstration's final answer turn),
``"feedback"`` the verifier's verdict on this very episode, ``"none"`` no hint (the teacher's
transcript is the student's: the distillation loss and its gradient are 0 with a teacher that
shares the student's weights).  Penaloza et al. 2026, "Privileged Information Distillation for
Language Models", arXiv:2602.04942 (OPSD: RL with a reverse-KL penalty towards the teacher that
sees the privileged information); Snell et al. 2022, "Learning by Distilling Context",
arXiv:2209.15189.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from agentic_jax.data.chat import Message, render_ids
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.text import Task

CONTEXTS = ("solution", "feedback", "none")


def hint(task: Task, context: str, reward: float) -> str:
    """The privileged text the teacher's prompt gains."""
    if context == "solution":
        answer = next(
            (m.content for m in reversed(task.demonstration) if m.role == "assistant"), task.answer
        )
        return f"For reference, a correct solution ends with:\n{answer}"
    if context == "feedback":
        verdict = "correct" if reward > 0 else "not correct"
        return f"For reference, a first attempt at this task was {verdict}; the answer is {task.answer}."
    return ""


def teacher_prompt(task: Task, context: str, reward: float) -> tuple[Message, ...]:
    """``task.prompt`` with the hint appended to its last user message."""
    text = hint(task, context, reward)
    if not text:
        return task.prompt
    messages = list(task.prompt)
    last = max(i for i, m in enumerate(messages) if m.role == "user")
    messages[last] = dataclasses.replace(
        messages[last], content=f"{messages[last].content}\n\n{text}"
    )
    return tuple(messages)


def teacher_rows(
    tokens: np.ndarray,
    length: np.ndarray,
    prompt_length: np.ndarray,
    tasks: Sequence[Task],
    rewards: np.ndarray,
    tokenizer: Tokenizer,
    *,
    context: str,
    width: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(teacher_tokens [B, width], positions [B, L])`` for episodes ``tokens[b, :length[b]]``
    whose first ``prompt_length[b]`` tokens are the prompt of ``tasks[b]`` (see the module
    docstring).  A row whose teacher transcript does not fit in ``width`` keeps only as much of
    the hint as fits: the hint is cut, never the episode."""
    if context not in CONTEXTS:
        raise ValueError(f"context={context!r}; expected one of {CONTEXTS}")
    b, length_max = tokens.shape
    teacher = np.zeros((b, width), np.int32)
    positions = np.zeros((b, length_max), np.int32)
    add_bos = tokenizer.bos_id is not None
    for row in range(b):
        p, n = int(prompt_length[row]), int(length[row])
        prompt = render_ids(
            teacher_prompt(tasks[row], context, float(rewards[row])),
            tokenizer,
            add_generation_prompt=True,
            add_bos=add_bos,
        ).ids
        if len(prompt) + n - p > width:  # keep the student's prompt: no hint, rather than a cut
            prompt = tokens[row, :p]
        response = tokens[row, p:n]
        teacher[row, : len(prompt)] = prompt
        teacher[row, len(prompt) : len(prompt) + len(response)] = response
        shift = len(prompt) - p
        t = np.arange(p, n)
        positions[row, t] = t + shift
    return teacher, positions
