"""The tool runtime: ``@tool`` and its schemas (``base``), execution with timeouts, retries and
approval gates (``executor``), the built-in tools (``builtin``: calculator, sandboxed Python),
local BM25 search (``retrieval``), budgets and loop detection."""
