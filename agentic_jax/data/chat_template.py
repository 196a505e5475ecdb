"""Chat templates behind one interface: Hugging Face Jinja templates and this project's own.

A :class:`ChatTemplate` renders a conversation (with OpenAI-style ``tools``) to text, and to token
ids with the assistant mask SFT trains on.  Two kinds:

* :class:`JinjaChatTemplate`: any Hugging Face ``chat_template``, rendered as transformers'
  ``apply_chat_template`` renders it (``utils/chat_template_utils.py``): an
  ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
  ``loopcontrols`` extension, ``raise_exception`` / ``strftime_now`` / ``dict`` / ``namespace``
  globals, a ``tojson`` filter that is ``json.dumps`` (``ensure_ascii=False``, ``indent``), and the
  tokenizer's named tokens (``bos_token`` ...) and any keyword as template variables.  The
  assistant mask comes from the template's ``{% generation %}`` blocks where it has them
  (transformers' ``AssistantTracker``: each block's character span), otherwise from prefixes:
  the span of assistant turn ``i`` runs from the end of ``render(messages[:i],
  add_generation_prompt=True)`` to the end of ``render(messages[:i + 1])`` (trailing whitespace
  the template writes after the turn excluded).  Spans become token masks through the tokens'
  character offsets: a token is trained on when it overlaps a span, as transformers'
  ``return_assistant_tokens_mask`` does.
* :class:`BuiltinChatTemplate`: ``data.chat``'s ChatML-style template with this project's special
  tokens and tool-call format.  It stays a Python renderer: its ids are tokenized span by span
  (a header never merges with the assistant text after it), which rendering text and then
  tokenizing it, as a Jinja template does, cannot promise.  :data:`BUILTIN_JINJA` is the same
  template in Jinja, the ``chat_template`` an export writes for transformers and vLLM.

:func:`chat_template` picks one: the tokenizer's own Hugging Face template if it carries one,
else the built-in template; gin can name either, or a template of the tokenizer by its name.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any, Protocol

import gin
import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agentic_jax.data.chat import (
    Message,
    MessageLike,
    RenderedIds,
    ToolSpec,
    render,
    render_ids,
    with_tools,
)
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.data.tool_formats import ToolCallFormat, chat_tool_format

ToolLike = ToolSpec | Mapping[str, Any]
Span = tuple[int, int]
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


class ChatTemplate(Protocol):
    """Renders conversations; ``extra`` are the template's own variables (e.g. ``date_string``)."""

    def render(
        self,
        messages: Sequence[MessageLike],
        tools: Sequence[ToolLike] | None = None,
        add_generation_prompt: bool = False,
        **extra,
    ) -> str: ...

    def encode(
        self,
        messages: Sequence[MessageLike],
        tokenizer: Tokenizer,
        tools: Sequence[ToolLike] | None = None,
        add_generation_prompt: bool = False,
        **extra,
    ) -> list[int]:
        """The token ids of the rendered conversation (a prompt needs no mask)."""
        ...

    def render_ids(
        self,
        messages: Sequence[MessageLike],
        tokenizer: Tokenizer,
        tools: Sequence[ToolLike] | None = None,
        add_generation_prompt: bool = False,
        **extra,
    ) -> RenderedIds: ...


def _spec(tool: ToolLike) -> ToolSpec:
    return tool if isinstance(tool, ToolSpec) else ToolSpec.from_openai(tool)


@dataclasses.dataclass(frozen=True)
class BuiltinChatTemplate:
    """``data.chat``'s template: tools go into the system message (``chat.with_tools``); it has no
    variables of its own, and BOS starts the ids when the tokenizer has one."""

    def render(self, messages, tools=None, add_generation_prompt=False, **extra) -> str:
        _no_extra(extra)
        return render(self._messages(messages, tools), add_generation_prompt=add_generation_prompt)

    def encode(self, messages, tokenizer, tools=None, add_generation_prompt=False, **extra):
        return self.render_ids(
            messages, tokenizer, tools, add_generation_prompt, **extra
        ).ids.tolist()

    def render_ids(
        self, messages, tokenizer, tools=None, add_generation_prompt=False, **extra
    ) -> RenderedIds:
        _no_extra(extra)
        return render_ids(
            self._messages(messages, tools),
            tokenizer,
            add_generation_prompt=add_generation_prompt,
            add_bos=tokenizer.bos_id is not None,
        )

    @staticmethod
    def _messages(messages, tools) -> list[Message]:
        return with_tools(messages, [_spec(t) for t in tools or ()])


