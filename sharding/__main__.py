"""``python -m sharding``: prints the planned per-device memory of Llama-3 8B / 70B runs."""

from sharding.memory_plan import memory_report

print(memory_report())
