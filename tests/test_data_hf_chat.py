"""Hugging Face tokenizers and chat templates, against transformers as the oracle.

The three templates below are written for these tests in the style of their families (ChatML
with tools as Qwen2.5 writes it, Llama 3.1, Mistral); the tokenizer is a tiny byte-level BPE fit
here and saved by transformers' ``save_pretrained``.
"""

import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import CORPUS
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as Backend

from agentic_jax.data.chat import Message, ToolCall, ToolSpec, render, render_ids
from agentic_jax.data.chat_template import (
    BuiltinChatTemplate,
    JinjaChatTemplate,
    chat_template,
)
from agentic_jax.data.tokenizer import load_tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

CHATML = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- 'Be helpful.' }}{%- endif %}
{{- '\\n\\n# Tools\\n\\nFunction signatures, one per line, inside <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' + tool | tojson }}
{%- endfor %}
{{- '\\n</tools>\\n\\nCall one with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
  {%- if message.role == 'system' and loop.first %}{%- continue %}{%- endif %}
  {%- if message.role == 'user' %}
    {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
  {%- elif message.role == 'assistant' %}
    {{- '<|im_start|>assistant\\n' }}{#GO#}{{- message.content }}
    {%- for call in message.tool_calls %}
      {%- set fn = call.function if call.function is defined else call %}
      {%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}
      {{- '<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' }}
      {%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}
      {{- '}\\n</tool_call>' }}
    {%- endfor %}
    {{- '<|im_end|>' }}{#GC#}{{- '\\n' }}
  {%- elif message.role == 'tool' %}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
# The same template with {% generation %} around each assistant turn (the comments mark where).
CHATML_MARKED = CHATML.replace("{#GO#}", "{% generation %}").replace(
    "{#GC#}", "{% endgeneration %}"
)

LLAMA31 = """\
{{- bos_token }}
{%- if date_string is not defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}
{%- if messages[0].role == 'system' %}
  {%- set system_message = messages[0].content | trim %}
  {%- set messages = messages[1:] %}
{%- else %}
  {%- set system_message = '' %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{%- if tools is not none %}{{- 'Environment: ipython\\n' }}{%- endif %}
{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}
{{- system_message + '<|eot_id|>' }}
{%- if tools is not none %}
  {%- if messages | length == 0 %}{{- raise_exception('tools need a first user message') }}{%- endif %}
  {%- set first_user = messages[0].content | trim %}
  {%- set messages = messages[1:] %}
  {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}
  {{- 'Answer with a JSON call {"name": function name, "parameters": its arguments} to one of:\\n\\n' }}
  {%- for tool in tools %}{{- tool | tojson(indent=4) + '\\n\\n' }}{%- endfor %}
  {{- first_user + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
  {%- if message.role in ['ipython', 'tool'] %}
    {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}
    {%- if message.content is mapping %}{{- message.content | tojson }}
    {%- else %}{{- message.content }}{%- endif %}
    {{- '<|eot_id|>' }}
  {%- elif message.tool_calls %}
    {%- if message.tool_calls | length != 1 %}{{- raise_exception('one tool call per turn') }}{%- endif %}
    {%- set fn = message.tool_calls[0].function %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
    {{- '{"name": "' + fn.name + '", "parameters": ' + fn.arguments | tojson + '}<|eom_id|>' }}
  {%- else %}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}
    {{- message.content | trim + '<|eot_id|>' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

MISTRAL = """\
{%- if messages[0].role == 'system' %}
  {%- set system_message = messages[0].content %}
  {%- set loop_messages = messages[1:] %}
{%- else %}
  {%- set loop_messages = messages %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}
{{- bos_token }}
{%- for message in loop_messages %}
  {%- if message.role == 'user' %}
    {%- if tools is not none and message == user_messages[-1] %}
      {{- '[AVAILABLE_TOOLS] [' }}
      {%- for tool in tools %}{{- tool | tojson }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}
      {{- '][/AVAILABLE_TOOLS]' }}
    {%- endif %}
    {%- if message == user_messages[-1] and system_message is defined %}
      {{- '[INST] ' + system_message + '\\n\\n' + message.content + '[/INST]' }}
    {%- else %}
      {{- '[INST] ' + message.content + '[/INST]' }}
    {%- endif %}
  {%- elif message.role == 'assistant' and message.tool_calls %}
    {{- '[TOOL_CALLS] [' }}
    {%- for call in message.tool_calls %}
      {{- {'name': call.function.name, 'arguments': call.function.arguments, 'id': call.id} | tojson }}
      {%- if not loop.last %}{{- ', ' }}{%- endif %}
    {%- endfor %}
    {{- ']' + eos_token }}
  {%- elif message.role == 'assistant' %}
    {{- ' ' + message.content + eos_token }}
  {%- elif message.role == 'tool' %}
    {{- '[TOOL_RESULTS] {"content": ' + message.content | tojson }}
    {{- ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
  {%- else %}
    {{- raise_exception('roles are user, assistant and tool') }}
  {%- endif %}
{%- endfor %}
"""

SPECIALS = [
    "<s>",
    "</s>",
    "<unk>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
]
NON_SPECIAL = ["<tool_call>", "</tool_call>"]  # added tokens as Qwen has them: special=False

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Weather in a city, «today».",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def _hf_tokenizer(template, bos="<s>", eos="</s>"):
    backend = Backend(models.BPE(unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = ["the weather in Oslo is cold today", "call a tool", CHATML, LLAMA31, MISTRAL]
    backend.train_from_iterator(corpus * 3, trainer)
    backend.add_tokens([AddedToken(t, special=False) for t in NON_SPECIAL])
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, unk_token="<unk>"
    )
    hf.chat_template = template
    return hf


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """{family: (transformers tokenizer, ours loaded from its save_pretrained directory)}."""
    out = {}
    for name, template, eos in (
        ("chatml", CHATML, "<|im_end|>"),
        ("llama", LLAMA31, "<|eot_id|>"),
        ("mistral", MISTRAL, "</s>"),
        ("marked", CHATML_MARKED, "<|im_end|>"),
    ):
        bos = "<|begin_of_text|>" if name == "llama" else "<s>"
        hf = _hf_tokenizer(template, bos=bos, eos=eos)
        path = tmp_path_factory.mktemp(name)
        hf.save_pretrained(path)
        out[name] = hf, load_tokenizer(path)
    return out


def _conversation(user, answer, argument, with_tool):
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": user},
    ]
    if with_tool:
        conversation += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call00001",
                        "type": "function",
                        "function": {"name": "weather", "arguments": {"city": argument}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call00001", "content": '{"temp_c": 3}'},
        ]
    return [
        *conversation,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Thanks"},
    ]


text = st.text(st.characters(codec="utf-8", exclude_characters="\r"), min_size=1, max_size=12)


@settings(max_examples=15, deadline=None)
@given(
    family=st.sampled_from(["chatml", "llama", "mistral"]),
    user=text,
    answer=text,
    argument=st.sampled_from(['Oslo "old town"', "Zürich\nnorth", "東京"]),
    with_tool=st.booleans(),
    add_generation_prompt=st.booleans(),
)
def test_templates_render_and_tokenize_like_transformers(
    loaded, family, user, answer, argument, with_tool, add_generation_prompt
):
    hf, ours = loaded[family]
    template = chat_template(ours)
    assert isinstance(template, JinjaChatTemplate)
    messages = _conversation(user, answer, argument, with_tool)
    tools = TOOLS if with_tool else None
    extra = {"date_string": "26 Jul 2024"} if family == "llama" else {}
    kwargs = dict(tools=tools, add_generation_prompt=add_generation_prompt, **extra)
    expected = hf.apply_chat_template(messages, tokenize=False, **kwargs)
    assert template.render(messages, **kwargs) == expected
    expected_ids = hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    assert template.encode(messages, ours, **kwargs) == list(expected_ids)


def test_project_messages_and_tool_specs_render_as_openai_dicts(loaded):
    hf, ours = loaded["chatml"]
    messages = [
        Message("user", "Weather?"),
        Message("assistant", "", (ToolCall("weather", {"city": "Oslo"}),)),
        Message("tool", "3"),
    ]
    spec = ToolSpec.from_openai(TOOLS[0])
    dicts = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
            ],
        },
        {"role": "tool", "content": "3"},
    ]
    expected = hf.apply_chat_template(dicts, tools=TOOLS, tokenize=False)
    assert chat_template(ours).render(messages, tools=[spec]) == expected


@settings(max_examples=10, deadline=None)
@given(answer=text, with_tool=st.booleans())
def test_generation_markers_give_transformers_assistant_mask(loaded, answer, with_tool):
    hf, ours = loaded["marked"]
    messages = _conversation("Hi", answer, "Oslo", with_tool)
    tools = TOOLS if with_tool else None
    expected = hf.apply_chat_template(
        messages, tools=tools, return_dict=True, return_assistant_tokens_mask=True
    )
    rendered = chat_template(ours).render_ids(messages, ours, tools=tools)
    assert rendered.ids.tolist() == expected["input_ids"]
    assert rendered.assistant_mask.tolist() == expected["assistant_masks"]
    assert rendered.assistant_mask.any()


@settings(max_examples=10, deadline=None)
@given(answer=text, with_tool=st.booleans())
def test_fallback_mask_covers_exactly_the_assistant_turns(loaded, answer, with_tool):
    """Without markers, the prefix rule finds the same spans the marked twin of the template
    declares: each assistant turn's text and its <|im_end|>, nothing else."""
    hf_marked, _ = loaded["marked"]
    _, ours = loaded["chatml"]
    messages = _conversation("Hi", answer, "Oslo", with_tool)
    tools = TOOLS if with_tool else None
    template = chat_template(ours)
    text, spans = template.render_with_spans(messages, tools=tools)
    covered = [text[a:b] for a, b in spans]
    call = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert covered == [call + "<|im_end|>"] * with_tool + [answer + "<|im_end|>"]
    expected = hf_marked.apply_chat_template(
        messages, tools=tools, return_dict=True, return_assistant_tokens_mask=True
    )
    assert (
        template.render_ids(messages, ours, tools=tools).assistant_mask.tolist()
        == (expected["assistant_masks"])
    )


def test_fallback_mask_of_llama_style_and_a_template_that_reorders(loaded):
    _, ours = loaded["llama"]
    messages = _conversation("Hi", "Cold.", "Oslo", False)
    text, spans = chat_template(ours).render_with_spans(messages, date_string="1 Jan 2025")
    assert [text[a:b] for a, b in spans] == ["Cold.<|eot_id|>"]
    _, mistral = loaded["mistral"]  # the system message moves into the last user turn
    with pytest.raises(ValueError, match="generation"):
        chat_template(mistral).render_with_spans(messages)


def test_template_errors_and_sandbox(loaded):
    _, ours = loaded["llama"]
    with pytest.raises(ValueError, match="tools need a first user message"):
        chat_template(ours).render([{"role": "system", "content": "x"}], tools=TOOLS)
    escape = JinjaChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError, match="refused"):
        escape.render([{"role": "user", "content": "x"}])
    assert JinjaChatTemplate("{{ {'k': 'é'} | tojson(indent=2) }}").render([{}]) == (
        json.dumps({"k": "é"}, ensure_ascii=False, indent=2)
    )


def test_loaded_tokenizer_matches_transformers_ids_and_special_tokens(loaded):
    hf, ours = loaded["llama"]
    sample = "<|begin_of_text|>hi<|eot_id|> <tool_call>x</tool_call>[INST] weather"
    assert ours.encode(sample) == hf.encode(sample, add_special_tokens=False)
    assert ours.encode(sample, add_bos=ours.add_bos_token, add_eos=ours.add_eos_token) == (
        hf.encode(sample)
    )
    assert (ours.bos_id, ours.eos_id, ours.unk_id) == (
        hf.bos_token_id,
        hf.eos_token_id,
        hf.unk_token_id,
    )
    assert ours.named_tokens["eos_token"] == "<|eot_id|>"
    assert set(ours.special_ids) == set(SPECIALS)
    assert set(ours.added_ids) == set(SPECIALS) | set(NON_SPECIAL)
    assert ours.added_ids == {t: hf.convert_tokens_to_ids(t) for t in ours.added_ids}
    assert ours.chat_template == LLAMA31


def test_add_bos_token_and_named_templates_from_the_config(tmp_path):
    hf = _hf_tokenizer({"default": CHATML, "tool_use": LLAMA31})
    hf.add_bos_token = True
    hf.add_eos_token = True
    hf.save_pretrained(tmp_path)  # transformers 5 writes them into the post-processor
    ours = load_tokenizer(tmp_path)
    assert (ours.add_bos_token, ours.add_eos_token) == (True, True)
    assert ours.encode("hi", add_bos=ours.add_bos_token, add_eos=ours.add_eos_token) == (
        hf.encode("hi")
    )
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    # Flags in the config win (as in the classes that rebuild their post-processor from them,
    # e.g. Llama's); one given alone leaves the other off.
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    flagged = load_tokenizer(tmp_path)
    assert (flagged.add_bos_token, flagged.add_eos_token) == (True, False)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert ours.chat_template == {"default": CHATML, "tool_use": LLAMA31}
    # The legacy form: templates as a list in tokenizer_config.json.
    (tmp_path / "chat_template.jinja").unlink()
    shutil.rmtree(tmp_path / "additional_chat_templates")
    config["chat_template"] = [{"name": "default", "template": CHATML}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(tmp_path).chat_template == {"default": CHATML}
    template = chat_template(ours)
    messages = [{"role": "user", "content": "hi"}]
    kwargs = {"date_string": "1 Jan 2025"}
    for tools in (None, TOOLS):
        assert template.render(messages, tools=tools, **kwargs) == hf.apply_chat_template(
            messages, tools=tools, tokenize=False, **kwargs
        )
    assert chat_template(ours, "tool_use").render(messages, **kwargs).startswith("<s><|start")
    with pytest.raises(ValueError, match="no chat template 'other'"):
        chat_template(ours, "other")


@pytest.fixture(scope="module")
def project_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("own") / "tokenizer.json"
    return train_tokenizer(path, files=[CORPUS], vocab_size=300)


def test_project_tokenizer_gets_the_builtin_template(project_tokenizer):
    template = chat_template(project_tokenizer)
    assert isinstance(template, BuiltinChatTemplate)
    messages = [Message("user", "2+2?"), Message("assistant", "4")]
    spec = ToolSpec.from_openai(TOOLS[0])
    from agentic_jax.data.chat import with_tools

    assert template.render(messages, tools=[spec]) == render(with_tools(messages, [spec]))
    ours, reference = (
        template.render_ids(messages, project_tokenizer),
        render_ids(messages, project_tokenizer),
    )
    np.testing.assert_array_equal(ours.ids, reference.ids)
    np.testing.assert_array_equal(ours.assistant_mask, reference.assistant_mask)
    with pytest.raises(ValueError, match="carries no chat template"):
        chat_template(project_tokenizer, "tokenizer")
    with pytest.raises(ValueError, match="no variables"):
        template.render(messages, date_string="x")


def test_chat_model_chats_through_a_hugging_face_template(loaded):
    import jax

    from agentic_jax.inference.decoding.sampling import SamplingParams
    from agentic_jax.inference.errors import RequestError
    from agentic_jax.inference.serving.chat_model import ChatModel
    from agentic_jax.inference.serving.engine import EngineConfig
    from agentic_jax.models import TransformerConfig, init_params

    hf, ours = loaded["chatml"]  # no <tool_call> special token: refused by the old ChatModel
    config = TransformerConfig(
        vocab_size=ours.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
        head_dim=8, d_ff=32, max_seq_len=128,
    )  # fmt: skip
    model = ChatModel(
        init_params(config, jax.random.key(0)), config, ours, EngineConfig(num_slots=1)
    )
    try:
        messages = [Message("system", "Be brief."), Message("user", "Hi")]
        prompt = model.prompt_ids(messages)
        dicts = [{"role": m.role, "content": m.content} for m in messages]
        assert prompt == hf.apply_chat_template(
            dicts, add_generation_prompt=True, return_dict=False
        )
        reply = model.chat(messages, params=SamplingParams(temperature=0.0, max_tokens=3))
        assert reply.prompt_tokens == len(prompt) and 0 < reply.completion_tokens <= 3
        with pytest.raises(RequestError, match="tool_choice names 'clock'"):
            model.chat(messages, [ToolSpec.from_openai(TOOLS[0])], tool_choice={"name": "clock"})
    finally:
        model.close()
