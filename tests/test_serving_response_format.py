"""``response_format`` and log-probabilities in ``ChatModel`` on a tiny random model: replies
under hypothesis-generated JSON schemas parse and validate, ``json_object``'s automaton takes
any object and nothing else, automata are cached per schema, schemas that cannot be enforced are
refused by name, and the logprobs come out in the chat API's shape (checked by the ``openai``
client's own model)."""

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import make_model_dir

from agentic_jax.data.chat import Message, ToolSpec
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.chat_model import ChatModel, response_schema
from agentic_jax.inference.serving.engine import EngineConfig

openai = pytest.importorskip("openai")

MESSAGES = [Message("user", "Reply in JSON.")]
# Every schema below is bounded (no unbounded repetition), so its automaton allows only the end
# of the turn after at most a few hundred bytes: a reply always ends within MAX_TOKENS.
MAX_TOKENS = 320


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("json-model")
    make_model_dir(path, max_seq_len=512)
    chat = ChatModel.from_checkpoint(path, EngineConfig(num_slots=2, min_prefill_len=64))
    yield chat
    chat.close()


def _json_schema(schema, name="reply", strict=True):
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": schema, "strict": strict},
    }


LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.integers(0, 4).map(lambda n: {"type": "string", "maxLength": n}),
    st.lists(st.sampled_from(["x", "yes", 7, None]), min_size=1, max_size=3, unique=True).map(
        lambda values: {"enum": values}
    ),
    st.sampled_from(["on", 3, False]).map(lambda value: {"const": value}),
)


def _objects(children):
    def build(properties, required_flags):
        names = sorted(properties)
        return {
            "type": "object",
            "properties": properties,
            "required": [n for n, keep in zip(names, required_flags) if keep],
            "additionalProperties": False,
        }

    return st.dictionaries(
        st.sampled_from(["a", "b", "id"]), children, min_size=1, max_size=2
    ).flatmap(
        lambda props: st.lists(st.booleans(), min_size=len(props), max_size=len(props)).map(
            lambda flags: build(props, flags)
        )
    )


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        _objects(children),
        children.map(lambda items: {"type": "array", "items": items, "maxItems": 2}),
    ),
    max_leaves=4,
).filter(lambda s: s.get("type") == "object") | _objects(LEAVES)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, seed=st.integers(0, 2**16))
def test_replies_under_a_json_schema_parse_and_validate(model, schema, seed):
    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=seed)
    reply = model.chat(MESSAGES, params=params, response_format=_json_schema(schema))
    assert reply.finish_reason == "stop", reply
    jsonschema.validate(json.loads(reply.text), schema)


def _walk(constraint, tokens) -> int | None:
    """The automaton's state after ``tokens``, or ``None`` at the first token it refuses."""
    state = int(constraint.initial)
    for token in tokens:
        if not constraint.allowed[state, token]:
            return None
        state = int(constraint.next_state[state, token])
    return state


def test_json_object_takes_objects_two_deep_and_nothing_else(model):
    constraint = model._schema_constraint(response_schema({"type": "json_object"}))
    for text in ('{"a": [1, "b", null], "c": {"d": true}}', "{}", '{"x": -2.5e+3}'):
        state = _walk(constraint, model.tokenizer.encode(text))
        assert state is not None and constraint.final[state], text
    for text in ("[1]", '"a"', "3", '{"a" 1}', '{"a": {"b": {"c": 1}}}'):
        state = _walk(constraint, model.tokenizer.encode(text))
        assert state is None or not constraint.final[state], text
    reply = model.chat(
        MESSAGES,
        params=SamplingParams(temperature=0.0, max_tokens=40),
        response_format={"type": "json_object"},
    )
    assert _walk(constraint, [t.token for t in reply.logprobs]) is not None  # all under it
    if reply.finish_reason == "stop":
        assert isinstance(json.loads(reply.text), dict)


def test_text_format_is_plain_chat_and_automata_are_cached(model):
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    plain = model.chat(MESSAGES, params=greedy)
    assert model.chat(MESSAGES, params=greedy, response_format={"type": "text"}) == plain
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    reordered = {"required": ["a"], "properties": {"a": {"type": "boolean"}}, "type": "object"}
    assert model._schema_constraint(schema) is model._schema_constraint(reordered)


@pytest.mark.parametrize(
    ("response_format", "match"),
    [
        ({"type": "xml"}, "response_format.type"),
        ("json", "must be an object"),
        ({"type": "json_schema"}, "json_schema must be an object"),
        (_json_schema({"type": "object"}, name=""), "name"),
        (_json_schema({"type": "object"}, strict="yes"), "strict"),
        (_json_schema({"type": "foo"}), "not a valid JSON schema"),
        (
            _json_schema(
                {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}}
            ),
            r"'maximum' \(at #/properties/n\)",
        ),
        (_json_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
        (_json_schema({"type": "string", "format": "weird"}), "cannot be constrained"),
    ],
)
def test_formats_that_cannot_be_enforced_are_refused_by_name(model, response_format, match):
    with pytest.raises(RequestError, match=match):
        model.chat(MESSAGES, response_format=response_format)


def test_a_json_reply_cannot_be_combined_with_callable_tools(model):
    specs = [ToolSpec("f", "A tool.", {"type": "object", "properties": {}})]
    with pytest.raises(RequestError, match="cannot be combined with tools"):
        model.chat(MESSAGES, specs, response_format={"type": "json_object"})
    reply = model.chat(
        MESSAGES,
        specs,
        tool_choice="none",
        params=SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
        response_format=_json_schema({"enum": ["ok", "no"]}),
    )
    assert json.loads(reply.text) in ("ok", "no")


def test_logprobs_in_the_chat_api_shape(model):
    """One entry per token of the text, whose bytes spell the text; each with its ``k``
    alternatives, the sampled token's value among them where it is one; the ``openai``
    client's ``ChoiceLogprobs`` accepts the result."""
    from openai.types.chat.chat_completion import ChoiceLogprobs

    k = 3
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}}}
    reply = model.chat(
        MESSAGES,
        params=SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=1),
        response_format=_json_schema(schema),
        top_logprobs=k,
    )
    logprobs = model.openai_logprobs(reply)
    content = ChoiceLogprobs.model_validate(logprobs).content
    assert len(content) == len(reply.logprobs) == reply.completion_tokens - 1  # no end of turn
    assert b"".join(bytes(c.bytes) for c in content) == reply.text.encode()
    for entry, token in zip(content, reply.logprobs):
        assert entry.logprob == token.logprob and len(entry.top_logprobs) == k
        assert entry.token == model.tokenizer.decode([token.token])
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        for alternative, (token_id, value) in zip(entry.top_logprobs, token.top):
            assert alternative.logprob == value
            if token_id == token.token:
                assert value == pytest.approx(token.logprob, abs=1e-6)
