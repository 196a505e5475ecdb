"""Chat with tool calls over the serving engine, shared by ``JaxPolicy`` and the HTTP server.

Every caller of one :class:`ChatModel` shares its :class:`~agentic_jax.inference.serving.
engine_loop.EngineLoop`, so concurrent chats are batched continuously.

**Tool calls that always parse.**  A turn is generated in two phases:

1. free text through the engine, stopping at ``<tool_call>``, ``<|im_end|>`` or EOS;
2. if it stopped at ``<tool_call>``, the call's JSON is decoded under a token-level automaton
   (``inference/decoding/constrained.py``) of the regex of ``{"name": <tool>, "arguments": <its
   schema>}`` for the offered tools, with ``</tool_call>`` as the only way to end.  A call that ends
   therefore names an offered tool and has schema-valid arguments.  Only a call cut off by the
   token limit fails (``finish_reason == "length"``).

The engine has no per-request logit masks yet, so phase 2 runs through ``inference.decoding.generate``
outside the batch (prompt lengths padded to powers of two, so it compiles a handful of times).
``tool_choice`` follows the OpenAI API: ``auto``, ``none``, ``required`` or one named function
(the last two skip phase 1).

Tools are described to the model in the system message by ``data.chat.with_tools``, the rendering
the text environments use for their tasks, so a model post-trained there sees here the prompt it
learned on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from agentic_jax.data.chat import Message, ToolCall, ToolSpec, render_ids, with_tools
from agentic_jax.data.tokenizer import IM_END, TOOL_CALL, TOOL_CALL_END, Tokenizer
from agentic_jax.inference.decoding.constrained import regex_constraint, schema_regex, token_bytes
from agentic_jax.inference.decoding.generate import generate
from agentic_jax.inference.decoding.prompts import PromptBatch
from agentic_jax.inference.decoding.sampling import SamplingParams, seed_key
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.engine import Engine, EngineConfig
from agentic_jax.inference.serving.engine_loop import EngineLoop
from agentic_jax.models.export import load_checkpoint

# Shapes are padded so that phase 2 compiles rarely: constraints to at least this many states,
# prompts (left-padded) to a power of two of at least this many tokens.
CONSTRAINT_STATES = 256
MIN_CALL_PROMPT = 256
CACHED_CONSTRAINTS = 32  # tool sets whose automata are kept (a server sees many)
MAX_CONSTRAINT_STATES = 8192  # a larger tool-call automaton is refused (its tables are [S, V])


def sampling_params(
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_tokens: int | None = None,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    default_max_tokens: int = 256,
    **ignored,
) -> SamplingParams:
    """``SamplingParams`` from OpenAI-style keywords (unknown keywords are ignored)."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_tokens=max_tokens or default_max_tokens,
        seed=seed,
        stop_strings=stops,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
    )


def _chosen_tools(specs: list[ToolSpec], tool_choice: str | Mapping) -> list[ToolSpec]:
    """The tools a turn may call under ``tool_choice``, checked as the OpenAI API checks it."""
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function", tool_choice)
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str):
            raise RequestError(
                "tool_choice must name a function as {'type': 'function', "
                f"'function': {{'name': ...}}}}, got {tool_choice!r}"
            )
        chosen = [s for s in specs if s.name == name]
        if not chosen:
            raise RequestError(f"tool_choice names {name!r}, which is not among the tools")
        return chosen
    if tool_choice not in ("auto", "none", "required"):
        raise RequestError(
            f"tool_choice must be auto, none, required or a function, got {tool_choice!r}"
        )
    if tool_choice == "required" and not specs:
        raise RequestError("tool_choice is required, but no tools were given")
    return [] if tool_choice == "none" else specs


class TextStream:
    """Incremental detokenisation: each pushed token yields the new visible text.  Text is cut
    before the first stop string; a trailing partial UTF-8 character or a suffix that may be the
    start of a stop string is held back until it resolves."""

    def __init__(self, tokenizer: Tokenizer, stop_strings: Sequence[str] = ()):
        self.tokenizer, self.stop_strings = tokenizer, tuple(s for s in stop_strings if s)
        self.tokens: list[int] = []
        self.text = ""
        self.stopped = False

    def push(self, token: int, final: bool = False) -> str:
        if self.stopped:
            return ""
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        cuts = [text.find(s) for s in self.stop_strings if s in text]
        if cuts:
            text, self.stopped = text[: min(cuts)], True
        elif not final:
            held = max(
                (k for s in self.stop_strings for k in range(1, len(s)) if text.endswith(s[:k])),
                default=0,
            )
            text = text[: len(text) - held]
            while text.endswith("\ufffd"):
                text = text[:-1]
        delta = text[len(self.text) :] if text.startswith(self.text) else ""
        self.text += delta
        return delta


