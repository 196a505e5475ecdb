"""The agent web UI (``agentic-jax ui``): a page that runs an agent config and shows its steps.

``runs`` runs an agent or a team in a thread and tells what happens as typed events (tokens,
tool-call cards, approvals, multi-agent messages, the end of a run); ``app`` serves the page, its
JavaScript (``static/``) and the events over server-sent events.  See ``docs/agents.md``.
"""
