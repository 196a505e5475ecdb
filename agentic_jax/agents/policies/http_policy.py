"""A policy served by any OpenAI-compatible chat-completions endpoint (``agentic-jax serve``,
vLLM, llama.cpp's server, hosted APIs), over the standard library's HTTP client.

Tool-call ids are a wire detail the harness does not keep: outgoing assistant calls are numbered
by position and each tool message answers the next unanswered call, which is how the harness
orders them anyway.  Transient HTTP failures (429, 5xx, connection errors) are retried with the
executor's backoff; anything else is a :class:`PolicyError`.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

import gin

from agentic_jax.agents.policies.base import AssistantMessage, PolicyError, Usage
from agentic_jax.agents.tools.base import tool_specs
from agentic_jax.agents.tools.executor import RetryPolicy
from agentic_jax.data.chat import Message, ToolCall

RETRY_STATUS = (408, 429, 500, 502, 503, 504)


def openai_messages(messages: Sequence[Message]) -> list[dict]:
    """Chat messages in the OpenAI wire format, with positional tool-call ids."""
    out, pending = [], []
    for turn, m in enumerate(messages):
        if m.role == "tool":
            call_id = pending.pop(0) if pending else f"call_orphan_{turn}"
            out.append({"role": "tool", "tool_call_id": call_id, "content": m.content})
            continue
        entry = {"role": m.role, "content": m.content}
        if m.tool_calls:
            ids = [f"call_{turn}_{i}" for i in range(len(m.tool_calls))]
            pending = list(ids)
            entry["content"] = m.content or None
            entry["tool_calls"] = [
                {
                    "id": i,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_text()},
                }
                for i, c in zip(ids, m.tool_calls)
            ]
        out.append(entry)
    return out


@gin.configurable(module="agents")
class HTTPPolicy:
    """``base_url`` ends in ``/v1``; ``defaults`` are sampling keywords every request gets."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        retry: RetryPolicy = RetryPolicy(),
        defaults: dict | None = None,
    ):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout_s, self.retry = model, api_key, timeout_s, retry
        self.defaults = dict(defaults or {})
        self._rng = random.Random()

    def _post(self, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode()
        for attempt in range(self.retry.max_attempts):
            request = urllib.request.Request(self.url, data, headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")
                if e.code not in RETRY_STATUS or attempt + 1 == self.retry.max_attempts:
                    raise PolicyError(f"HTTP {e.code} from {self.url}: {detail}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                if attempt + 1 == self.retry.max_attempts:
                    raise PolicyError(f"cannot reach {self.url}: {e}") from None
            time.sleep(self.retry.delay(attempt, self._rng))
        raise AssertionError("unreachable")

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        body = {
            "model": self.model,
            "messages": openai_messages(messages),
            **self.defaults,
            **{k: v for k, v in sampling.items() if v is not None},
        }
        specs = tool_specs(tools)
        if specs:
            body["tools"] = [s.openai() for s in specs]
        else:
            body.pop("tool_choice", None)
        reply = self._post(body)
        try:
            choice = reply["choices"][0]
            message = choice["message"]
            # Arguments that are not a JSON object stay text for the executor to report.
            calls = tuple(
                ToolCall(c["function"]["name"], c["function"].get("arguments") or "{}")
                for c in message.get("tool_calls") or ()
            )
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise PolicyError(f"unexpected response from {self.url}: {e}: {reply}") from None
        usage = reply.get("usage") or {}
        return AssistantMessage(
            message.get("content") or "",
            calls,
            Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
            choice.get("finish_reason") or "stop",
        )