@dataclasses.dataclass(frozen=True)
class Generation:
    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str  # stop, length or tool_calls
    prompt_tokens: int
    completion_tokens: int


class ChatModel:
    """A checkpoint behind an :class:`EngineLoop`, with chat, tool calls and raw completion."""

    def __init__(
        self,
        params,
        config,
        tokenizer: Tokenizer,
        engine_config: EngineConfig | None = None,
        *,
        max_tool_call_tokens: int = 256,
        whitespace_pattern: str = "[ ]?",
    ):
        missing = [t for t in (IM_END, TOOL_CALL, TOOL_CALL_END) if t not in tokenizer.special_ids]
        if missing:
            raise ValueError(f"the tokenizer lacks the chat tokens {missing}")
        self.params, self.config, self.tokenizer = params, config, tokenizer
        self.ids = {t: tokenizer.token_id(t) for t in (IM_END, TOOL_CALL, TOOL_CALL_END)}
        self.engine = Engine(
            params,
            config,
            engine_config or EngineConfig(),
            eos_id=self.ids[IM_END],
            tokenizer=tokenizer,
        )
        self.loop = EngineLoop(self.engine).start()
        self.max_tool_call_tokens = max_tool_call_tokens
        self.whitespace_pattern = whitespace_pattern
        self.pad_id = tokenizer.pad_id or 0
        self._stop_ids = tuple(i for i in (tokenizer.eos_id, self.ids[TOOL_CALL]) if i is not None)
        self._constraints: dict[str, object] = {}
        self._constraint_lock = threading.Lock()
        self._keys = itertools.count()

    @classmethod
    def from_checkpoint(
        cls, path, engine_config: EngineConfig | None = None, **kwargs
    ) -> ChatModel:
        config, params, tokenizer = load_checkpoint(path)
        return cls(params, config, tokenizer, engine_config, **kwargs)

    def close(self) -> None:
        self.loop.stop()

    # ----------------------------------------------------------------------------- plain text
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_bos=self.tokenizer.bos_id is not None)

    def _stream(
        self, prompt: Sequence[int], params: SamplingParams, on_text: Callable[[str], None] | None
    ) -> tuple[list[int], str, str]:
        """Phase 1: (tokens, visible text, finish reason) of a free-running completion."""
        stream = TextStream(self.tokenizer, params.stop_strings)
        tokens, finish = [], "stop"
        with contextlib.closing(self.loop.submit(prompt, params)) as events:  # on_text may raise
            for event in events:
                tokens.append(event.token)
                delta = stream.push(event.token, event.finished)
                if delta and on_text is not None:
                    on_text(delta)
                if event.finished:
                    finish = event.completion.finish_reason
        return tokens, stream.text, finish

    def _check_length(
        self, prompt: Sequence[int], params: SamplingParams, strict_max_tokens: bool
    ) -> None:
        limit = self.engine.max_model_len
        if not 0 < len(prompt) < limit:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens; it must have at least one "
                f"and fewer than max_model_len={limit}"
            )
        if strict_max_tokens and len(prompt) + params.max_tokens > limit:
            raise RequestError(
                f"max_tokens={params.max_tokens} does not fit: the prompt has "
                f"{len(prompt)} tokens, so at most {limit - len(prompt)} more "
                f"fit in max_model_len={limit}"
            )

    def complete(
        self,
        prompt: str,
        params: SamplingParams,
        on_text: Callable[[str], None] | None = None,
        *,
        strict_max_tokens: bool = False,
    ) -> Generation:
        """A raw completion of ``prompt`` (``/v1/completions``).  With ``strict_max_tokens`` a
        ``max_tokens`` that does not fit beside the prompt is a :class:`RequestError` (the
        OpenAI API's rule); without, the completion stops at ``max_model_len``."""
        ids = self.encode(prompt)
        self._check_length(ids, params, strict_max_tokens)
        eos = self.tokenizer.eos_id
        params = dataclasses.replace(params, stop_token_ids=() if eos is None else (eos,))
        tokens, text, finish = self._stream(ids, params, on_text)
        return Generation(text, (), finish, len(ids), len(tokens))

    # ----------------------------------------------------------------------------- chat
    def prompt_ids(self, messages: Sequence[Message], specs: Sequence[ToolSpec] = ()) -> list[int]:
        try:  # the template rejects reserved tokens in content, unknown roles, misplaced calls
            rendered = render_ids(
                with_tools(messages, specs),
                self.tokenizer,
                add_generation_prompt=True,
                add_bos=self.tokenizer.bos_id is not None,
            )
        except ValueError as e:
            raise RequestError(str(e)) from None
        return rendered.ids.tolist()

    def chat(
        self,
        messages: Sequence[Message],
        specs: Sequence[ToolSpec] = (),
        *,
        tool_choice: str | Mapping = "auto",
        params: SamplingParams = SamplingParams(),
        on_text: Callable[[str], None] | None = None,
        strict_max_tokens: bool = False,
    ) -> Generation:
        """The next assistant turn; ``on_text`` receives its text as it is generated
        (``strict_max_tokens`` as in :meth:`complete`)."""
        specs = _chosen_tools(list(specs), tool_choice)
        prompt = self.prompt_ids(messages, specs)
        self._check_length(prompt, params, strict_max_tokens)
        if specs and tool_choice != "auto":  # a call is required: it opens right away
            tokens, text, finish = [self.ids[TOOL_CALL]], "", "stop"
        else:
            phase1 = dataclasses.replace(params, stop_token_ids=self._stop_ids)
            tokens, text, finish = self._stream(prompt, phase1, on_text)
        if not (specs and tokens and tokens[-1] == self.ids[TOOL_CALL]):
            return Generation(text, (), finish, len(prompt), len(tokens))
        call, used = self._tool_call(prompt + tokens, specs, params)
        if call is None:
            return Generation(text, (), "length", len(prompt), len(tokens) + used)
        return Generation(text, (call,), "tool_calls", len(prompt), len(tokens) + used)

    def _constraint(self, specs: Sequence[ToolSpec]):
        key = json.dumps([[s.name, s.parameters] for s in specs], sort_keys=True)
        with self._constraint_lock:
            if key not in self._constraints:
                alternatives = []
                for s in specs:
                    schema = {
                        "type": "object",
                        "properties": {"name": {"const": s.name}, "arguments": dict(s.parameters)},
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    }
                    if "$defs" in s.parameters:  # references resolve against the root
                        schema["$defs"] = s.parameters["$defs"]
                    try:  # the schema is the caller's: whatever it breaks is its error
                        alternatives.append(schema_regex(schema, self.whitespace_pattern))
                    except Exception as e:
                        raise RequestError(
                            f"the parameters of tool {s.name!r} are not a "
                            f"supported JSON schema: {e}"
                        ) from None
                regex = "\n(?:" + "|".join(f"(?:{r})" for r in alternatives) + ")\n"
                tokens = token_bytes(self.tokenizer, self.config.vocab_size)
                try:
                    constraint = regex_constraint(
                        regex,
                        tokens,
                        self.ids[TOOL_CALL_END],
                        num_states=CONSTRAINT_STATES,
                        max_states=MAX_CONSTRAINT_STATES,
                    )
                except ValueError as e:
                    raise RequestError(
                        f"the tools' schemas are too large to constrain: {e}"
                    ) from None
                if len(self._constraints) >= CACHED_CONSTRAINTS:
                    del self._constraints[next(iter(self._constraints))]  # the oldest
                self._constraints[key] = constraint
            return self._constraints[key]

    def _tool_call(
        self, ids: list[int], specs: Sequence[ToolSpec], params: SamplingParams
    ) -> tuple[ToolCall | None, int]:
        """Phase 2: the call's JSON after ``<tool_call>`` under the tools' constraint; (call or
        ``None`` if cut off, tokens used)."""
        max_new = min(self.max_tool_call_tokens, self.engine.max_model_len - len(ids))
        if max_new <= 0:
            return None, 0
        width = max(MIN_CALL_PROMPT, 1 << (len(ids) - 1).bit_length())
        sampling = SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=max_new,
            seed=params.seed,
        )
        key = seed_key(params.seed if params.seed is not None else next(self._keys))
        result = generate(
            self.params,
            self.config,
            PromptBatch.from_lists([ids], length=width, pad_id=self.pad_id),
            sampling=sampling,
            key=key,
            eos_id=self.ids[TOOL_CALL_END],
            pad_id=self.pad_id,
            constraint=self._constraint(specs),
        )
        n = int(result.lengths[0])
        tokens = np.asarray(result.tokens[0, :n]).tolist()
        if not tokens or tokens[-1] != self.ids[TOOL_CALL_END]:
            return None, n
        call = json.loads(self.tokenizer.decode(tokens[:-1]))
        return ToolCall(call["name"], call["arguments"]), n
