"""The compression job (``post_training.compress``) from its shipped configs, and every consumer
loading what it writes: ``load_checkpoint``, ``agentic-jax generate``, the serving engine, and the
trainers (full fine-tuning refuses it, LoRA adapters train over it)."""

import json

import gin
import jax
import numpy as np
import pytest
from tiny_models import make_model_dir

from agentic_jax import config as gin_config
from agentic_jax.cli import main
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.chat_model import ChatModel
from agentic_jax.inference.serving.engine import EngineConfig
from agentic_jax.models import forward
from agentic_jax.models.awq import awq_params
from agentic_jax.models.calibration import calibration_tokens
from agentic_jax.models.export import load_checkpoint, load_model, save_model
from agentic_jax.models.lora import LoRA, LoraConfig
from agentic_jax.models.pruning import prune_params
from agentic_jax.models.quantization import is_quantized, param_bytes, quantize_params
from agentic_jax.post_training.compress import compress_model
from agentic_jax.training.update import FullFinetune

SMALL = ["calibration_rows=2", "heldout_rows=2", "length=32", "grid=2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    return (path, *make_model_dir(path, max_seq_len=64))


def _compress(config_name, init_from, out):
    bindings = [f"compress_model.init_from='{init_from}'"] + [f"compress_model.{b}" for b in SMALL]
    argv = ["train", "--gin_file", config_name, "--workdir", str(out)]
    assert main(argv + [a for b in bindings for a in ("--gin_param", b)]) == 0


def _same_tree(a, b):
    """Equal structure (QuantizedWeight metadata included) and bit-identical arrays."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


@pytest.fixture(scope="module")
def awq_run(run, tmp_path_factory):
    path, config, params, tokenizer = run
    out = tmp_path_factory.mktemp("awq")
    _compress("compress_awq_int4", path, out)
    calibration = calibration_tokens(tokenizer, rows=2, length=32)
    return out, awq_params(params, config, calibration, "int4", group_size=32, grid=2)


def test_awq_int4_job_writes_a_model_that_loads_back_equal(run, awq_run):
    _, config, params, _ = run
    out, expected = awq_run
    loaded_config, loaded, _ = load_checkpoint(out)
    assert loaded_config == config and is_quantized(loaded["layers"]["attn"]["q"])
    _same_tree(loaded, expected)
    tokens = np.arange(20, dtype=np.int32).reshape(2, 10)
    np.testing.assert_array_equal(
        forward(loaded, config, tokens), forward(jax.device_put(expected), config, tokens)
    )
    report = json.loads((out / "compression_report.json").read_text())
    assert {"bytes_before", "bytes_after", "perplexity_before", "perplexity_after"} <= set(report)
    assert report["method"] == "awq" and report["fmt"] == "int4" and report["group_size"] == 32
    assert (report["bytes_before"], report["bytes_after"]) == (
        param_bytes(params),
        param_bytes(expected),
    )
    assert report["perplexity_delta"] == report["perplexity_after"] - report["perplexity_before"]
    assert report["calibration_tokens"] == report["heldout_tokens"] == 64
    assert "compress_model.method = 'awq'" in (out / "operative_config.gin").read_text()


def test_generate_and_serve_from_the_compressed_model(awq_run, capsys):
    out, _ = awq_run  # loads bit-identical to the in-memory model (the test above)
    argv = ["generate", "--checkpoint", str(out), "--prompt", "The cat", "--no-chat"]
    assert main(argv + ["--temperature", "0", "--max_tokens", "6"]) == 0
    printed = capsys.readouterr().out
    model = ChatModel.from_checkpoint(out, EngineConfig(num_slots=1))  # what `serve` runs
    try:
        served = model.complete("The cat", SamplingParams(temperature=0.0, max_tokens=6))
    finally:
        model.close()
    assert served.completion_tokens == 6 and printed == served.text + "\n"


def test_wanda_job_writes_a_float_2_4_sparse_model(run, tmp_path):
    path, config, params, tokenizer = run
    _compress("prune_wanda_2_4", path, tmp_path)
    _, loaded = load_model(tmp_path / "model")
    calibration = calibration_tokens(tokenizer, rows=2, length=32)
    _same_tree(loaded, prune_params(params, config, "wanda", calibration))
    assert not (tmp_path / "model" / "quantization.json").exists()
    report = json.loads((tmp_path / "compression_report.json").read_text())
    assert report["projection_sparsity"] == 0.5 and report["bytes_after"] == report["bytes_before"]


@pytest.mark.parametrize("name, fmt", [("compress_int8", "int8"), ("compress_nf4", "nf4")])
def test_the_other_shipped_configs_bind_the_job(name, fmt):
    gin_config.parse([name], ["compress_model.init_from='elsewhere'"])
    try:
        assert gin.query_parameter("run_job.job").scoped_configurable_fn is compress_model
        assert gin.query_parameter("compress_model.fmt") == fmt
        assert gin.query_parameter("compress_model.method") == "rtn"
    finally:
        gin.clear_config()


def test_an_nf4_model_saves_and_loads_back_bit_identical(run, tmp_path):
    _, config, params, _ = run  # float8 double-quantised scales, two codes per byte
    quantized = quantize_params(params, config, "nf4", group_size=16)
    save_model(tmp_path / "m", config, quantized)
    _same_tree(load_model(tmp_path / "m")[1], quantized)


def test_full_finetuning_refuses_a_compressed_model_and_lora_trains_over_it(run):
    _, config, params, _ = run
    base = quantize_params(params, config, "nf4", group_size=16)
    with pytest.raises(ValueError, match="QLoRA"):
        FullFinetune().init(base)
    lora = LoRA(LoraConfig(rank=2, targets=("q", "v")))
    adapters = lora.init(base, jax.random.key(0))  # B = 0: the policy starts as the base
    tokens = np.arange(8, dtype=np.int32)[None]
    np.testing.assert_allclose(
        forward(lora.model_params(adapters, lora.frozen(base)), config, tokens),
        forward(base, config, tokens),
        atol=1e-6,
    )
    # RLConfig.sampler_quantization leaves weights that are quantised already as they are.
    _same_tree(quantize_params(base, config, "int8"), base)


def test_compress_model_rejects_bad_settings(run, awq_run, tmp_path):
    path, *_ = run
    with pytest.raises(ValueError, match="method='gptq'"):
        compress_model(str(tmp_path), init_from=str(path), method="gptq")
    with pytest.raises(ValueError, match="fmt=None"):
        compress_model(str(tmp_path), init_from=str(path), method="awq", fmt=None)
    with pytest.raises(ValueError, match="compressed already"):
        compress_model(str(tmp_path), init_from=str(awq_run[0]))