def _no_extra(extra: Mapping) -> None:
    if extra:
        raise ValueError(f"the built-in chat template has no variables; got {sorted(extra)}")


# ``data.chat``'s template as Jinja, for the ``tokenizer_config.json`` of an export: transformers'
# ``apply_chat_template`` renders it to the text ``BuiltinChatTemplate.render`` writes, for
# OpenAI-style messages (tool calls as ``{"type": "function", "function": {..}}`` or as
# ``{"name": .., "arguments": ..}``; arguments as a mapping, or as JSON text written as it is,
# as ``json.dumps`` writes it when it is the OpenAI API's) and tools.  Its ids can differ from
# ``BuiltinChatTemplate.render_ids``: a tokenizer given the whole text may merge across a span
# boundary (a header's newline with the assistant text after it) that the Python renderer
# tokenizes apart, so training keeps the Python renderer and ``chat_template`` maps this source
# back to it.  The text starts with the tokenizer's ``bos_token`` when it has one, as
# ``render_ids`` starts the training ids with BOS.  ``{% generation %}`` marks the spans
# ``render_ids``' mask trains on (assistant content, tool calls, ``<|im_end|>``) for
# ``return_assistant_tokens_mask``.
BUILTIN_JINJA = r"""{%- set reserved = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>",
                   "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>"] %}
{%- if bos_token is defined and bos_token %}{{- bos_token }}{%- endif %}
{%- if tools %}
    {%- set ns = namespace(section="# Tools") %}
    {%- for tool in tools %}
        {%- set fn = tool.function if tool.function is defined else tool %}
        {%- set spec = {"name": fn.name,
                        "description": fn.description if fn.description is defined else "",
                        "parameters": fn.parameters or {"type": "object", "properties": {}}} %}
        {%- set ns.section = ns.section ~ "\n" ~ spec | tojson(sort_keys=true) | replace("<", "\\u003c") %}
    {%- endfor %}
    {%- if messages and messages[0].role == "system" %}
        {%- set system = {"role": "system",
                          "content": (messages[0].content or "") ~ "\n\n" ~ ns.section} %}
        {%- set messages = [system] + messages[1:] %}
    {%- else %}
        {%- set messages = [{"role": "system", "content": ns.section}] + messages %}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role not in ["system", "user", "assistant", "tool"] %}
        {{- raise_exception("unknown role " ~ message.role ~ "; expected system, user, assistant or tool") }}
    {%- endif %}
    {%- if message.tool_calls and message.role != "assistant" %}
        {{- raise_exception("only assistant messages carry tool calls, not " ~ message.role) }}
    {%- endif %}
    {%- set content = message.content or "" %}
    {%- if content is not string %}
        {{- raise_exception("message content must be text") }}
    {%- endif %}
    {%- for token in reserved %}
        {%- if token in content %}
            {{- raise_exception(message.role ~ " message contains the reserved token " ~ token) }}
        {%- endif %}
    {%- endfor %}
    {{- "<|im_start|>" ~ message.role ~ "\n" }}
    {%- if message.role == "tool" %}
        {{- "<tool_result>\n" ~ content ~ "\n</tool_result><|im_end|>\n" }}
    {%- elif message.role == "assistant" %}
        {%- generation %}
            {{- content }}
            {%- for call in message.tool_calls or [] %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- set arguments = fn.arguments if fn.arguments is defined else {} %}
                {%- if arguments is string %}
                    {%- set body = '{"name": ' ~ fn.name | tojson ~ ', "arguments": ' ~ arguments ~ "}" %}
                {%- else %}
                    {%- set body = {"name": fn.name, "arguments": arguments} | tojson %}
                {%- endif %}
                {{- "<tool_call>\n" ~ body | replace("<", "\\u003c") ~ "\n</tool_call>" }}
            {%- endfor %}
            {{- "<|im_end|>" }}
        {%- endgeneration %}
        {{- "\n" }}
    {%- else %}
        {{- content ~ "<|im_end|>\n" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- "<|im_start|>assistant\n" }}
{%- endif %}
"""


