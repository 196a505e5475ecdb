"""``python -m agentic_jax <verb>`` runs the same command line as ``agentic-jax <verb>``."""

from agentic_jax.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
