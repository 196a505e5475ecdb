"""`agentic-jax generate`: a saved model and its tokenizer stream a continuation to stdout."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax.cli import main
from agentic_jax.data.tokenizer import SPECIAL_TOKENS, train_tokenizer
from agentic_jax.inference.engine import Engine, EngineConfig, Request, default_sampling_params
from agentic_jax.inference.sampling import SamplingParams
from agentic_jax.models import TransformerConfig, param_shapes
from agentic_jax.models.export import save_model

CORPUS = os.path.join(os.path.dirname(__file__), "data", "tiny_corpus.txt")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A training workdir's layout: ``model/`` and ``tokenizer.json``."""
    path = tmp_path_factory.mktemp("run")
    tokenizer = train_tokenizer(path / "tokenizer.json", files=[CORPUS], vocab_size=300)
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2,
                               n_kv_heads=1, head_dim=8, d_ff=32, max_seq_len=64)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.normal(0.0, 0.5, s.shape).astype(s.dtype),
                          param_shapes(config))
    # Special tokens get zero logits (tied embeddings), so greedy decoding prints plain text.
    params["embed"][:len(SPECIAL_TOKENS)] = 0.0
    params = jax.tree.map(jnp.asarray, params)
    save_model(path / "model", config, params)
    return path, config, params, tokenizer


def test_generate_streams_the_greedy_continuation(workdir, capsys):
    path, config, params, tokenizer = workdir
    assert main(["generate", "--checkpoint", str(path), "--prompt", "The cat", "--no-chat",
                 "--temperature", "0", "--max_tokens", "8"]) == 0
    printed = capsys.readouterr().out
    engine = Engine(params, config, EngineConfig(num_slots=1), eos_id=tokenizer.eos_id)
    [done] = engine.generate([Request(tokenizer.encode("The cat", add_bos=True),
                                      SamplingParams(temperature=0.0, max_tokens=8))])
    want = tokenizer.decode(done.tokens, skip_special_tokens=True)
    assert len(done.tokens) == 8 and want.strip()
    assert printed == want + "\n"


def test_generate_applies_the_chat_template_and_gin_defaults(workdir, capsys):
    path, *_ = workdir
    # The tokenizer has ChatML tokens, so the prompt becomes a user turn; a native model directory
    # with the tokenizer beside it loads too.
    assert main(["generate", "--checkpoint", str(path / "model"), "--prompt", "Hi", "--seed", "3",
                 "--gin_param", "default_sampling_params.max_tokens=5",
                 "--gin_param", "EngineConfig.watermark=0.05"]) == 0
    assert capsys.readouterr().out.strip()
    assert default_sampling_params().max_tokens == 5 and EngineConfig().watermark == 0.05
    with pytest.raises(ValueError, match="block_sise"):
        main(["generate", "--checkpoint", str(path), "--prompt", "Hi",
              "--gin_param", "EngineConfig.block_sise=8"])
