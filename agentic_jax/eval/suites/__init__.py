"""Evaluation suites played by agents: checkpoints or endpoints on task families and their
robustness variants, with reports (``agentic-jax eval``).  Above the metrics of
``agentic_jax.eval``, this package may use the agent harness and the environments."""
