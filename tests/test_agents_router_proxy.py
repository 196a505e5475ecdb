"""The router in front of the serving API, over HTTP on loopback: two fake OpenAI-compatible
upstreams, an adder (right on "Add a and b.") and a speller (right on "Spell w backwards."), each
wrong on the other's kind.  Graded by the test and fed back, the router learns to send each kind
to its expert (per-kind choice rates and the true regret, computed here from the known outcomes
of both arms); streams pass through byte for byte; costs are the upstreams' usage times their
prices; bad feedback gets a 400 and an unknown route a 404."""

import json
import re
import socket
import zlib

import gin
import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from ui_server import serving

from agentic_jax.agents.multi_agent import router as bandit
from agentic_jax.agents.multi_agent.router_proxy import (
    ROUTE_HEADER,
    ROUTE_ID_HEADER,
    RequestFeatures,
    RouterProxy,
    Upstream,
)
from agentic_jax.cli import main

ADD, SPELL = re.compile(r"Add (\d+) and (\d+)\."), re.compile(r"Spell (\w+) backwards\.")
WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "honey"]


def answer(prompt: str) -> str:
    if m := ADD.fullmatch(prompt):
        return str(int(m[1]) + int(m[2]))
    return SPELL.fullmatch(prompt)[1][::-1]


def expert(pattern):
    """A fake upstream that answers the prompts ``pattern`` matches and no others."""

    async def chat(request: Request):
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        text = answer(prompt) if pattern.fullmatch(prompt) else "I do not know."
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        head = {"id": "chatcmpl-1", "created": 0, "model": body["model"]}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            reply = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            return JSONResponse(reply)

        def chunk(delta, finish=None, **extra):
            choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta else []
            event = {**head, "object": "chat.completion.chunk", "choices": choices, **extra}
            return f"data: {json.dumps(event)}\n\n".encode()

        async def events():
            yield b": a comment the client must see too\n\n"
            yield chunk({"role": "assistant", "content": ""})
            for word in text.split(" "):
                yield chunk({"content": word + " "})
            yield chunk({}, "stop")
            if (body.get("stream_options") or {}).get("include_usage"):
                yield chunk({}, usage=usage)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture(scope="module")
def upstreams():
    with serving(expert(ADD)) as adder, serving(expert(SPELL)) as speller:
        yield {"adder": f"{adder}/v1", "speller": f"{speller}/v1"}


def make_proxy(urls, **options):
    arms = [
        Upstream("adder", urls["adder"], model="add-1", prompt_price=0.01, completion_price=0.02),
        Upstream("speller", urls["speller"], model="spell-1"),
    ]
    return RouterProxy(arms, **options)


def request_of(kind: str, rng) -> str:
    if kind == "add":
        return f"Add {rng.integers(100)} and {rng.integers(100)}."
    return f"Spell {WORDS[rng.integers(len(WORDS))]} backwards."


def chat(prompt: str, **extra) -> dict:
    return {"model": "router", "messages": [{"role": "user", "content": prompt}], **extra}


@pytest.mark.parametrize("method", ["linucb", "thompson"])
def test_after_feedback_each_kind_goes_to_its_expert_and_regret_flattens(upstreams, method):
    rng, requests = np.random.default_rng(0), 120
    kinds = rng.choice(["add", "spell"], requests)
    right = {"add": 0, "spell": 1}  # the arm (in the router's order) that answers each kind
    proxy = make_proxy(upstreams, method=method, alpha=0.5, noise=0.3)
    chosen = []
    with serving(proxy.app) as url, httpx.Client(base_url=url) as client:
        for kind in kinds:
            prompt = request_of(kind, rng)
            reply = client.post("/v1/chat/completions", json=chat(prompt))
            text = reply.json()["choices"][0]["message"]["content"]
            chosen.append(proxy.router.names.index(reply.headers[ROUTE_HEADER]))
            route = {
                "route_id": reply.headers[ROUTE_ID_HEADER],
                "reward": float(text == answer(prompt)),
            }
            assert client.post("/v1/route_feedback", json=route).status_code == 200
        stats = client.get("/v1/route_stats").json()
    chosen = np.array(chosen)
    late = np.arange(requests) >= requests // 2
    for kind, arm in right.items():
        assert np.mean(chosen[late & (kinds == kind)] == arm) > 0.85, kind
    outcomes = np.array([[float(right[k] == a) for a in range(2)] for k in kinds])
    regret = np.asarray(bandit.cumulative_regret(outcomes, chosen, per_step=True))
    half = requests // 2
    assert regret[-1] - regret[half - 1] < 0.4 * regret[half - 1]  # sublinear: it flattens
    assert regret[-1] < 0.25 * requests  # a random router's expected regret is requests / 2
    assert [stats["arms"][n]["requests"] for n in ("adder", "speller")] == [
        int(np.sum(chosen == 0)),
        int(np.sum(chosen == 1)),
    ]
    # routing by request beats either fixed arm, and the bandit's estimate says so too
    assert stats["estimated_regret_vs_best_fixed_arm"] < 0


