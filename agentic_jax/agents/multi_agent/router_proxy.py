"""Agent-as-a-Router in front of the serving API: an OpenAI-compatible proxy whose every chat
request goes to the upstream the contextual bandit (:mod:`.router`) picks for it.

Several OpenAI-compatible endpoints, or several models behind one, are the arms
(:class:`Upstream`).  For each ``POST /v1/chat/completions`` the proxy turns the request into
features (:class:`RequestFeatures`), lets the :class:`~.router.Router` choose an arm (LinUCB or
Thompson sampling), forwards the request there with httpx (the upstream's ``model`` in place of
the client's) and passes the reply back as it came: a whole JSON reply, or a stream of server-sent
events byte for byte as the upstream sends them.  Every reply, errors included, carries the
chosen arm in the ``x-agentic-route`` header and the route's id in ``x-agentic-route-id``.

The client grades the reply however it can (a verifier, a user's thumbs up) and reports it:
``POST /v1/route_feedback {"route_id", "reward"}`` teaches the bandit ``reward − cost``, where
``cost`` is the upstream's ``usage`` tokens times its prices (``prompt_price`` and
``completion_price``, in reward units per token), so a cheap arm wins where it is good enough.
A streamed reply is priced by its usage chunk (the client asks for one with ``stream_options:
{"include_usage": true}``; without it the stream costs nothing), and feedback that arrives while
the stream is still running prices the usage seen so far.  An unknown route id (never issued,
already fed back, or among the oldest past ``max_pending`` unanswered ones) is a 404; a reward
that is not a finite number, a 400.

``GET /v1/route_stats`` reports each arm's requests, feedback and mean reward, and the
cumulative regret against the best fixed arm as the bandit estimates it: with its current
``θ̂_a`` and ``S_a = Σ x`` over the fed-back requests that arm ``a`` served,
``max_a θ̂_aᵀ(Σ_b S_b) − Σ_a θ̂_aᵀS_a`` (negative when routing by request beats every single arm).
``GET /v1/models`` lists the proxy's one model (``model_name``), ``GET /health`` its upstreams.

``agentic-jax route --gin_file route_example`` serves it (``configs/route_example.gin``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import math
import os
import re
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import gin
import httpx
import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentic_jax.agents.multi_agent.router import Routed, Router, estimates
from agentic_jax.inference.serving.openai_server import APIError
from agentic_jax.inference.serving.request_body import BodyError, parse_json_body

ROUTE_HEADER, ROUTE_ID_HEADER = "x-agentic-route", "x-agentic-route-id"
MAX_BODY_BYTES = 8 * 2**20
MAX_JSON_DEPTH = 64
_WORD = re.compile(r"\w+")


@gin.configurable(module="multi_agent")
@dataclasses.dataclass(frozen=True)
class Upstream:
    """One arm: the OpenAI-compatible API at ``base_url`` (ending in ``/v1``) and the ``model``
    sent there (None: the client's own); ``prompt_price`` and ``completion_price`` per usage
    token; ``api_key_env``, the environment variable holding its bearer token (read when the
    proxy is built)."""

    name: str
    base_url: str
    model: str | None = None
    prompt_price: float = 0.0
    completion_price: float = 0.0
    api_key_env: str | None = None

    def __post_init__(self):
        if not self.name:
            raise ValueError("an Upstream needs a name (its arm in the router)")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"Upstream {self.name!r}: base_url must be http(s), got {self.base_url!r}"
            )
        for field in ("prompt_price", "completion_price"):
            price = getattr(self, field)
            if not (math.isfinite(price) and price >= 0):
                raise ValueError(f"Upstream {self.name!r}: {field} must be >= 0, got {price!r}")

    def cost(self, usage: Mapping[str, Any] | None) -> float:
        """The price of a reply's ``usage`` (``prompt_tokens``, ``completion_tokens``; a count
        that is missing or no number costs nothing)."""

        def tokens(key: str) -> float:
            count = (usage or {}).get(key)
            return (
                float(count)
                if isinstance(count, int | float) and not isinstance(count, bool)
                else 0.0
            )

        return self.prompt_price * tokens("prompt_tokens") + (
            self.completion_price * tokens("completion_tokens")
        )


def _text(content: Any) -> str:
    """A message's text: its string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