# ------------------------------------------------------------------ the transformers environment
class _AssistantTracker(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body and, while tracking, records
    the body's character span (transformers' ``AssistantTracker``)."""

    tags = frozenset({"generation"})

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(activate_tracker=self.activate_tracker)
        self._tracking = ContextVar("assistant_tracker", default=None)

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller) -> str:
        text = caller()
        if (tracking := self._tracking.get()) is not None:
            blocks, spans = tracking
            start = len("".join(blocks))
            spans.append((start, start + len(text)))
        return text

    @contextmanager
    def activate_tracker(self, blocks: list[str], spans: list[Span]):
        token = self._tracking.set((blocks, spans))
        try:
            yield
        finally:
            self._tracking.reset(token)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` refusing underscore names (no reach into Python internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with _")


class _TemplateDict:
    """``dict`` in a template: building dicts, without the class's other attributes."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_AssistantTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_TemplateDict(),
        namespace=_Namespace,
    )
    return env.from_string(source)


def _plain(value: Any) -> Any:
    """What a template may see: JSON-like data only (mappings, lists, scalars), ``None``-valued
    message keys dropped as transformers drops them."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return _plain(value.item())
    # Subclasses (enums, numpy scalars...) become their base type: no extra methods to call.
    for base in (bool, str, int, float):
        if isinstance(value, base):
            return base(value) if base is not str else str.__str__(value)
    raise ValueError(f"a chat template cannot be given a {type(value).__name__}")


def _message_dict(message: MessageLike) -> dict:
    """An OpenAI-shaped message: a ``Message``'s calls become ``tool_calls`` of ``function``
    objects with their arguments as a mapping (the form templates ``tojson``); dicts pass as
    they are."""
    if isinstance(message, Mapping):
        return {k: _plain(v) for k, v in message.items() if v is not None}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": _plain(c.arguments)}}
            for c in message.tool_calls
        ]
    return out


def _tool_dict(tool: ToolLike) -> dict:
    return tool.openai() if isinstance(tool, ToolSpec) else _plain(tool)


@dataclasses.dataclass(frozen=True)
class JinjaChatTemplate:
    """A Hugging Face chat template: one Jinja ``source``, or named sources (the ``tool_use`` one
    when tools are given and the model has it, else ``default``), and ``variables`` every render
    sees (the tokenizer's ``bos_token``, ``eos_token`` ...; keywords of a call override them)."""

    source: str | Mapping[str, str]
    variables: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.source, Mapping) and "default" not in self.source:
            raise ValueError(f"named chat templates {sorted(self.source)} have no 'default'")

    def _source(self, tools) -> str:
        if isinstance(self.source, str):
            return self.source
        return self.source[
            "tool_use" if tools is not None and "tool_use" in self.source else "default"
        ]

    def _generate(self, source, messages, tools, add_generation_prompt, extra):
        """(text, spans of the ``{% generation %}`` blocks) of one render."""
        if not messages:
            raise ValueError("cannot render an empty conversation")
        blocks: list[str] = []
        spans: list[Span] = []
        template = _compile(source)
        variables = {**self.variables, **_plain(extra)}
        with template.environment.activate_tracker(blocks, spans):
            try:  # ``raise_exception`` in the template, or a sandbox violation
                blocks.extend(
                    template.generate(
                        messages=[_message_dict(m) for m in messages],
                        tools=None if tools is None else [_tool_dict(t) for t in tools],
                        documents=None,
                        add_generation_prompt=add_generation_prompt,
                        **variables,
                    )
                )
            except jinja2.TemplateError as e:
                raise ValueError(f"the chat template refused the conversation: {e}") from e
        return "".join(blocks), spans

    def render(self, messages, tools=None, add_generation_prompt=False, **extra) -> str:
        source = self._source(tools)
        return self._generate(source, list(messages), tools, add_generation_prompt, extra)[0]

    def render_with_spans(
        self, messages, tools=None, add_generation_prompt=False, **extra
    ) -> tuple[str, list[Span]]:
        """The text and the character spans of the assistant's turns in it (the template's
        ``{% generation %}`` blocks, or else each turn's difference between prefixes)."""
        messages, source = list(messages), self._source(tools)
        text, spans = self._generate(source, messages, tools, add_generation_prompt, extra)
        if _GENERATION_TAG.search(source):
            return text, spans
        return text, self._prefix_spans(source, messages, tools, extra, text)

    def _prefix_spans(self, source, messages, tools, extra, text) -> list[Span]:
        spans = []
        for i, message in enumerate(messages):
            role = message.role if isinstance(message, Message) else message.get("role")
            if role != "assistant":
                continue
            prompt = self._generate(source, messages[:i], tools, True, extra)[0] if i else ""
            turn = self._generate(source, messages[: i + 1], tools, False, extra)[0]
            if not (turn.startswith(prompt) and text.startswith(turn)):
                raise ValueError(
                    f"the chat template does not render message {i} as an extension of the "
                    "conversation before it, so its assistant mask needs {% generation %} markers"
                )
            spans.append((len(prompt), len(turn.rstrip())))
        return spans

    def encode(self, messages, tokenizer, tools=None, add_generation_prompt=False, **extra):
        """Ids of the rendered text (the template writes BOS itself)."""
        return tokenizer.encode(self.render(messages, tools, add_generation_prompt, **extra))

    def render_ids(
        self, messages, tokenizer, tools=None, add_generation_prompt=False, **extra
    ) -> RenderedIds:
        """Ids of the rendered text (the template writes BOS itself) and the assistant mask."""
        text, spans = self.render_with_spans(messages, tools, add_generation_prompt, **extra)
        ids, offsets = tokenizer.encode_with_offsets(text)
        return RenderedIds(np.asarray(ids, np.int32), _token_mask(offsets, spans))