def test_a_streamed_reply_passes_through_byte_for_byte_and_is_priced_by_its_usage(upstreams):
    proxy = make_proxy(upstreams)
    body = chat("Add 20 and 22.", stream=True, stream_options={"include_usage": True})
    with serving(proxy.app) as url, httpx.Client(base_url=url) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            routed = b"".join(reply.iter_raw())
            arm, route_id = reply.headers[ROUTE_HEADER], reply.headers[ROUTE_ID_HEADER]
            assert reply.headers["content-type"].startswith("text/event-stream")
        upstream = proxy.upstreams[arm]
        direct = httpx.post(
            f"{upstream.base_url}/chat/completions", json={**body, "model": upstream.model}
        )
        assert routed == direct.content
        assert routed.startswith(b": a comment") and routed.endswith(b"data: [DONE]\n\n")
        usage = [json.loads(line[6:]) for line in routed.split(b"\n") if b'"usage"' in line]
        feedback = client.post("/v1/route_feedback", json={"route_id": route_id, "reward": 1})
    tokens = usage[0]["usage"]
    cost = upstream.prompt_price * tokens["prompt_tokens"] + (
        upstream.completion_price * tokens["completion_tokens"]
    )
    assert feedback.json() == {
        "route_id": route_id,
        "arm": arm,
        "outcome": 1.0,
        "cost": pytest.approx(cost),
        "reward": pytest.approx(1.0 - cost),
    }


def test_a_whole_reply_is_priced_and_the_bandit_learns_outcome_minus_cost(upstreams):
    proxy = make_proxy(upstreams, method="linucb", alpha=0.0)  # greedy: the first arm on ties
    with serving(proxy.app) as url, httpx.Client(base_url=url) as client:
        reply = client.post("/v1/chat/completions", json=chat("Add 1 and 2."))
        assert reply.headers[ROUTE_HEADER] == "adder"  # the first arm: no estimates yet
        assert reply.json()["model"] == "add-1"  # the upstream's model replaced the client's
        usage = reply.json()["usage"]  # 4 prompt words, 1 completion word
        route_id = reply.headers[ROUTE_ID_HEADER]
        done = client.post("/v1/route_feedback", json={"route_id": route_id, "reward": 0.5})
    cost = 0.01 * usage["prompt_tokens"] + 0.02 * usage["completion_tokens"]
    assert done.json()["reward"] == pytest.approx(0.5 - cost)
    assert proxy.router.rewards == [("adder", pytest.approx(0.5 - cost))]
    x = proxy.router.featurize(chat("Add 1 and 2."))
    theta = np.asarray(bandit.estimates(proxy.router.state))[0]
    expected = np.linalg.solve(np.eye(len(x)) + np.outer(x, x), (0.5 - cost) * x)  # ridge, λ = 1
    np.testing.assert_allclose(theta, expected, rtol=1e-4, atol=1e-5)


def test_bad_feedback_is_a_400_and_an_unknown_or_spent_route_a_404(upstreams):
    proxy = make_proxy(upstreams)
    with serving(proxy.app) as url, httpx.Client(base_url=url) as client:
        reply = client.post("/v1/chat/completions", json=chat("Spell tiger backwards."))
        route_id = reply.headers[ROUTE_ID_HEADER]
        for bad in ("high", None, True, [1], "NaN"):
            answered = client.post("/v1/route_feedback", json={"route_id": route_id, "reward": bad})
            assert answered.status_code == 400 and answered.json()["error"]["param"] == "reward"
        raw = b'{"route_id": "%s", "reward": Infinity}' % route_id.encode()
        assert client.post("/v1/route_feedback", content=raw).status_code == 400
        assert client.post("/v1/route_feedback", json={"reward": 1}).status_code == 400
        unknown = client.post("/v1/route_feedback", json={"route_id": "nope", "reward": 1})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "route_not_found"
        first = client.post("/v1/route_feedback", json={"route_id": route_id, "reward": 1})
        again = client.post("/v1/route_feedback", json={"route_id": route_id, "reward": 1})
        assert (first.status_code, again.status_code) == (200, 404)
        for body in ({"messages": []}, [1, 2], {"messages": ["hi"]}):
            assert client.post("/v1/chat/completions", json=body).status_code == 400
        assert client.get("/v1/models").json()["data"][0]["id"] == "router"
        assert client.get("/health").json() == {"status": "ok", "upstreams": ["adder", "speller"]}
    [(arm, _)] = proxy.router.rewards  # only the one good feedback
    assert arm == reply.headers[ROUTE_HEADER]


