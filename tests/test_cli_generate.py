"""`agentic-jax generate`: a saved model and its tokenizer stream a continuation to stdout."""

import pytest
from tiny_models import make_model_dir

from agentic_jax.cli import main
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.engine import (
    Engine,
    EngineConfig,
    Request,
    default_sampling_params,
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    return (path, *make_model_dir(path, max_seq_len=64))


def test_generate_streams_the_greedy_continuation(workdir, capsys):
    path, config, params, tokenizer = workdir
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(path),
                "--prompt",
                "The cat",
                "--no-chat",
                "--temperature",
                "0",
                "--max_tokens",
                "8",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    engine = Engine(params, config, EngineConfig(num_slots=1), eos_id=tokenizer.eos_id)
    [done] = engine.generate(
        [
            Request(
                tokenizer.encode("The cat", add_bos=True),
                SamplingParams(temperature=0.0, max_tokens=8),
            )
        ]
    )
    want = tokenizer.decode(done.tokens, skip_special_tokens=True)
    assert len(done.tokens) == 8 and want.strip()
    assert printed == want + "\n"


def test_generate_applies_the_chat_template_and_gin_defaults(workdir, capsys):
    path, *_ = workdir
    # The tokenizer has ChatML tokens, so the prompt becomes a user turn; a native model directory
    # with the tokenizer beside it loads too.
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(path / "model"),
                "--prompt",
                "Hi",
                "--seed",
                "3",
                "--gin_param",
                "default_sampling_params.max_tokens=5",
                "--gin_param",
                "EngineConfig.watermark=0.05",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip()
    assert default_sampling_params().max_tokens == 5 and EngineConfig().watermark == 0.05
    with pytest.raises(ValueError, match="block_sise"):
        main(
            [
                "generate",
                "--checkpoint",
                str(path),
                "--prompt",
                "Hi",
                "--gin_param",
                "EngineConfig.block_sise=8",
            ]
        )
