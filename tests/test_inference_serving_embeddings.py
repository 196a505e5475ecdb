"""``/v1/embeddings`` through the official ``openai`` client, over a tiny retrieval encoder built
here (random trunk, a projection, two Matryoshka prefixes) and served by the ``serve`` verb's
adapter: the values are the encoder's own, as floats and as base64, ``dimensions`` cuts a
trained prefix, and without an embedder the route is a 404 that says how to give one."""

import base64
import json

import jax
import numpy as np
import pytest
import test_serving_asgi
from tiny_models import make_model_dir

from agentic_jax.cli import EncoderEmbedder, _parser
from agentic_jax.inference.serving.openai_server import OpenAIServer
from agentic_jax.retrieval.encoders import Encoder, EncoderConfig, init_encoder

openai = pytest.importorskip("openai")

MODEL = "tiny"
EMBEDDER = "tiny-encoder"
TEXTS = ["The cat sat.", "A dog ran far away", ""]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    config, trunk, tokenizer = make_model_dir(tmp_path_factory.mktemp("encoder"), max_seq_len=64)
    settings = EncoderConfig(dim=8, query_length=16, passage_length=16)
    params = init_encoder(trunk, config, settings, jax.random.key(0))
    return Encoder(config, settings, params, tokenizer, dims=(4, 8))


@pytest.fixture(scope="module")
def server(encoder):
    embedder = EncoderEmbedder(encoder, EMBEDDER)
    with OpenAIServer(test_serving_asgi.Echo(), model_name=MODEL, embedder=embedder) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def test_embeddings_are_the_encoders_own_as_floats_and_base64(client, encoder):
    expected = encoder.encode_passages(TEXTS)
    # The client asks for base64 unless told otherwise, and decodes it to floats itself.
    for extra in ({}, {"encoding_format": "float"}):
        reply = client.embeddings.create(model=EMBEDDER, input=TEXTS, **extra)
        assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == EMBEDDER
        got = np.asarray([d.embedding for d in reply.data], np.float32)
        np.testing.assert_array_equal(got, expected)
    raw = client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="base64")
    got = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in raw.data])
    np.testing.assert_array_equal(got, expected)
    one = client.embeddings.create(model=EMBEDDER, input=TEXTS[0])
    np.testing.assert_array_equal(np.asarray(one.data[0].embedding, np.float32), expected[0])
    _, mask = encoder.rows(TEXTS, query=False)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == int(mask.sum())
    assert EMBEDDER in [m.id for m in client.models.list().data]


def test_dimensions_cut_a_trained_matryoshka_prefix(client, encoder):
    reply = client.embeddings.create(model=EMBEDDER, input=TEXTS, dimensions=4)
    got = np.asarray([d.embedding for d in reply.data], np.float32)
    np.testing.assert_allclose(got, encoder.encode_passages(TEXTS, dim=4), rtol=1e-6, atol=1e-6)
    for dimensions in (3, 16):  # no trained prefix; wider than the encoder
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=EMBEDDER, input=TEXTS, dimensions=dimensions)
        assert refused.value.param == "dimensions" and "[4]" in refused.value.message


@pytest.mark.parametrize(
    "change, param",
    [
        ({"input": [1, 2]}, "input"),  # token ids are not taken
        ({"input": []}, "input"),
        ({"encoding_format": "int8"}, "encoding_format"),
        ({"user": "me"}, "user"),
    ],
)
def test_bad_embedding_requests_are_400s_naming_the_field(server, change, param):
    body = {"model": EMBEDDER, "input": "hi", **change}
    status, _, raw = test_serving_asgi.request(server, "POST", "/v1/embeddings", body)
    error = json.loads(raw)["error"]
    assert status == 400 and error["param"].split(".")[0] == param


def test_without_an_embedder_the_route_is_a_404_saying_how_to_enable_it():
    with OpenAIServer(test_serving_asgi.Echo(), model_name=MODEL) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.NotFoundError) as missing:
            client.embeddings.create(model=EMBEDDER, input="hi")
        assert missing.value.code == "embeddings_not_configured"
        assert "--embedding_checkpoint" in missing.value.message
        assert [m.id for m in client.models.list().data] == [MODEL]


def test_the_serve_verb_takes_an_embedding_checkpoint():
    args = _parser().parse_args(["serve", "--checkpoint", "m", "--embedding_checkpoint", "e"])
    assert args.embedding_checkpoint == "e"


def test_a_late_interaction_encoder_is_refused(encoder):
    tokens = Encoder(
        encoder.config, EncoderConfig(pooling="tokens"), encoder.params, encoder.tokenizer, (16,)
    )
    with pytest.raises(ValueError, match="late-interaction"):
        EncoderEmbedder(tokens, EMBEDDER)
