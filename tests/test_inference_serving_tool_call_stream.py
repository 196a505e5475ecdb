"""A constrained call's arguments told piece by piece: any valid spelling of a JSON object, cut
anywhere, rewrites to ``json.dumps``'s canonical text of it (the ``arguments`` of an unstreamed
reply); a surrogate pair or a number cut in two waits for its other part."""

import json

from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.inference.serving.tool_call_stream import CanonicalJson

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
blanks = st.sampled_from(["", " ", "\n", "\t ", "  "])


def _string(draw, text: str) -> str:
    """``text`` as a JSON string, each character written plainly or as ``\\u`` escapes (a pair
    of them beyond the BMP) at random."""
    out = []
    for c in text:
        if c in '"\\' or ord(c) < 0x20 or draw(st.booleans()):
            code = c.encode("utf-16-be")
            out += [
                f"\\u{int.from_bytes(code[i : i + 2], 'big'):04X}" for i in (0, 2)[: len(code) // 2]
            ]
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


@st.composite
def spellings(draw, value) -> str:
    """A valid JSON text of ``value`` unlike ``json.dumps``'s: other whitespace, escapes and
    number spellings."""
    if isinstance(value, dict):
        items = [
            draw(blanks) + _string(draw, k) + draw(blanks) + ":" + draw(blanks) + draw(spellings(v))
            for k, v in value.items()
        ]
        return "{" + ",".join(i + draw(blanks) for i in items) + draw(blanks) + "}"
    if isinstance(value, list):
        return "[" + ",".join(draw(blanks) + draw(spellings(v)) + draw(blanks) for v in value) + "]"
    if isinstance(value, str):
        return _string(draw, value)
    if isinstance(value, float):
        return draw(st.sampled_from([repr(value), format(value, ".17e"), format(value, ".17E")]))
    return json.dumps(value)


@st.composite
def pieces(draw, text: str) -> list[str]:
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@given(st.dictionaries(st.text(max_size=5), values, max_size=4), st.data())
def test_any_spelling_cut_anywhere_rewrites_to_the_canonical_text(arguments, data):
    """The arguments object and what follows it in a call (ignored), in pieces."""
    text = data.draw(spellings(arguments)) + data.draw(st.sampled_from(["", " }\n", "}"]))
    rewriter = CanonicalJson()
    out = "".join(rewriter.push(p) for p in data.draw(pieces(text)))
    assert rewriter.done and out == json.dumps(arguments, ensure_ascii=False)


def test_a_surrogate_pair_cut_between_its_halves_is_one_character():
    rewriter = CanonicalJson()
    out = rewriter.push('{"a": "\\ud83d') + rewriter.push('\\ude00 <\\u003c"}')
    assert out == '{"a": "😀 <<"}' and rewriter.done


def test_a_number_waits_for_its_end():
    rewriter = CanonicalJson()
    assert rewriter.push('{"n": 1') == '{"n": '
    assert rewriter.push("E2") == ""
    assert rewriter.push(" }  ignored") == "100.0}" and rewriter.done
