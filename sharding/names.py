"""Logical axes of the transformer's activations, shared by the model and the memory planner."""

BTD = ("activation_batch", "activation_length", "activation_embed")
BTNH = ("activation_batch", "activation_length", "activation_heads", "head_dim")
BTKH = ("activation_batch", "activation_length", "activation_kv_heads", "head_dim")
BTF = ("activation_batch", "activation_length", "activation_mlp")
BTV = ("activation_batch", "activation_length", "activation_vocab")