def test_only_the_newest_pending_routes_are_kept_and_a_dead_upstream_is_a_routed_502():
    with socket.create_server(("127.0.0.1", 0)) as sock:
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    proxy = RouterProxy([Upstream("dead", dead)], max_pending=2)
    with serving(proxy.app) as url, httpx.Client(base_url=url) as client:
        replies = [client.post("/v1/chat/completions", json=chat("hi")) for _ in range(3)]
        assert {r.status_code for r in replies} == {502}
        assert {r.headers[ROUTE_HEADER] for r in replies} == {"dead"}
        ids = [r.headers[ROUTE_ID_HEADER] for r in replies]
        assert list(proxy.pending) == ids[1:]  # the oldest was forgotten
        late = client.post("/v1/route_feedback", json={"route_id": ids[0], "reward": 0})
        assert late.status_code == 404


@given(
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text()}
        ),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
)
def test_request_features_are_the_documented_numbers(messages, tools):
    features = RequestFeatures(buckets=8)
    body = {"messages": messages, **({"tools": [{"type": "function"}]} if tools else {})}
    x = features(body)
    assert x.shape == (features.dim,) == (11,)
    chars = sum(len(m["content"]) for m in messages)
    np.testing.assert_allclose(x[:3], [1.0, np.log1p(chars) / 10, float(tools)], rtol=1e-6)
    users = [m["content"] for m in messages if m["role"] == "user"]
    words = re.findall(r"\w+", users[-1].lower()) if users else []
    if words:
        assert np.linalg.norm(x[3:]) == pytest.approx(1.0, rel=1e-5)
        counts = np.bincount([zlib.crc32(w.encode()) % 8 for w in words], minlength=8)
        np.testing.assert_allclose(x[3:], counts / np.linalg.norm(counts), rtol=1e-5)
    else:
        assert not x[3:].any()


def test_upstreams_and_the_proxy_check_their_settings(monkeypatch):
    with pytest.raises(ValueError, match="base_url"):
        Upstream("a", "localhost:8000")
    with pytest.raises(ValueError, match="prompt_price"):
        Upstream("a", "http://x/v1", prompt_price=-1)
    priced = Upstream("a", "http://x/v1", prompt_price=2, completion_price=3)
    assert priced.cost({"prompt_tokens": 4, "completion_tokens": 5}) == 23
    assert priced.cost({"prompt_tokens": 4, "completion_tokens": "5"}) == priced.cost(None) + 8
    with pytest.raises(ValueError, match="distinct names"):
        RouterProxy([Upstream("a", "http://x/v1"), Upstream("a", "http://y/v1")])
    monkeypatch.delenv("ROUTER_TEST_KEY", raising=False)
    with pytest.raises(ValueError, match="ROUTER_TEST_KEY"):
        RouterProxy([Upstream("a", "http://x/v1", api_key_env="ROUTER_TEST_KEY")])


def test_the_route_verb_serves_the_shipped_config(upstreams, monkeypatch):
    import uvicorn

    served = []

    def run_once(app, host, port):
        with serving(app) as url, httpx.Client(base_url=url) as client:
            reply = client.post("/v1/chat/completions", json=chat("Add 2 and 2."))
            route = {"route_id": reply.headers[ROUTE_ID_HEADER], "reward": 1}
            served.append((reply.json(), client.post("/v1/route_feedback", json=route).json()))

    monkeypatch.setattr(uvicorn, "run", run_once)
    params = [
        f"small/multi_agent.Upstream.base_url = '{upstreams['adder']}'",
        f"large/multi_agent.Upstream.base_url = '{upstreams['speller']}'",
    ]
    argv = ["route", "--gin_file", "route_example", "--port", "0"]
    try:
        assert main([*argv, *(a for p in params for a in ("--gin_param", p))]) == 0
    finally:
        gin.clear_config()
    [(reply, feedback)] = served
    assert feedback["arm"] == "small" and reply["model"] == "small"
    assert feedback["cost"] == pytest.approx(0.00002 * 4 + 0.00005 * 1)
