#!/usr/bin/env python3
"""Prints the transformers source of the glm4_moe pieces mxserve must match (run on the GPU machine)."""
import inspect
from transformers.models.glm4_moe import modeling_glm4_moe as m
for name in ["Glm4MoeRMSNorm", "Glm4MoeTopkRouter", "Glm4MoeMoE", "Glm4MoeDecoderLayer", "Glm4MoeAttention",
             "Glm4MoeRotaryEmbedding", "apply_rotary_pos_emb", "eager_attention_forward", "Glm4MoeNaiveMoe"]:
    obj = getattr(m, name, None)
    print(f"===== {name} =====")
    print(inspect.getsource(obj) if obj is not None else "(absent)")
print("===== module members =====")
print([n for n in dir(m) if not n.startswith("_")])
