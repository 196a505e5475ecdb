"""Exports other tools use: PEFT loads our LoRA / DoRA adapters and we load PEFT's, with the same
logits; transformers loads the tokenizer, chat template and generation config of an export.

Tiny random Llama models built from their config (nothing downloads); adapters with random
nonzero A and B (and DoRA magnitudes), so a transposed or misplaced factor shows in the logits.
"""

import json

import numpy as np
import pytest
from hf_oracle import TINY, hf_logits, hf_model, load_hf_model, our_logits, random_params
from safetensors.numpy import load_file, save_file

from agentic_jax.data.chat import ToolSpec, render, with_tools
from agentic_jax.data.chat_template import (
    BUILTIN_JINJA,
    BuiltinChatTemplate,
    JinjaChatTemplate,
    chat_template,
)
from agentic_jax.data.documents import write_documents
from agentic_jax.data.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from agentic_jax.models import TransformerConfig
from agentic_jax.models.hf import load_hf_checkpoint, save_hf_checkpoint
from agentic_jax.models.lora import PROJECTIONS, LoRA, LoraConfig
from agentic_jax.models.peft_adapters import load_peft_adapters, save_peft_adapters
from agentic_jax.models.transformer import param_shapes

HF_NAMES = {
    "q": "q_proj",
    "k": "k_proj",
    "v": "v_proj",
    "o": "o_proj",
    "gate": "gate_proj",
    "up": "up_proj",
    "down": "down_proj",
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(HF checkpoint dir, our config, our params) of a tiny random Llama."""
    _, model = hf_model("LlamaConfig", **TINY, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("base")
    model.save_pretrained(path)
    config, params = load_hf_checkpoint(path)
    return path, config, params


def _random_adapters(config, lora_config, seed=0):
    """A, B ~ N(0, 0.3); DoRA magnitudes in [0.5, 1.5] (not the base's norms)."""
    rng = np.random.default_rng(seed)
    shapes = param_shapes(config)["layers"]
    adapters = {}
    for name in lora_config.targets:
        w = shapes[PROJECTIONS[name][0]][name].shape
        n_in, r = 1 + PROJECTIONS[name][1], lora_config.rank
        adapters[name] = {
            "a": rng.normal(0, 0.3, w[:n_in] + (r,)).astype(np.float32),
            "b": rng.normal(0, 0.3, w[:1] + (r,) + w[n_in:]).astype(np.float32),
        }
        if lora_config.variant == "dora":
            adapters[name]["m"] = rng.uniform(0.5, 1.5, w[:1] + w[n_in:]).astype(np.float32)
    return adapters


def _peft_model(path, adapter_dir):
    peft = pytest.importorskip("peft")
    torch, model = load_hf_model(path)
    return torch, peft.PeftModel.from_pretrained(model, adapter_dir).eval()


@pytest.mark.parametrize("variant", ["lora", "dora"])
def test_peft_loads_our_adapters_with_the_same_logits(base, variant, tmp_path):
    path, config, params = base
    lora_config = LoraConfig(rank=3, alpha=5.0, variant=variant, targets=("q", "k", "o", "down"))
    trainable = _random_adapters(config, lora_config)
    save_peft_adapters(tmp_path, trainable, lora_config, config, base_model_name_or_path="tiny")
    torch, peft_model = _peft_model(path, tmp_path)
    ours = our_logits(LoRA(lora_config).model_params(trainable, params), config)
    np.testing.assert_allclose(hf_logits(peft_model, torch), ours, atol=1e-4, rtol=1e-4)
    # and the base alone differs: the adapters took part
    assert not np.allclose(our_logits(params, config), ours, atol=1e-2)

    written = json.loads((tmp_path / "adapter_config.json").read_text())
    assert written["target_modules"] == sorted(HF_NAMES[t] for t in lora_config.targets)
    back, back_config = load_peft_adapters(tmp_path, config)
    assert back_config == lora_config
    for name in trainable:
        for part, value in trainable[name].items():
            np.testing.assert_array_equal(np.asarray(back[name][part]), value)


@pytest.mark.parametrize(
    "options", [{}, {"use_dora": True}, {"use_rslora": True}], ids=["lora", "dora", "rslora"]
)
def test_we_load_peft_adapters_with_the_same_logits(base, options, tmp_path):
    peft = pytest.importorskip("peft")
    path, config, params = base
    torch, model = load_hf_model(path)
    targets = ("q", "v", "o", "gate", "up")
    peft_config = peft.LoraConfig(
        r=4, lora_alpha=6, target_modules=[HF_NAMES[t] for t in targets], **options
    )
    peft_model = peft.get_peft_model(model, peft_config).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(p + torch.randn_like(p) * 0.3)  # B starts at zero, A and m do not
    peft_model.save_pretrained(tmp_path)
    trainable, lora_config = load_peft_adapters(tmp_path, config)
    assert set(trainable) == set(targets)
    assert lora_config.variant == ("dora" if options.get("use_dora") else "lora")
    ours = our_logits(LoRA(lora_config).model_params(trainable, params), config)
    np.testing.assert_allclose(ours, hf_logits(peft_model, torch), atol=1e-4, rtol=1e-4)


def _write_peft_dir(path, config_fields, tensors):
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps(config_fields))
    save_file(tensors, str(path / "adapter_model.safetensors"))


def test_peft_import_names_what_ours_cannot_express(base, tmp_path):
    _, config, _ = base
    lora_config = LoraConfig(rank=2, targets=("q",))
    save_peft_adapters(tmp_path / "ok", _random_adapters(config, lora_config), lora_config, config)
    fields = json.loads((tmp_path / "ok" / "adapter_config.json").read_text())
    tensors = load_file(str(tmp_path / "ok" / "adapter_model.safetensors"))
    layer0 = {k: v for k, v in tensors.items() if ".layers.0." in k}
    cases = {
        "prefix": ({**fields, "peft_type": "PREFIX_TUNING"}, tensors, "peft_type"),
        "bias": ({**fields, "bias": "all"}, tensors, "bias"),
        "pattern": ({**fields, "rank_pattern": {"q_proj": 4}}, tensors, "rank_pattern"),
        "some_layers": (fields, layer0, r"some layers only \(not in \[1\]\)"),
        "unknown": (
            fields,
            {**tensors, "base_model.model.lm_head.lora_A.weight": layer0[next(iter(layer0))]},
            "lm_head",
        ),
    }
    for case, (cfg, ts, message) in cases.items():
        _write_peft_dir(tmp_path / case, cfg, ts)
        with pytest.raises(ValueError, match=message):
            load_peft_adapters(tmp_path / case, config)
    wrong_rank = {**fields, "r": 3}
    _write_peft_dir(tmp_path / "rank", wrong_rank, tensors)
    with pytest.raises(ValueError, match="rank 3"):
        load_peft_adapters(tmp_path / "rank", config)
    with pytest.raises(FileExistsError):
        save_peft_adapters(tmp_path / "ok", {}, lora_config, config)


# A ChatML template with tools, in the style of Qwen2.5's (written here: nothing downloads).
QWEN_STYLE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == "
    "'system' else 'You are helpful.' }}\n\n# Tools\n<tools>\n{%- for tool in tools %}\n"
    "{{ tool | tojson }}\n{%- endfor %}\n</tools><|im_end|>\n{%- elif messages[0]['role'] == "
    "'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}\n"
    "{%- for m in messages %}{%- if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}{%- for call in m.get('tool_calls', []) %}\n<tool_call>\n"
    "{{ call['function'] | tojson }}\n</tool_call>{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3? «quoted»"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"x": 1}}}],
    },
    {"role": "tool", "content": "5"},
]
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
TEXTS = ["plain words", "<|im_start|>user\nhello<|im_end|>", "«ünïcode» and <tool_call>x"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_documents(path / "docs.txt", ["some text to learn merges from: hello world, 2 + 3"])
    return train_tokenizer(path / "tokenizer.json", files=[path / "docs.txt"], vocab_size=300)


def _export(tmp_path, tokenizer, **kwargs):
    config = TransformerConfig(
        vocab_size=320,
        d_model=16,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        d_ff=24,
        max_seq_len=32,
    )
    params = random_params(config)
    save_hf_checkpoint(tmp_path, config, params, tokenizer=tokenizer, **kwargs)
    return config, params


def test_transformers_reads_our_tokenizer_and_generation_config(tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    sampling = {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 20}
    config, params = _export(tmp_path, tokenizer, sampling=sampling)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert hf_tokenizer.encode(text) == tokenizer.encode(text)
        assert hf_tokenizer.decode(tokenizer.encode(text)) == text
    named = (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id)
    assert named == (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)
    added = {t.content: i for i, t in hf_tokenizer.added_tokens_decoder.items() if t.special}
    assert added == tokenizer.special_ids

    generation = transformers.GenerationConfig.from_pretrained(tmp_path)
    im_end = tokenizer.token_id("<|im_end|>")
    assert generation.eos_token_id == [tokenizer.eos_id, im_end]
    assert (generation.bos_token_id, generation.pad_token_id) == (
        tokenizer.bos_id,
        tokenizer.pad_id,
    )
    assert (generation.do_sample, generation.temperature, generation.top_p) == (True, 0.7, 0.9)
    assert generation.max_new_tokens == 20

    torch, model = load_hf_model(tmp_path)
    tokens = np.asarray([tokenizer.encode(TEXTS[1])])
    np.testing.assert_allclose(
        hf_logits(model, torch, tokens), our_logits(params, config, tokens), atol=1e-4, rtol=1e-4
    )


def test_transformers_renders_a_tokenizers_own_chat_template_as_we_do(tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = Tokenizer(tokenizer.backend, chat_template=QWEN_STYLE)
    _export(tmp_path, ours)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    template = chat_template(ours)
    for prompt in (False, True):
        expected = template.render(CONVERSATION, tools=TOOLS, add_generation_prompt=prompt)
        assert "<tools>" in expected and "<tool_call>" in expected
        rendered = hf_tokenizer.apply_chat_template(
            CONVERSATION, tools=TOOLS, add_generation_prompt=prompt, tokenize=False
        )
        assert rendered == expected
        ids = hf_tokenizer.apply_chat_template(
            CONVERSATION, tools=TOOLS, add_generation_prompt=prompt, return_dict=False
        )
        assert (
            list(ids)
            == template.render_ids(
                CONVERSATION, ours, tools=TOOLS, add_generation_prompt=prompt
            ).ids.tolist()
        )
    back = load_tokenizer(tmp_path)
    assert back.chat_template == QWEN_STYLE and back.fingerprint == ours.fingerprint
    assert back.named_tokens == ours.named_tokens


def test_transformers_renders_the_builtin_template_of_our_tokenizer_as_we_do(tokenizer, tmp_path):
    """The project's tokenizer has no template of its own: the export carries ``BUILTIN_JINJA``,
    which transformers renders to ``data.chat``'s text, with the assistant mask of its
    ``{% generation %}`` blocks; loaded back, the tokenizer trains with the Python renderer."""
    transformers = pytest.importorskip("transformers")
    assert tokenizer.chat_template is None
    _export(tmp_path, tokenizer)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    conversation = [*CONVERSATION, {"role": "assistant", "content": 'It is "5".\nDone ✓'}]
    specs = [ToolSpec.from_openai(t) for t in TOOLS]
    for prompt in (False, True):
        # BOS first, as the training ids start (``render_ids``), then ``data.chat``'s text.
        expected = tokenizer.named_tokens["bos_token"] + render(
            with_tools(conversation, specs), add_generation_prompt=prompt
        )
        rendered = hf_tokenizer.apply_chat_template(
            conversation, tools=TOOLS, add_generation_prompt=prompt, tokenize=False
        )
        assert rendered == expected
        out = hf_tokenizer.apply_chat_template(
            conversation,
            tools=TOOLS,
            add_generation_prompt=prompt,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        ours = JinjaChatTemplate(BUILTIN_JINJA, tokenizer.named_tokens).render_ids(
            conversation, tokenizer, tools=TOOLS, add_generation_prompt=prompt
        )
        assert list(out["input_ids"]) == ours.ids.tolist() == tokenizer.encode(expected)
        assert list(out["assistant_masks"]) == ours.assistant_mask.tolist()
        trained = tokenizer.decode([i for i, m in zip(ours.ids, ours.assistant_mask) if m])
        assert trained == (
            '<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call><|im_end|>'
            'It is "5".\nDone ✓<|im_end|>'
        )
    back = load_tokenizer(tmp_path)
    assert back.chat_template == BUILTIN_JINJA
    assert isinstance(chat_template(back), BuiltinChatTemplate)


def test_sampling_defaults_are_checked_before_anything_is_written(tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"unknown sampling fields.*temprature"):
        _export(tmp_path / "a", tokenizer, sampling={"temprature": 0.5})
    with pytest.raises(ValueError, match="needs a tokenizer"):
        _export(tmp_path / "b", None, sampling={"temperature": 0.5})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
