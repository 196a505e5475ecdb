"""The tool runtime: ``@tool`` and its schemas (``base``), execution with timeouts, retries and
approval gates (``executor``), the built-in tools (``builtin``: calculator, sandboxed Python),
local BM25 search (``retrieval``), MemGPT's memory tools and an agent's memory from gin
(``memory``), budgets and loop detection; ``env_tools`` turns a tool into one of the RL
environments' host tools."""
