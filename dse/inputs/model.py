"""The model shape: a decoder-only transformer, dense or mixture-of-experts."""

from __future__ import annotations

import dataclasses

from dse.backend import register_dataclass
from dse.inputs.base import Inputs

__all__ = ["ModelShape"]


@register_dataclass
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
    route_node_limit: jax.Array = 0.0  # max expert groups (nodes) a token is routed to (0: unlimited; config.json topk_group)
    route_groups: jax.Array = 0.0      # expert groups the limit counts (config.json n_group; 0: one group a node)
    # ---- real shapes beyond h/a heads (0 keeps the seed's and GPT's shapes)
    head_dim: jax.Array = 0.0          # per-head width (0: h/a; Gemma-2-9B: 256 with h/a = 224)
    tied_embeddings: jax.Array = 0.0   # 1: the output layer shares the input embedding (tie_word_embeddings)
    q_lora_rank: jax.Array = 0.0       # MLA query compression rank (0: direct h x a d_qk projection)
    kv_lora_rank: jax.Array = 0.0      # MLA key/value latent rank (> 0 turns MLA on; DeepSeek-V2/V3: 512)
    qk_nope_head_dim: jax.Array = 0.0  # MLA per-head query/key width without rotary part (DeepSeek-V3: 128)
    qk_rope_head_dim: jax.Array = 0.0  # MLA decoupled rotary width, one shared key head (DeepSeek-V3: 64)
    v_head_dim: jax.Array = 0.0        # MLA per-head value width (DeepSeek-V3: 128)
    window: jax.Array = 0.0            # sliding-window attention: the keys a query attends back over (0: full causal; Gemma 2: 4096, gpt-oss: 128)
    window_layers: jax.Array = 0.0     # layers that use the window (0 with a window: every layer; Gemma 2 and gpt-oss alternate: L/2)
    dropout: jax.Array = 1.0           # 1: attention and residual dropout on, their masks stored (Megatron's default 0.1; GPT-3); 0: none (Llama, Qwen, MPT configs)
