"""Chat with tool calls over the serving engine, shared by ``JaxPolicy`` and the HTTP server.

Every caller of one :class:`ChatModel` shares its :class:`~agentic_jax.inference.serving.
engine_loop.EngineLoop`, so concurrent chats are batched continuously.

**Tool calls that always parse.**  A turn is generated in two phases:

1. free text through the engine, stopping at ``<tool_call>``, ``<|im_end|>`` or EOS;
2. if it stopped at ``<tool_call>``, the call's JSON is decoded under a token-level automaton
   (``inference/decoding/constrained.py``) of the regex of ``{"name": <tool>, "arguments": <its
   schema>}`` for the offered tools, with ``</tool_call>`` as the only way to end.  A call that ends
   therefore names an offered tool and has schema-valid arguments.  Only a call cut off by the
   token limit fails (``finish_reason == "length"``; the calls that ended before it are kept).
3. after a call's ``</tool_call>``, the next request's first token is constrained to
   ``<tool_call>`` (another call, under the same automaton) or ``<|im_end|>`` (the turn ends),
   so a turn holds one or more calls under ``parallel_tool_calls=True`` (the OpenAI API's
   default, which the server keeps; ``ChatModel.chat``'s default keeps the template's one-call
   turns, which the agents and RL environments here were trained on); otherwise the turn ends
   after the first.  ``max_tool_calls`` bounds them; each call's request has its own seed.

Phases 2 and 3 are more requests in the engine's batch, carrying the constraint as their
per-request logit mask; each one's prompt is the turn so far, whose blocks the prefix cache
already holds.  ``tool_choice`` follows the OpenAI API: ``auto``, ``none``, ``required`` or one
named function (the last two skip phase 1).  ``on_tool_call`` hears each call as it is decoded:
its name, then its arguments' JSON text piece by piece (``tool_call_stream``), canonically
spelt, so that the pieces join to the ``arguments`` a whole reply carries.

Tools are described to the model in the system message by ``data.chat.with_tools``, the rendering
the text environments use for their tasks, so a model post-trained there sees here the prompt it
learned on.

**A Hugging Face instruct model** (a tokenizer carrying its chat template) chats through that
template (``data.chat_template``), the tools given to it as OpenAI function dicts and tool results
as ``tool`` messages; its turns end at the tokenizer's EOS.  Its calls are in its family's format
(``data.tool_formats``: ``tool_format``, else ``chat_tool_format`` by gin, which reads the
template).  Under ``auto`` the turn runs to its end and the format parses it: several calls per
turn (only the first under ``parallel_tool_calls=False``), and a turn with a malformed call is
returned as its text (``on_text`` gets the text once, at the end, since a call cannot be told
from content before it is read; ``on_tool_call`` each call whole).  A required call is
constrained by the format's ``call_regex``: its opening marker, where it is a token of its own,
starts the turn; the call ends at its closing token, or else at the end of the turn (Mistral's
list may hold several).

**Structured replies.**  ``response_format`` follows the OpenAI API: ``{"type": "text"}``,
``{"type": "json_object"}`` (any JSON object nested at most two deep) or ``{"type":
"json_schema", "json_schema": {"name", "schema", "strict"}}``.  A JSON reply is decoded under
the token automaton of the schema's regex (``outlines-core``'s translation), one more
constrained request in the engine's batch, so a reply that ends validates against its schema;
one cut off by ``max_tokens`` is a prefix of a valid one.  The schema is always enforced
(``strict`` or not), so a schema using a keyword the translation ignores (``minimum``,
``uniqueItems``...) is refused rather than not enforced.  Automata are built once per schema
and kept.

**Log-probabilities.**  Every :class:`Generation` carries its text tokens' log-probabilities
under the raw model, with each token's ``top_logprobs`` likeliest alternatives when asked;
``on_token`` hands them over as they are generated (a stream's chunk carries its own tokens'),
and :meth:`ChatModel.openai_logprobs` writes them as the chat API's ``choices[i].logprobs``.
It also reports ``cached_tokens``, the prompt tokens the engine's prefix cache served (the
API's ``usage.prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jsonschema
import numpy as np

from agentic_jax.data.chat import TOOL_FORMAT, Message, ToolCall, ToolSpec
from agentic_jax.data.chat_template import (
    BuiltinChatTemplate,
    ChatTemplate,
    chat_template,
    template_tool_format,
)
from agentic_jax.data.tokenizer import IM_END, TOOL_CALL, TOOL_CALL_END, Tokenizer
from agentic_jax.data.tool_formats import ToolCallFormat, tool_call_format
from agentic_jax.inference.decoding.constrained import (
    TokenConstraint,
    regex_constraint,
    schema_regex,
    token_bytes,
)
from agentic_jax.inference.decoding.sampling import SEED_RANGE, SamplingParams
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.engine import Engine, EngineConfig
from agentic_jax.inference.serving.engine_loop import EngineLoop
from agentic_jax.inference.serving.metrics import ServingMetrics
from agentic_jax.inference.serving.tool_call_stream import ToolCallDelta, ToolCallStream
from agentic_jax.models.export import load_checkpoint

CONSTRAINT_STATES = 256  # tables padded to at least this many states (fewer distinct shapes)
CACHED_CONSTRAINTS = 32  # tool sets and reply schemas whose automata are kept (a server sees many)
MAX_CONSTRAINT_STATES = 8192  # a larger automaton is refused (its tables are [S, V])
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
# json_object's schema: any JSON object nested at most two deep (its values are scalars, or
# arrays or objects of scalars).  A regex cannot nest without bound, and outlines-core's own
# {"type": "object"} (three deep) makes an automaton of ~1,600 states whose index takes seconds
# to build over even a 300-token vocabulary; this one has ~400 and takes a fraction of that.
_SCALAR = {"type": ["string", "number", "boolean", "null"]}
JSON_OBJECT_SCHEMA = {
    "type": "object",
    "additionalProperties": {
        "anyOf": [
            _SCALAR,
            {"type": "array", "items": _SCALAR},
            {"type": "object", "additionalProperties": _SCALAR},
        ]
    },
}
# Keywords that narrow what a schema accepts but that outlines-core's regex translation ignores:
# a reply decoded under the regex could break them, so a schema using one is refused.
UNENFORCED_KEYWORDS = frozenset(
    {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "uniqueItems", "contains", "minContains", "maxContains", "minProperties",
        "maxProperties", "patternProperties", "propertyNames", "dependentRequired",
        "dependentSchemas", "dependencies", "not", "if", "then", "else",
        "unevaluatedItems", "unevaluatedProperties",
    }
)  # fmt: skip
# Where subschemas sit: under these keywords, a schema; a map of names to schemas; a list of them.
_SUBSCHEMA = ("items", "additionalProperties")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


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


def _unenforced_keyword(schema: Any, path: str = "#") -> tuple[str, str] | None:
    """The first ``(keyword, JSON pointer)`` of :data:`UNENFORCED_KEYWORDS` in ``schema`` or its
    subschemas, or ``None``."""
    if not isinstance(schema, Mapping):
        return None
    found = next((k for k in schema if k in UNENFORCED_KEYWORDS), None)
    if found is not None:
        return found, path
    children = [(f"{path}/{k}", schema[k]) for k in _SUBSCHEMA if k in schema]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), Mapping):
            children += [(f"{path}/{key}/{name}", s) for name, s in schema[key].items()]
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            children += [(f"{path}/{key}/{i}", s) for i, s in enumerate(schema[key])]
    for where, child in children:
        hit = _unenforced_keyword(child, where)
        if hit is not None:
            return hit
    return None


def response_schema(response_format: Mapping | None) -> dict | None:
    """The JSON schema a reply must follow under the OpenAI API's ``response_format``: ``None``
    for text (or no format), :data:`JSON_OBJECT_SCHEMA` for ``json_object``, the given schema
    for ``json_schema``.  A malformed format, an invalid schema or one that constrained decoding
    cannot enforce is a :class:`RequestError` that names the field."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise RequestError(f"response_format must be an object, got {response_format!r}")
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMATS:
        raise RequestError(f"response_format.type={kind!r}; expected one of {RESPONSE_FORMATS}")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise RequestError("response_format.json_schema must be an object with a name and schema")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise RequestError("response_format.json_schema.name must be a non-empty string")
    if not isinstance(spec.get("strict", False), bool | None):
        raise RequestError(f"response_format.json_schema.strict={spec['strict']!r} is not a bool")
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        raise RequestError("response_format.json_schema.schema must be a JSON schema object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise RequestError(
            f"response_format.json_schema.schema is not a valid JSON schema: {e.message}"
        ) from None
    unenforced = _unenforced_keyword(schema)
    if unenforced is not None:
        keyword, where = unenforced
        raise RequestError(
            f"response_format.json_schema.schema uses {keyword!r} (at {where}), which "
            "constrained decoding cannot enforce"
        )
    return dict(schema)


