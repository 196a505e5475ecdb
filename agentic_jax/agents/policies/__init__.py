"""Policy backends: the ``Policy`` protocol and ``ScriptedPolicy`` (``base``), a local JAX model
over the serving engine (``jax_policy``) and any OpenAI-compatible server (``http_policy``)."""