def _token_mask(offsets: Sequence[Span], spans: Iterable[Span]) -> np.ndarray:
    """1 on each token overlapping a span (so a token straddling a span's edge is trained on)."""
    starts = np.asarray([s for s, _ in offsets], np.int64).reshape(-1)
    ends = np.asarray([e for _, e in offsets], np.int64).reshape(-1)
    mask = np.zeros(len(offsets), np.int32)
    for lo, hi in spans:
        if hi > lo:
            mask |= ((starts < hi) & (ends > lo)).astype(np.int32)
    return mask


def tokenizer_template(tokenizer: Tokenizer, name: str | None = None) -> JinjaChatTemplate:
    """The tokenizer's Hugging Face template (``name``: one of its named templates)."""
    source = tokenizer.chat_template
    if source is None:
        raise ValueError("the tokenizer carries no chat template")
    if name is not None:
        if not isinstance(source, Mapping) or name not in source:
            available = sorted(source) if isinstance(source, Mapping) else ["(one unnamed)"]
            raise ValueError(f"the tokenizer has no chat template {name!r}; it has {available}")
        source = source[name]
    return JinjaChatTemplate(source, dict(tokenizer.named_tokens))


def template_tool_format(template: ChatTemplate) -> ToolCallFormat:
    """The tool-call format of ``template``'s chats (``tool_formats.chat_tool_format``, gin): this
    project's for its own template, else what the Hugging Face source (with named templates, the
    one rendering tools) mentions; ``ValueError`` if it mentions none."""
    source = (
        None if isinstance(template, BuiltinChatTemplate) else getattr(template, "source", None)
    )
    if isinstance(source, Mapping):
        source = source.get("tool_use", source["default"])
    return chat_tool_format(source)


@gin.configurable("chat_template")
def chat_template(tokenizer: Tokenizer, template: str = "auto") -> ChatTemplate:
    """The chat template to use with ``tokenizer``.

    ``template``: ``"auto"`` (the tokenizer's own Hugging Face template if it carries one, else
    the built-in one, also when its own is :data:`BUILTIN_JINJA`, as an export's is),
    ``"builtin"``, ``"tokenizer"`` (its own; an error if it has none), the name
    of one of the tokenizer's named templates, or a Jinja source (anything containing ``{``).
    """
    if template == "builtin" or (
        template == "auto" and tokenizer.chat_template in (None, BUILTIN_JINJA)
    ):
        return BuiltinChatTemplate()
    if template in ("auto", "tokenizer"):
        return tokenizer_template(tokenizer)
    if "{" in template:
        return JinjaChatTemplate(template, dict(tokenizer.named_tokens))
    return tokenizer_template(tokenizer, template)
