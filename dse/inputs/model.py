"""The model shape: a decoder-only transformer, dense or mixture-of-experts."""

from __future__ import annotations

import dataclasses

import jax

from dse.inputs.base import Inputs

__all__ = ["ModelShape"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ModelShape(Inputs):
    """A decoder-only transformer, dense or mixture-of-experts."""

    layers: jax.Array        # L, transformer layers
    hidden: jax.Array        # h, hidden size (model width)
    heads: jax.Array         # a, attention (query) heads
    kv_heads: jax.Array      # GQA key/value heads (= heads for multi-head attention)
    ffn_hidden: jax.Array    # dense FFN width (4h for GPT)
    vocab: jax.Array         # V, vocabulary size (tokens)
    seq: jax.Array           # s, tokens per sequence
    experts: jax.Array = 1.0          # E routed experts (1 = dense)
    topk: jax.Array = 1.0             # experts per token
    ffn_gated: jax.Array = 0.0        # 1 for SwiGLU/GeGLU (three FFN matrices)
    expert_ffn_hidden: jax.Array = 0.0  # routed expert width (0: ffn_hidden)
    shared_experts: jax.Array = 0.0   # always-on experts per MoE layer (DeepSeek)
    moe_layer_freq: jax.Array = 1.0   # fraction of layers that are MoE layers
    dense_layers: jax.Array = 0.0     # leading dense layers in an MoE model (DeepSeek-V3: 3)
    route_node_limit: jax.Array = 0.0  # max nodes a token is routed to (0: unlimited)
