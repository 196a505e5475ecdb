"""Text environments for LLM policies: token ids in and out, fixed shapes, jit-able.

`TextEnv` runs single-turn verifiable tasks and multi-turn tool use (calls in
the chat format of ``data/chat.py``, executed inside jit) with a per-token
policy-loss mask; `generators` make seeded task families with a difficulty
knob and correct / corrupted demonstrations (`corpus_qa`: multi-hop questions
over the shipped corpus, answered with `DenseSearch`, Search-R1's setting;
`memory`: episodes over several sessions with a memory the policy writes and
reads through tools, `MemoryEnv` and `MultiSessionRecall`);
``envs/host.py`` has the host-side twin for tools that cannot run in jnp.  A trainer's loop::

    env = task_env(tokenizer, [Arithmetic(3), Countdown(3)], seeds=range(1000))
    venv, params = envs.Vectorized(env), env.default_params  # or a HostTextEnv: same calls
    obs, state = venv.reset(keys, params)  # obs: tokens/loss_mask [B, max_length], length [B]
    # generate one assistant turn per row from tokens[:length], stopping at <|im_end|>:
    obs, state, reward, terminated, truncated, info = venv.step(keys, state, turns, params)
    # rows that ended: info["final_observation"] tokens + loss_mask, with `reward`, train the policy;
    # info["task"] and the rewards update a curriculum, whose weights go into params.task_weights.

Supervised warm-start data: ``Task.render`` / `demonstration_batch`.
"""

from agentic_jax.envs.text import calculator
from agentic_jax.envs.text.chat_markers import ChatMarkers, tool_message_template
from agentic_jax.envs.text.corpus_qa import CorpusQA
from agentic_jax.envs.text.env import TextEnv, TextEnvParams, TextEnvState, TurnRewards
from agentic_jax.envs.text.generators import Arithmetic, Countdown, Generator, MultiHop, task_env
from agentic_jax.envs.text.memory import MemoryEnv, MultiSessionRecall, Recall, Remember
from agentic_jax.envs.text.prompt_file import VERIFIERS, PromptFile
from agentic_jax.envs.text.rewards import (
    ByFamily,
    CountdownAnswer,
    ExactAnswer,
    NumericCloseness,
    Reward,
    ThinkAnswerFormat,
    Weighted,
)
from agentic_jax.envs.text.strings import Text
from agentic_jax.envs.text.tasks import (
    Task,
    TaskBank,
    build_bank,
    demonstration_actions,
    demonstration_batch,
)
from agentic_jax.envs.text.tools import (
    Calculator,
    DenseSearch,
    Lookup,
    PassageIndex,
    Search,
    Tool,
    parse_call,
    parse_call_host,
    trigram_encoder,
    trigram_index,
)
from agentic_jax.envs.text.vocab import Vocab, detokenize, encode_int

__all__ = [
    "VERIFIERS",
    "Arithmetic",
    "ByFamily",
    "Calculator",
    "ChatMarkers",
    "CorpusQA",
    "Countdown",
    "CountdownAnswer",
    "DenseSearch",
    "ExactAnswer",
    "Generator",
    "Lookup",
    "MemoryEnv",
    "MultiHop",
    "MultiSessionRecall",
    "NumericCloseness",
    "PassageIndex",
    "PromptFile",
    "Recall",
    "Remember",
    "Reward",
    "Search",
    "Task",
    "TaskBank",
    "Text",
    "TextEnv",
    "TextEnvParams",
    "TextEnvState",
    "ThinkAnswerFormat",
    "Tool",
    "TurnRewards",
    "Vocab",
    "Weighted",
    "build_bank",
    "calculator",
    "demonstration_actions",
    "demonstration_batch",
    "detokenize",
    "encode_int",
    "parse_call",
    "parse_call_host",
    "task_env",
    "tool_message_template",
    "trigram_encoder",
    "trigram_index",
]
