"""schemathesis against the OpenAI-compatible server's own OpenAPI document (``GET
/openapi.json``), on loopback, on a tiny model: requests that fit the schema and requests that do
not, for every operation, and not one answer is a 5xx; the server is healthy afterwards with no
engine slot left taken."""

import collections

import httpx
import hypothesis.strategies as st
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from tiny_models import make_model_dir

from agentic_jax.inference.serving.chat_model import ChatModel
from agentic_jax.inference.serving.engine import EngineConfig
from agentic_jax.inference.serving.openai_server import OpenAIServer, ServerLimits

MODEL = "tiny"
EXAMPLES = 25  # per operation and generation mode
# Small limits and a 256-token model keep each generation short; out-of-range asks are 400s.
LIMITS = ServerLimits(max_n=2, max_prompts=2, max_messages=8, max_tools=4)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzzed-model")
    make_model_dir(path, max_seq_len=256)
    # One prefill bucket for every prompt: one compilation.
    engine = EngineConfig(num_slots=4, min_prefill_len=256)
    model = ChatModel.from_checkpoint(path, engine, max_tool_call_tokens=16)
    with OpenAIServer(model, model_name=MODEL, limits=LIMITS) as s:
        yield s
    model.close()


def fuzz(operation, mode, base_url: str, statuses: collections.Counter) -> None:
    """``EXAMPLES`` cases of ``operation`` in ``mode``, each checked for a 5xx.  A body names the
    served model (else nearly every case would stop at the 404 of an unknown model); the path's
    model is the served one half of the time."""

    @given(case=operation.as_strategy(generation_mode=mode), served=st.booleans())
    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def run(case, served):
        if isinstance(case.body, dict):
            case.body["model"] = MODEL
        if served and "model" in case.path_parameters:
            case.path_parameters["model"] = MODEL
        response = case.call_and_validate(
            base_url=base_url, checks=[not_a_server_error], timeout=60
        )
        statuses[operation.label, response.status_code] += 1

    run()


def test_no_request_the_schema_allows_or_forbids_gets_a_server_error(server):
    base_url = server.url.removesuffix("/v1")
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    statuses = collections.Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        for mode in schemathesis.GenerationMode:
            # Only a body can be made invalid: a path's string is a string.
            if mode is schemathesis.GenerationMode.POSITIVE or operation.body:
                fuzz(operation, mode, base_url, statuses)
    labels = {op.label for op in operations}
    assert {"POST /v1/chat/completions", "POST /v1/completions", "GET /health"} <= labels
    assert all(status < 500 for _, status in statuses)
    # The fuzz reached the engine, not only the request validation.
    assert statuses["POST /v1/chat/completions", 200] and statuses["POST /v1/completions", 200]
    assert httpx.get(f"{base_url}/health", timeout=60).status_code == 200
    assert server.requests_generating == 0
