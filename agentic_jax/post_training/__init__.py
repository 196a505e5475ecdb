"""Post-training: SFT, LoRA-aware updates, reward models, preference optimisation, online RL,
rejection-sampling fine-tuning, evaluation, and the end-to-end pipeline (``agentic-jax train``).

Every trainer is a gin-configurable function ``trainer(workdir, *, init_from, tasks, ...)``
that resumes from its checkpoints and writes a run directory (``runner.TrainerRun``).
"""
