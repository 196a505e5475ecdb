"""Serving: the engine (paged KV cache, prefix caching, continuous batching), the engine loop that
serves concurrent callers, chat with constrained tool calls over it, and the OpenAI-compatible
HTTP server."""