@gin.configurable(module="multi_agent")
@dataclasses.dataclass(frozen=True)
class RequestFeatures:
    """What the router sees of a chat request, ``3 + buckets`` numbers:

    * ``1``, a bias, so each arm also learns its base rate;
    * ``log(1 + characters) / 10``, the length of all the messages' text (a 20,000-character
      prompt is about 1);
    * ``1`` if the request offers tools, else ``0``;
    * the last user message's hashed bag of words: each lower-cased word counted in bucket
      ``CRC-32(word) mod buckets`` (a stable hash, unlike Python's salted ``hash``), the counts
      divided by their Euclidean norm (the feature-hashing trick of Weinberger et al. 2009)."""

    buckets: int = 16

    def __post_init__(self):
        if self.buckets < 1:
            raise ValueError(f"RequestFeatures.buckets must be >= 1, got {self.buckets}")

    @property
    def dim(self) -> int:
        return 3 + self.buckets

    def __call__(self, body: Mapping[str, Any]) -> np.ndarray:
        messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
        chars = sum(len(_text(m.get("content"))) for m in messages)
        users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
        words = np.zeros(self.buckets, np.float32)
        for word in _WORD.findall(users[-1].lower() if users else ""):
            words[zlib.crc32(word.encode()) % self.buckets] += 1
        norm = float(np.linalg.norm(words))
        head = [1.0, math.log1p(chars) / 10, 1.0 if body.get("tools") else 0.0]
        return np.concatenate([np.asarray(head, np.float32), words / max(norm, 1.0)])


@dataclasses.dataclass
class _Pending:
    """A routed request waiting for its feedback; ``cost`` grows when a stream's usage comes."""

    arm: str
    features: np.ndarray
    cost: float = 0.0


class _UsageScanner:
    """Finds the ``usage`` object in a stream of server-sent events fed in arbitrary pieces."""

    def __init__(self):
        self.buffer, self.usage = b"", None

    def feed(self, chunk: bytes) -> None:
        *lines, self.buffer = (self.buffer + chunk).split(b"\n")
        for line in lines:
            data = line.strip().removeprefix(b"data:").strip()
            if not line.startswith(b"data:") or data == b"[DONE]":
                continue
            with contextlib.suppress(ValueError):
                event = json.loads(data)
                if isinstance(event, dict) and isinstance(event.get("usage"), dict):
                    self.usage = event["usage"]


def _chat_body(raw: bytes) -> dict:
    """A chat request's JSON object with a non-empty list of message objects, else an APIError."""
    try:
        body = parse_json_body(raw, max_bytes=MAX_BODY_BYTES, max_depth=MAX_JSON_DEPTH)
    except BodyError as e:
        raise APIError(e.status, str(e)) from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list", param="messages")
    if not all(isinstance(m, dict) for m in messages):
        raise APIError(400, "each message must be an object", param="messages")
    return body


def _feedback(raw: bytes) -> tuple[str, float]:
    """The ``route_id`` and ``reward`` of a feedback body, else an APIError 400."""
    try:
        body = parse_json_body(raw, max_bytes=2**16, max_depth=4)
    except BodyError as e:
        raise APIError(e.status, str(e)) from None
    if not isinstance(body, dict) or not isinstance(body.get("route_id"), str):
        raise APIError(400, "feedback is a JSON object with a route_id string", param="route_id")
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise APIError(400, f"reward must be a finite number, got {reward!r}", param="reward")
    return body["route_id"], float(reward)


def _answering_errors(endpoint):
    """``endpoint`` with each `APIError` it raises answered by the API's error object."""

    async def answer(request: Request) -> Response:
        try:
            return await endpoint(request)
        except APIError as e:
            return e.response()

    return answer