class TokenLogprob(NamedTuple):
    """A generated token, its log-probability under the raw model, and the likeliest tokens
    there as ``(token, logprob)`` (as many as the request's ``top_logprobs``)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class _Turn(NamedTuple):
    """What one free-running request produced (see ``ChatModel._stream``); built from a plain
    ``(tokens, text, finish_reason)`` triple, it has no log-probabilities."""

    tokens: list[int]
    text: str
    finish_reason: str
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens the text shows (no special tokens)
    cached_tokens: int = 0  # prompt tokens the prefix cache served


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
    # the text's tokens (a call's are not text), as ChatModel.openai_logprobs writes them
    logprobs: tuple[TokenLogprob, ...] = ()
    cached_tokens: int = 0  # of the prompt tokens, those the engine's prefix cache served


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
        max_tool_calls: int = 8,
        whitespace_pattern: str = "[ ]?",
        template: ChatTemplate | None = None,
        tool_format: ToolCallFormat | str | None = None,
        metrics: ServingMetrics | None = None,
    ):
        """``max_tool_call_tokens``: the most tokens of one call; ``max_tool_calls``: of calls in
        one turn of this project's template.  ``metrics``: where the engine loop records its
        steps (a new :class:`ServingMetrics` by default; a server exposes ``self.metrics``)."""
        if max_tool_calls < 1:
            raise ValueError(f"ChatModel.max_tool_calls must be at least 1, got {max_tool_calls}")
        # ``data.chat_template.chat_template`` (gin) picks the tokenizer's own Hugging Face
        # template when it carries one, else this project's.
        self.template = chat_template(tokenizer) if template is None else template
        self.params, self.config, self.tokenizer = params, config, tokenizer
        self._builtin = isinstance(self.template, BuiltinChatTemplate)
        if self._builtin:
            chat_tokens = (IM_END, TOOL_CALL, TOOL_CALL_END)
            missing = [t for t in chat_tokens if t not in tokenizer.special_ids]
            if missing:
                raise ValueError(f"the tokenizer lacks the chat tokens {missing}")
            end_of_turn = tokenizer.token_id(IM_END)
        else:  # a Hugging Face template: turns end at the tokenizer's EOS
            if tokenizer.eos_id is None:
                raise ValueError("chat through the tokenizer's template needs its EOS token")
            end_of_turn = tokenizer.eos_id
        self.tool_format, self._no_tools = self._pick_tool_format(tool_format)
        # A call's markers that are tokens of their own: the opening one is written as that
        # token, the closing one ends a constrained call (else the end of the turn does).
        markers = (self.tool_format.open, self.tool_format.close) if self.tool_format else ("", "")
        self._open_id, self._close_id = (tokenizer.added_ids.get(m) if m else None for m in markers)
        self._call_end_id = end_of_turn if self._close_id is None else self._close_id
        self._end_of_turn = end_of_turn
        # This project's template stops free text at the call's opening and constrains the call
        # (one per turn); a Hugging Face model's turn runs to its end and is parsed.
        stops = (tokenizer.eos_id, self._open_id if self._builtin else None)
        self._stop_ids = tuple(i for i in stops if i is not None) or (end_of_turn,)
        self.engine = Engine(
            params,
            config,
            engine_config or EngineConfig(),
            eos_id=end_of_turn,
            tokenizer=tokenizer,
        )
        self.metrics = ServingMetrics() if metrics is None else metrics
        self.loop = EngineLoop(self.engine, self.metrics).start()
        self._special_ids = frozenset(tokenizer.special_ids.values())
        self.max_tool_call_tokens, self.max_tool_calls = max_tool_call_tokens, max_tool_calls
        self.whitespace_pattern = whitespace_pattern
        self._constraints: dict[str, object] = {}
        self._constraint_lock = threading.RLock()  # a constraint may build on another

    def _pick_tool_format(self, tool_format) -> tuple[ToolCallFormat | None, str]:
        """(the format of this model's tool calls, or ``None`` and why tools are refused): the
        argument, else ``data.tool_formats.chat_tool_format`` (gin) of the template."""
        if isinstance(tool_format, str):
            tool_format = tool_call_format(tool_format)
        if tool_format is None:
            try:
                tool_format = template_tool_format(self.template)
            except ValueError as e:
                return None, f"this model's tool calls have no known format: {e}"
        if self._builtin and tool_format.name != TOOL_FORMAT.name:
            raise ValueError(
                f"this project's chat template writes tool calls as {TOOL_FORMAT.name!r}, "
                f"not {tool_format.name!r}"
            )
        return tool_format, ""

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
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        on_text: Callable[[str], None] | None,
        constraint: TokenConstraint | None = None,
        top_logprobs: int = 0,
        on_token: Callable[[TokenLogprob], None] | None = None,
    ) -> _Turn:
        """Phase 1: a free-running completion, under ``constraint`` if one is given.
        ``on_token`` gets each text token's :class:`TokenLogprob` before ``on_text`` gets the
        text it adds (a stream's chunk can then carry its own tokens' log-probabilities)."""
        stream = TextStream(self.tokenizer, params.stop_strings)
        tokens, logprobs, finish, cached = [], [], "stop", 0
        events = self.loop.submit(prompt, params, constraint=constraint, top_logprobs=top_logprobs)
        with contextlib.closing(events):  # on_text may raise
            for event in events:
                tokens.append(event.token)
                if event.token not in self._special_ids:
                    logprobs.append(TokenLogprob(event.token, event.logprob, event.top_logprobs))
                    if on_token is not None:
                        on_token(logprobs[-1])
                delta = stream.push(event.token, event.finished)
                if delta and on_text is not None:
                    on_text(delta)
                if event.finished:
                    finish = event.completion.finish_reason
                    cached = event.completion.cached_tokens
        return _Turn(tokens, stream.text, finish, tuple(logprobs), cached)

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
        top_logprobs: int = 0,
        on_token: Callable[[TokenLogprob], None] | None = None,
    ) -> Generation:
        """A raw completion of ``prompt`` (``/v1/completions``).  With ``strict_max_tokens`` a
        ``max_tokens`` that does not fit beside the prompt is a :class:`RequestError` (the
        OpenAI API's rule); without, the completion stops at ``max_model_len``.
        ``top_logprobs``: the likeliest tokens to keep beside each token's log-probability;
        ``on_token`` gets each text token's as it comes, before ``on_text`` gets its text."""
        ids = self.encode(prompt)
        self._check_length(ids, params, strict_max_tokens)
        eos = self.tokenizer.eos_id
        params = dataclasses.replace(params, stop_token_ids=() if eos is None else (eos,))
        turn = self._stream(ids, params, on_text, None, top_logprobs, on_token)
        return Generation(
            turn.text,
            (),
            turn.finish_reason,
            len(ids),
            len(turn.tokens),
            turn.logprobs,
            turn.cached_tokens,
        )

    # ----------------------------------------------------------------------------- chat
    def prompt_ids(self, messages: Sequence[Message], specs: Sequence[ToolSpec] = ()) -> list[int]:
        try:  # the template rejects reserved tokens in content, unknown roles, misplaced calls
            return self.template.encode(
                messages, self.tokenizer, list(specs) or None, add_generation_prompt=True
            )
        except ValueError as e:
            raise RequestError(str(e)) from None

    def chat(
        self,
        messages: Sequence[Message],
        specs: Sequence[ToolSpec] = (),
        *,
        tool_choice: str | Mapping = "auto",
        parallel_tool_calls: bool | None = None,
        params: SamplingParams = SamplingParams(),
        on_text: Callable[[str], None] | None = None,
        on_tool_call: Callable[[ToolCallDelta], None] | None = None,
        strict_max_tokens: bool = False,
        response_format: Mapping | None = None,
        top_logprobs: int = 0,
        on_token: Callable[[TokenLogprob], None] | None = None,
    ) -> Generation:
        """The next assistant turn; ``on_text`` receives its text as it is generated and
        ``on_tool_call`` its calls (see the module docstring; ``strict_max_tokens``,
        ``top_logprobs`` and ``on_token`` as in :meth:`complete`; ``on_token`` is not called
        for a turn read by a Hugging Face tool-call format, whose text comes at its end).
        ``parallel_tool_calls``: one call or more (``True``, the OpenAI API's default) or at
        most one; ``None``, the template's habit: one in this project's (the turns its agents
        were trained on), all a Hugging Face model writes.
        ``response_format`` (the OpenAI API's; see the module docstring) constrains the reply
        to JSON, and cannot be combined with tools a turn may call."""
        schema = response_schema(response_format)
        specs = _chosen_tools(list(specs), tool_choice)
        one_call = parallel_tool_calls is False or (parallel_tool_calls is None and self._builtin)
        max_calls = 1 if one_call else self.max_tool_calls if self._builtin else None
        if specs and self.tool_format is None:
            raise RequestError(self._no_tools)
        if specs and schema is not None:
            raise RequestError(
                f"response_format {response_format['type']!r} cannot be combined with tools "
                "(unless tool_choice is 'none')"
            )
        prompt = self.prompt_ids(messages, specs)
        self._check_length(prompt, params, strict_max_tokens)
        forced = bool(specs) and tool_choice != "auto"
        if forced:  # a call is required: it opens right away
            turn = _Turn([self._open_id] if self._open_id is not None else [], "", "stop", ())
        else:
            phase1 = dataclasses.replace(params, stop_token_ids=self._stop_ids)
            if specs and not self._builtin:  # the whole turn, then read by the format
                turn = self._stream(prompt, phase1, None, None, top_logprobs)
                return self._parsed_turn(prompt, _Turn(*turn), on_text, max_calls, on_tool_call)
            constraint = None if schema is None else self._schema_constraint(schema)
            turn = self._stream(prompt, phase1, on_text, constraint, top_logprobs, on_token)
        tokens = turn.tokens
        if not (forced or (specs and tokens and tokens[-1] == self._open_id)):
            return Generation(
                turn.text,
                (),
                turn.finish_reason,
                len(prompt),
                len(tokens),
                turn.logprobs,
                turn.cached_tokens,
            )
        calls, cut_off, used, cached = self._tool_calls(
            prompt + tokens, specs, params, max_calls, on_tool_call
        )
        finish = "length" if cut_off else "tool_calls"
        # A forced turn's first request is its first call's: its prompt's cached tokens are the turn's.
        cached = min(cached, len(prompt)) if forced else turn.cached_tokens
        return Generation(
            turn.text, calls, finish, len(prompt), len(tokens) + used, turn.logprobs, cached
        )

    def _parsed_turn(
        self,
        prompt: Sequence[int],
        turn: _Turn,
        on_text: Callable[[str], None] | None,
        max_calls: int | None,
        on_tool_call: Callable[[ToolCallDelta], None] | None,
    ) -> Generation:
        """A free-running turn offered tools, read by the format: its content and (the first
        ``max_calls`` of its) calls when every call in it is well-formed, else its text as it
        is (a malformed call is the model's text, not an error).  ``on_text`` gets that text
        once, at the end, and ``on_tool_call`` each call whole.  Its log-probabilities are the
        whole turn's (calls included: they are not cut apart)."""
        tokens, text, finish = turn.tokens, turn.text, turn.finish_reason
        body = tokens[:-1] if tokens and tokens[-1] == self.engine.eos_id else tokens
        content, calls, errors = self.tool_format.parse(self.tokenizer.decode(body))
        if calls and not errors and finish == "stop":
            text, finish, calls = content, "tool_calls", calls[:max_calls]
        else:
            calls = ()
        if text and on_text is not None:
            on_text(text)
        _tell_whole(calls, 0, on_tool_call)
        return Generation(
            text, calls, finish, len(prompt), len(tokens), turn.logprobs, turn.cached_tokens
        )

    def _cached_constraint(self, key: str, build: Callable[[], TokenConstraint]):
        """``build()``, built once per ``key`` (the newest :data:`CACHED_CONSTRAINTS` kept)."""
        with self._constraint_lock:
            if key not in self._constraints:
                constraint = build()
                if len(self._constraints) >= CACHED_CONSTRAINTS:
                    del self._constraints[next(iter(self._constraints))]  # the oldest
                self._constraints[key] = constraint
            return self._constraints[key]

    def _regex_constraint(
        self, regex: Callable[[], str], end_id: int, what: str
    ) -> TokenConstraint:
        """The token automaton of ``regex()`` ending with ``end_id``.  The regex comes from the
        caller's schemas, so whatever it (or its translation) breaks is the caller's error,
        named as ``what``."""
        tokens = token_bytes(self.tokenizer, self.config.vocab_size)
        for marker in (self._open_id, self._close_id):  # never inside JSON
            if marker is not None:
                tokens[marker] = None
        try:
            return regex_constraint(
                regex(),
                tokens,
                end_id,
                num_states=CONSTRAINT_STATES,
                max_states=MAX_CONSTRAINT_STATES,
            )
        except ValueError as e:
            raise RequestError(f"{what} cannot be constrained: {e}") from None

    @staticmethod
    def _tools_key(specs: Sequence[ToolSpec]) -> str:
        return json.dumps([[s.name, s.parameters] for s in specs], sort_keys=True)

    def _constraint(self, specs: Sequence[ToolSpec]):
        """The automaton of a call to one of ``specs``, in this model's tool-call format."""

        regex = functools.partial(
            self.tool_format.call_regex,
            specs,
            self.whitespace_pattern,
            open_token=self._open_id is not None,
            close_token=self._close_id is not None,
        )
        return self._cached_constraint(
            "tools:" + self._tools_key(specs),
            lambda: self._regex_constraint(regex, self._call_end_id, "the tools' schemas"),
        )

    def _next_call_constraint(self, specs: Sequence[ToolSpec]):
        """The automaton of what may follow a call's closing token in this project's template:
        ``<tool_call>`` and a call to one of ``specs``, or ``<|im_end|>``."""
        return self._cached_constraint(
            "next call:" + self._tools_key(specs),
            lambda: _behind_a_choice(
                self._constraint(specs), (self._open_id, self._end_of_turn), self._open_id
            ),
        )

    def _schema_constraint(self, schema: Mapping):
        """The automaton of a reply that is a JSON document under ``schema``, ending the turn."""
        return self._cached_constraint(
            "schema:" + json.dumps(schema, sort_keys=True),
            lambda: self._regex_constraint(
                functools.partial(schema_regex, schema, self.whitespace_pattern),
                self.engine.eos_id,
                "response_format's schema",
            ),
        )

    @functools.cached_property
    def _token_bytes(self) -> list[bytes | None] | None:
        """Each id's bytes in a byte-level BPE tokenizer (``None`` for another kind)."""
        try:
            return token_bytes(self.tokenizer, self.config.vocab_size)
        except ValueError:
            return None

    def _token_json(self, token: int, logprob: float) -> dict:
        text = self.tokenizer.decode([token])
        exact = None if self._token_bytes is None else self._token_bytes[token]
        data = exact if exact is not None else text.encode("utf-8")
        return {"token": text, "logprob": logprob, "bytes": list(data)}

    def openai_logprobs(self, logprobs: Generation | Sequence[TokenLogprob]) -> dict:
        """A generation's log-probabilities (or those of some of its tokens, a stream's chunk)
        as the chat API's ``choices[i].logprobs``: ``{"content": [{token, logprob, bytes,
        top_logprobs: [{token, logprob, bytes}]}], "refusal": None}``, one entry per token of
        its text.  ``bytes`` are the token's own bytes (a byte-level token may hold part of a
        UTF-8 character; ``token`` then shows U+FFFD)."""
        tokens = logprobs.logprobs if isinstance(logprobs, Generation) else logprobs
        content = [
            {
                **self._token_json(t.token, t.logprob),
                "top_logprobs": [self._token_json(i, lp) for i, lp in t.top],
            }
            for t in tokens
        ]
        return {"content": content, "refusal": None}

    def _tool_calls(
        self,
        ids: list[int],
        specs: Sequence[ToolSpec],
        params: SamplingParams,
        max_calls: int | None,
        on_tool_call: Callable[[ToolCallDelta], None] | None,
    ) -> tuple[tuple[ToolCall, ...], bool, int, int]:
        """Phases 2 and 3: each call after its opening (a token of its own, or text the
        constraint writes) under the tools' constraint, to its closing token or the end of the
        turn; in this project's template, then the choice of another call or the turn's end,
        while fewer than ``max_calls`` (``None``: no bound) have ended.  ``on_tool_call``
        hears each call as its tokens come.  (the calls that ended; whether the last was cut
        off by a token limit; tokens used; of ``ids``, those the prefix cache served to the
        first call's request)."""
        calls: list[ToolCall] = []
        used, cached = 0, 0
        fmt = self.tool_format
        opening = fmt.open if self._open_id is not None else ""
        closing = fmt.close if self._close_id is not None else ""
        while max_calls is None or len(calls) < max_calls:
            first = not calls
            max_new = min(
                self.max_tool_call_tokens + (not first), self.engine.max_model_len - len(ids)
            )
            if max_new <= 0:  # no room: a first call is cut off, a later one never begins
                return tuple(calls), first, used, cached
            sampling = SamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_tokens=max_new,
                seed=_call_seed(params.seed, len(calls)),
                stop_token_ids=(self._call_end_id,),
            )
            constraint = self._constraint(specs) if first else self._next_call_constraint(specs)
            stream = None
            if on_tool_call is not None:
                stream = ToolCallStream(self.tokenizer, len(calls), on_tool_call)
            tokens = []
            with contextlib.closing(
                self.loop.submit(ids, sampling, constraint=constraint)
            ) as events:
                for event in events:  # on_tool_call may raise: the request is then aborted
                    tokens.append(event.token)
                    if stream is not None:
                        stream.push(event.token)
                    if event.finished and first:
                        cached = event.completion.cached_tokens
            used, ids = used + len(tokens), ids + tokens
            if not first and tokens[:1] != [self._open_id]:  # the turn ended
                return tuple(calls), False, used, cached
            if not tokens or tokens[-1] != self._call_end_id:
                return tuple(calls), True, used, cached
            body = self.tokenizer.decode(tokens[(not first) : -1])
            new = fmt.parse(opening + body + closing).calls
            new = new if max_calls is None else new[: max_calls - len(calls)]
            _tell_whole(new, len(calls), None if stream and stream.opened else on_tool_call)
            calls += new
            if not self._builtin:  # another format's call (or Mistral's list) ends the turn
                break
        return tuple(calls), False, used, cached


def _call_seed(seed: int | None, index: int) -> int | None:
    """The seed of the request of a turn's ``index``-th call: the turn's moved on by ``index``
    (wrapping within the int64 range), so that each call samples afresh rather than repeat the
    first's draws."""
    if seed is None:
        return None
    low = SEED_RANGE[0]
    return (seed + index - low) % 2**64 + low


def _behind_a_choice(
    constraint: TokenConstraint, choices: Sequence[int], into: int
) -> TokenConstraint:
    """``constraint`` behind a new initial state that allows only ``choices``: ``into`` goes on
    into ``constraint``'s initial state, the others stay (they end the request)."""
    allowed, next_state = np.asarray(constraint.allowed), np.asarray(constraint.next_state)
    states, vocab = allowed.shape
    choice = np.zeros((1, vocab), bool)
    choice[0, list(choices)] = True
    after = np.full((1, vocab), states, np.int32)
    after[0, into] = int(constraint.initial)
    return TokenConstraint(
        np.concatenate([allowed, choice]),
        np.concatenate([next_state, after]),
        np.append(np.asarray(constraint.final), False),
        np.int32(states),
    )


def _tell_whole(
    calls: Sequence[ToolCall],
    first_index: int,
    on_tool_call: Callable[[ToolCallDelta], None] | None,
) -> None:
    """``calls`` (the turn's from ``first_index`` on) told to ``on_tool_call`` at once: each its
    name, then its arguments in one piece."""
    if on_tool_call is None:
        return
    for index, call in enumerate(calls, first_index):
        on_tool_call(ToolCallDelta(index, call.name, ""))
        on_tool_call(ToolCallDelta(index, None, call.arguments_text()))
