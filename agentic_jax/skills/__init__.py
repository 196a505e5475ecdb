"""Example skills shipped with the package (Markdown with YAML front matter), loaded by
``SkillRegistry.load()``; the format is described in ``agentic_jax/agents/protocols/skills.py``."""