@gin.configurable(module="multi_agent")
class RouterProxy:
    """The routing proxy over ``upstreams`` (see the module docstring); :attr:`app` is its ASGI
    app.  ``method``, ``alpha``, ``noise``, ``ridge`` and ``seed`` configure the bandit
    (:class:`~.router.Router`); ``timeout_s`` bounds the wait for an upstream's connection and
    for each piece of its reply; ``max_pending`` routes wait for feedback at most (the oldest
    is forgotten first)."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        model_name: str = "router",
        features: RequestFeatures = RequestFeatures(),
        method: str = "linucb",
        alpha: float = 1.0,
        noise: float = 0.5,
        ridge: float = 1.0,
        seed: int = 0,
        timeout_s: float = 120.0,
        max_pending: int = 10_000,
    ):
        names = [u.name for u in upstreams]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"RouterProxy needs upstreams with distinct names, got {names}")
        if max_pending < 1 or not timeout_s > 0:
            raise ValueError(f"need max_pending >= 1, timeout_s > 0: {max_pending}, {timeout_s}")
        self.upstreams = {u.name: u for u in upstreams}
        self.keys = {}
        for u in upstreams:
            if u.api_key_env is not None:
                if not os.environ.get(u.api_key_env):
                    raise ValueError(f"Upstream {u.name!r}: ${u.api_key_env} is unset or empty")
                self.keys[u.name] = os.environ[u.api_key_env]
        self.model_name, self.timeout_s, self.max_pending = model_name, timeout_s, max_pending
        self.router = Router(
            self.upstreams,
            features,
            features.dim,
            method=method,
            alpha=alpha,
            noise=noise,
            ridge=ridge,
            cost_weight=1.0,
            seed=seed,
        )
        self.pending: collections.OrderedDict[str, _Pending] = collections.OrderedDict()
        self.routed = dict.fromkeys(names, 0)
        self.fed_back = dict.fromkeys(names, 0)
        self.reward_sums = dict.fromkeys(names, 0.0)
        self.feature_sums = np.zeros((len(names), features.dim), np.float64)  # S_a
        self.created = int(time.time())
        self.client: httpx.AsyncClient | None = None
        self.app = Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/route_stats", self._stats, methods=["GET"]),
                Route("/v1/chat/completions", _answering_errors(self._chat), methods=["POST"]),
                Route("/v1/route_feedback", _answering_errors(self._feedback), methods=["POST"]),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app) -> AsyncIterator[None]:
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            self.client = client
            yield
        self.client = None

    async def _health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "upstreams": list(self.upstreams)})

    async def _models(self, request: Request) -> JSONResponse:
        card = {"id": self.model_name, "object": "model", "created": self.created}
        return JSONResponse({"object": "list", "data": [{**card, "owned_by": "agentic-jax"}]})

    def stats(self) -> dict:
        """Each arm's ``requests``, ``feedback`` and ``mean_reward``, and the estimated
        cumulative regret against the best fixed arm (the module docstring)."""
        theta = np.asarray(estimates(self.router.state), np.float64)
        got = float(np.sum(theta * self.feature_sums))
        fixed = float(np.max(theta @ self.feature_sums.sum(axis=0)))
        arms = {
            name: {
                "requests": self.routed[name],
                "feedback": self.fed_back[name],
                "mean_reward": self.reward_sums[name] / max(self.fed_back[name], 1),
            }
            for name in self.upstreams
        }
        return {"arms": arms, "estimated_regret_vs_best_fixed_arm": fixed - got}

    async def _stats(self, request: Request) -> JSONResponse:
        return JSONResponse(self.stats())

    def _remember(self, arm: str, features: np.ndarray) -> tuple[str, _Pending]:
        route_id = uuid.uuid4().hex
        self.pending[route_id] = pending = _Pending(arm, features)
        while len(self.pending) > self.max_pending:
            self.pending.popitem(last=False)
        self.routed[arm] += 1
        return route_id, pending

    async def _chat(self, request: Request) -> Response:
        if self.client is None:
            raise APIError(503, "the proxy is not started (serve its app with its lifespan)")
        body = _chat_body(await request.body())
        arm, features = await run_in_threadpool(self.router.choose, body)
        upstream = self.upstreams[arm]
        route_id, pending = self._remember(arm, features)
        routed = {ROUTE_HEADER: arm, ROUTE_ID_HEADER: route_id}
        if upstream.model is not None:
            body = {**body, "model": upstream.model}
        # identity: the raw bytes passed through are then the body, whatever encodings httpx takes
        headers = {"accept": request.headers.get("accept", "*/*"), "accept-encoding": "identity"}
        if arm in self.keys:
            headers["authorization"] = f"Bearer {self.keys[arm]}"
        outgoing = self.client.build_request(
            "POST", f"{upstream.base_url.rstrip('/')}/chat/completions", json=body, headers=headers
        )
        try:
            reply = await self.client.send(outgoing, stream=True)
        except httpx.HTTPError as e:
            error = APIError(502, f"upstream {arm!r} failed: {e!r}", "upstream_error").response()
            error.headers.update(routed)
            return error
        media_type = reply.headers.get("content-type")
        if not body.get("stream"):
            try:
                content = await reply.aread()
            finally:
                await reply.aclose()
            with contextlib.suppress(ValueError, AttributeError):
                pending.cost = upstream.cost(json.loads(content).get("usage"))
            return Response(content, reply.status_code, headers=routed, media_type=media_type)

        async def passthrough() -> AsyncIterator[bytes]:
            scanner = _UsageScanner()
            try:
                async for chunk in reply.aiter_raw():
                    scanner.feed(chunk)
                    pending.cost = upstream.cost(scanner.usage)
                    yield chunk
            finally:
                await reply.aclose()

        return StreamingResponse(
            passthrough(), reply.status_code, headers=routed, media_type=media_type
        )

    async def _feedback(self, request: Request) -> JSONResponse:
        route_id, outcome = _feedback(await request.body())
        pending = self.pending.pop(route_id, None)
        if pending is None:
            raise APIError(
                404,
                f"unknown route id {route_id!r} (never issued, already fed back, or expired)",
                param="route_id",
                code="route_not_found",
            )
        routed = Routed(pending.arm, None, pending.features)
        reward = await run_in_threadpool(self.router.feedback, routed, outcome, pending.cost)
        index = self.router.names.index(pending.arm)
        self.fed_back[pending.arm] += 1
        self.reward_sums[pending.arm] += reward
        self.feature_sums[index] += pending.features
        return JSONResponse(
            {
                "route_id": route_id,
                "arm": pending.arm,
                "outcome": outcome,
                "cost": pending.cost,
                "reward": reward,
            }
        )
