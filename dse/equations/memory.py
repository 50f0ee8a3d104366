"""Parameters and memory per rank: ZeRO model states, activations tensor by tensor, buffers.

Every function is elementwise in its array arguments.
"""

from __future__ import annotations

import numpy as np

from dse.backend import is_traced, jnp
from dse.equations import steps
from dse.inputs.plan import RECOMPUTE, RECOMPUTE_MODULES, SELECTIVE_MODULES

BYTES_PER_ELEMENT = 2.0          # bf16 weights, gradients and activations (seed 000)
WEIGHT_BYTES = 2.0               # ZeRO sec.3: fp16 parameters
GRAD_BYTES = 2.0                 # ZeRO sec.3: fp16 gradients
OPTIMIZER_BYTES = 12.0           # ZeRO sec.3: K = 12 (fp32 master weights, momentum, variance)
MASK_BYTES = 1.0                 # Korthikanti sec.4.1: dropout masks, one byte an element
FP32_ACT_BYTES = 4.0             # FlashAttention's logsumexp, fp32 a head a token (Dao et al. 2022 sec.3.1)


# ---------------------------------------------------------------- parameters


def attention_dims(model):
    """Per-head widths of the real attention: (query/key width d_qk, value width d_v, heads x
    d_qk of the keys, heads x d_v of the values), all per token.

    Multi-head / GQA (Vaswani et al. 2017; Ainslie et al. 2023): d_qk = d_v = head_dim
    (h/a unless the config sets it: Gemma 2, Team et al. 2024 Table 1); keys and values
    have kv heads. MLA (DeepSeek-V2 sec.2.1.2-2.1.3): d_qk = nope + rope, d_v = v_head_dim,
    and every one of the a heads has its own key and value (up-projected from the latent).
    """
    h, a = model.hidden, model.heads
    hd = jnp.where(model.head_dim > 0, model.head_dim, h / a)
    mla = model.kv_lora_rank > 0
    d_qk = jnp.where(mla, model.qk_nope_head_dim + model.qk_rope_head_dim, hd)
    d_v = jnp.where(mla, model.v_head_dim, hd)
    kv_heads = jnp.where(mla, a, model.kv_heads)
    return d_qk, d_v, kv_heads * d_qk, kv_heads * d_v


def attention_params(model):
    """Weights of one real attention block (no biases, norms ignored as everywhere here).

    MHA/GQA: Q h x a d, K and V h x kv d, O a d x h (= 2h^2 + 2 h^2 kv/a at d = h/a).
    MLA (DeepSeek-V2 sec.2.1.2-2.1.3, eq.(9)-(14); DeepSeek-V3 config.json): query down
    h x r_q and up r_q x a(d_nope + d_rope) (or h x a d_qk with no query rank); joint
    key/value down h x (r_kv + d_rope), up r_kv x a(d_nope + d_v); output a d_v x h.
    """
    h, a = model.hidden, model.heads
    d_qk, d_v, k_w, v_w = attention_dims(model)
    gqa = h * a * d_qk + h * (k_w + v_w) + a * d_v * h
    q = jnp.where(model.q_lora_rank > 0, h * model.q_lora_rank + model.q_lora_rank * a * d_qk, h * a * d_qk)
    kv = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank * a * (model.qk_nope_head_dim + d_v)
    mla = q + kv + a * d_v * h
    return jnp.where(model.kv_lora_rank > 0, mla, gqa)


def layer_params(model, fid):
    """Per-layer weights: (attention, dense FFN, one routed expert, is-MoE, shared experts).

    Seed 000 sec.1: 4h^2 attention + 8h^2 MLP; MoE: top-2 over E half-width experts
    (4h^2 each). With ``fid.real_shapes`` = 1: the model's attention (GQA, head_dim, MLA:
    ``attention_params``) and a gated or plain FFN of the model's widths (Llama 3,
    Mixtral, DeepSeek-V3 configs).
    """
    h = model.hidden
    moe = model.experts > 1
    # seed 000 sec.1: Psi = 12 L h^2, experts at half width (4h^2 each)
    seed_attn = 4.0 * h * h
    seed_mlp = 8.0 * h * h
    seed_expert = seed_mlp * fid.seed_expert_width
    real_attn = attention_params(model)
    n_mats = 2.0 + model.ffn_gated                  # up (and gate) + down (Shazeer 2020, GLU variants)
    real_mlp = n_mats * h * model.ffn_hidden
    real_expert = n_mats * h * expert_width(model)
    attn = steps.where(fid.real_shapes, real_attn, seed_attn)
    mlp = steps.where(fid.real_shapes, real_mlp, seed_mlp)
    expert = steps.where(fid.real_shapes, real_expert, seed_expert)
    shared = steps.where(fid.real_shapes, model.shared_experts * real_expert, 0.0)
    return attn, mlp, expert, moe, shared


def expert_width(model):
    """Routed (and shared) expert FFN width: moe_intermediate_size, else the dense width."""
    return jnp.where(model.expert_ffn_hidden > 0, model.expert_ffn_hidden, model.ffn_hidden)


def moe_layers(model, fid):
    """Number of MoE layers (seed: every layer when experts > 1)."""
    real = jnp.floor((model.layers - model.dense_layers) * model.moe_layer_freq)
    n = steps.where(fid.real_shapes, real, model.layers)
    return jnp.where(model.experts > 1, n, 0.0)


def param_counts(model, fid):
    """(total, active, dense part, expert part) parameter counts of the whole model."""
    attn, mlp, expert, moe, shared = layer_params(model, fid)
    n_moe = moe_layers(model, fid)
    n_dense = model.layers - n_moe
    topk = steps.where(fid.real_shapes, model.topk, fid.seed_topk)
    embed = embedding_params(model, fid)                                        # input + output
    dense = model.layers * attn + n_dense * mlp + n_moe * shared + embed
    experts = n_moe * model.experts * expert
    total = dense + experts
    active = dense + n_moe * topk * expert
    return total, active, dense, experts


def embedding_params(model, fid):
    """Input embedding + output layer, V h each, or V h once when tied (tie_word_embeddings;
    Narayanan eq.2 counts V h once: tied); 0 in seed mode (Psi = 12 L h^2)."""
    copies = 2.0 - jnp.clip(model.tied_embeddings, 0.0, 1.0)
    return steps.where(fid.real_shapes, copies * model.vocab * model.hidden, 0.0)


def params_per_rank(model, fid, t, p, e, layer_share=1.0, embed_on=1.0, t_e=None):
    """(dense, expert) parameters on one first-stage rank (seed 000 sec.1: Psi/(t p), experts / e).

    The layers split evenly over p stages; the input embedding lives on the first stage
    and the output layer on the last (both on the one stage when p = 1), split over t
    (Megatron: vocab-parallel embedding, Narayanan sec.5). An uneven split gives a stage
    ``layer_share`` = its layers / (L/p) of the layer weights; ``embed_on`` = 0 for a
    stage without the embedding. ``t_e``: the TP degree the routed experts split over (``t`` unless
    EP is folded: degrees.expert_split).
    """
    _, _, dense, experts = param_counts(model, fid)
    t_e = t if t_e is None else t_e
    embed = embedding_params(model, fid)
    first = jnp.where(p > 1, 0.5, 1.0) * embed
    return ((dense - embed) / (t * p) * layer_share + embed_on * first / t,
            experts / (t_e * p * e) * layer_share)


def dualpipe_weight_factor(schedule):
    """DualPipe keeps two copies of the parameters (DeepSeek-V3 Table 2: 'Parameter 2x')."""
    return jnp.where(schedule >= 2, 2.0, 1.0)


# ---------------------------------------------------------------- model states


def model_state_bytes(params, shard, zero, weight_bytes=WEIGHT_BYTES, grad_bytes=GRAD_BYTES):
    """Weights, gradients and Adam state of ``params`` sharded over ``shard`` ranks.

    ZeRO (Rajbhandari et al. 2020) sec.5 / Fig.1: stage k shards the first k of
    {optimizer, gradients, weights}: 16 Psi, (4 + 12/d) Psi, (2 + 14/d) Psi, 16 Psi/d.
    ``weight_bytes``: 1 for FP8 compute weights (Megatron-LM --fp8-param-gather: the fp32
    master stays in the optimizer state), else 2. ``grad_bytes`` (Plan.grad_bytes): 2, or 4
    where the framework keeps fp32 gradient buffers (Megatron-LM under --bf16:
    accumulate_allreduce_grads_in_fp32 is forced on, megatron/training/arguments.py).
    """
    w = weight_bytes * params
    g = grad_bytes * params
    o = OPTIMIZER_BYTES * params
    return (
        jnp.where(zero >= 3, w / shard, w),
        jnp.where(zero >= 2, g / shard, g),
        jnp.where(zero >= 1, o / shard, o),
    )


def gradient_mode(zero, grad_accum, m, real_gradients):
    """(ZeRO stage the gradients are sharded at, reduce every microbatch 0/1): what a stack does.

    ``real_gradients`` = 0 (seed 000 sec.1): stage k shards gradients from k = 2 and they are
    reduced once a step, whatever ``grad_accum`` says of traffic. With ``real_gradients`` = 1
    (calibrated: ``fid.zero3_microbatch``):
      - gradients accumulated locally over m > 1 microbatches (``grad_accum`` = 0) stay
        unsharded until the one reduce-scatter a step: ZeRO-1's memory (Megatron's
        distributed optimizer; FSDP no_sync, Zhao et al. 2023 sec.3.4);
      - ZeRO-2 means sharded gradients, which forces a reduce-scatter every microbatch: the
        backward pass reduces each bucket into its owner's partition (ZeRO sec.5.2;
        DeepSpeed stage 2), so ZeRO-2 never accumulates locally and is never ZeRO-1 again;
      - ``grad_accum`` = 1 reduce-scatters every microbatch at any stage.
    """
    on = real_gradients >= 1
    ga = jnp.where(on & (zero == 2), 1.0, grad_accum)
    local = on & (ga < 1) & (m > 1)
    return jnp.where(local, jnp.minimum(zero, 1.0), zero), jnp.where(m > 1, ga, 0.0) * jnp.ones_like(zero)


# ---------------------------------------------------------------- activations
#
# What one layer stores for its backward, tensor by tensor, from the model's own structure, and what
# each recompute mode (plan.RECOMPUTE) keeps of it. Korthikanti et al. 2022 sec.4.1 count a GPT-3
# layer (LayerNorm, GeLU FFN of 4h, dropout, attention scores materialized): 34 s b h + 5 a s^2 b bytes;
# ``layer_tensor_bytes`` is that count for any shape, and reduces to it for GPT-3 with dropout
# (tests/equations/test_memory.py derives it). Norm statistics (LayerNorm mean and rstd, RMSNorm rstd:
# 4-8 bytes a token against 2h) are ignored, as Korthikanti does; both norms store their input.

# Bytes per token of each stored tensor of one layer, and whether it is split over the TP group
# ("tp": always /t; "seq": /t only with sequence parallelism, replicated otherwise).
LAYER_TENSORS = {
    "norm_in": "seq",     # the two norms' inputs, 2 x 2h (the first is the layer input)
    "attn_in": "seq",     # the QKV GEMM input (the first norm's output), 2h
    "latents": "seq",     # MLA only: the query and key/value latents, the up-projections' inputs, 2 r_q + 2 r_kv
    "q": "tp",            # queries, 2 a d_qk (the input of Q K^T; FlashAttention saves them too)
    "k": "tp",            # keys, 2 kv d_qk
    "v": "tp",            # values, 2 kv d_v
    "scores": "tp",       # materialized: softmax output 2as, with dropout its mask as and output 2as; fused
                          # (FlashAttention, Dao et al. 2022 sec.3.1): only the fp32 logsumexp, 4a
    "attn_out": "tp",     # the attention output, the output projection's input, 2 a d_v
    "masks": "seq",       # the two residual dropouts' 1-byte masks, 2h (0 without dropout)
    "ffn_in": "seq",      # the FC1 (gate/up) GEMM input (the second norm's output), 2h
    "dispatch": "seq",    # MoE only: the top-k dispatched copies of the FFN input, the experts' GEMM inputs, 2 k h
    "ffn_gate": "tp",     # gated: the gate GEMM's output 2f; plain: the activation's input 2f (= FC1 output)
    "ffn_up": "tp",       # gated only: the up GEMM's output 2f (a fused GLU recomputes silu(gate) from them)
    "ffn_out_in": "tp",   # the FC2 (down) GEMM input, 2f
    "ffn_out": "seq",     # the FC2 output, 2h (kept only by torchtitan's op policy)
    "layer_in": "seq",    # the layer input as a checkpoint keeps it, 2h (full, op)
}
GEMM_INPUTS = ("attn_in", "attn_out", "ffn_in", "dispatch", "ffn_out_in")   # what an FP8 recipe stores in FP8

# Recompute modes as data (plan.RECOMPUTE codes): the tensors a layer keeps, the GEMM weights whose
# forward the backward runs again, and the extra forwards of the attention core. Memory
# (activation_bytes_per_layer) and compute (compute.recompute_flops) read this one table.
#   none (0): every tensor.
#   selective (1): the modules Plan.recompute_modules names (Megatron-Core --recompute-modules; what
#     each drops and reruns: MODULE_DROPS). The default, core_attn, is Korthikanti sec.5's: the attention
#     core (Q K^T, softmax, dropout, x V) is recomputed from Q, K, V, no scores kept. DeepSeek-V3
#     sec.3.2.3 also recomputes the norms and MLA's up-projections (layernorm, mla_up_proj).
#   full (2), Korthikanti sec.5: only each layer's (or each group of ``plan.recompute_layers`` layers')
#     input; the backward runs the forward of every GEMM and the attention core again.
#   op (3), torchtitan's selective op-level checkpointing (pytorch/torchtitan torchtitan/parallelisms/
#     parallelize_llama.py at 004b314, _save_list and _custom_policy): inside each checkpointed block
#     the outputs of aten.mm (except every second one), of the SDPA kernels and of reduce_scatter are
#     saved; the rest is recomputed. A block's mm in order: wq, wk, wv, wo, w1, w3, w2 (gated; plain:
#     wq, wk, wv, wo, w1, w2), so wq (Q), wv (V), w1 (the gate, or the plain FC1 output) and, gated, w2
#     (the FC2 output) are saved, with the SDPA output and logsumexp and the block input; wk, wo and w3
#     are recomputed (PyTorch's checkpoint stops recomputing once the saved tensors it needs exist, so a
#     plain FFN's w2 is not run again); the attention core is not.
#   qkv (4), MaxText's remat_policy save_qkv_proj (AI-Hypercomputer/maxtext MaxText/layers/decoders.py:
#     jax.checkpoint_policies.save_only_these_names("query_proj", "value_proj", "key_proj", "qkv_proj")):
#     each scanned layer keeps its input (the scan carry) and the Q, K, V projections' outputs; the
#     backward runs the rest of the forward again, the attention core, the output projection and the
#     FFN. Full recompute less the Q, K, V GEMMs: it reruns the layer as full does (``reruns``).
RECOMPUTE_MODES = {
    "none": {"keeps": ("norm_in", "attn_in", "latents", "q", "k", "v", "scores", "attn_out", "masks", "ffn_in",
                       "dispatch", "ffn_gate", "ffn_up", "ffn_out_in"), "gemms": (), "core": 0.0},
    "selective": {"keeps": ("norm_in", "attn_in", "latents", "q", "k", "v", "scores", "attn_out", "masks", "ffn_in",
                            "dispatch", "ffn_gate", "ffn_up", "ffn_out_in"), "gemms": (), "core": "selective",
                  "modules": True},
    "full": {"keeps": ("layer_in",), "gemms": ("q", "k", "v", "o", "gate", "up", "down"), "core": 1.0},
    "op": {"keeps": ("layer_in", "q", "v", "scores", "attn_out", "ffn_gate", "ffn_out"), "gemms": ("k", "o", "up"),
           "core": 0.0},
    "qkv": {"keeps": ("layer_in", "q", "k", "v"), "gemms": ("o", "gate", "up", "down"), "core": 1.0, "reruns": True},
}
RECOMPUTE_MODES["full"]["reruns"] = True   # modes whose backward runs the layer's forward again (is_full_recompute)

# Selective recompute's modules (Plan.recompute_modules; Megatron-Core TransformerConfig.recompute_modules,
# megatron/core/transformer/transformer_config.py): the tensors each frees, by which part of the tensor
# ("all"; "mla": an MLA layer's, Q, K, V being its up-projections' outputs; "dense": a model without
# experts; "routed" / "shared": the top-k routed or the shared experts' part of an MoE layer's FFN tensors,
# ``module_drop``), and what its backward runs again. Megatron: "moe_act", "layernorm" and "mla_up_proj"
# use output-discarding checkpointing (the op's output is freed after the forward and the op runs again
# before its consumer's backward); "core_attn", "mlp", "moe" and "shared_experts" checkpoint the module
# (its input stays, what is inside runs again).
#   core_attn: the attention scores (Korthikanti sec.5); the core runs again (fid.selective_attn_recompute)
#   layernorm: the two norms' outputs, the QKV and FC1 GEMM inputs; the norms run again
#   mla_up_proj: MLA's Q, K, V; the up-projection GEMMs run again
#   mlp: a dense model's FFN tensors; its GEMMs and its TP collectives run again
#   moe: the dispatched copies and the routed experts' tensors; their GEMMs, the all-to-alls and (experts
#        split over TP) the block's TP collectives run again
#   moe_act: the routed experts' activation output, their FC2 input; the activation runs again
#   shared_experts: the shared experts' FFN tensors; their GEMMs run again
# An MoE model's dense layers (its first ``dense_layers``) keep a dense layer's tensors (activation_bytes:
# dense_layers_on_stage) and count as dense in compute (module_gemm_share) and traffic (module_rerun_blocks).
MODULE_DROPS = {
    "core_attn": {"scores": "all"},
    "layernorm": {"attn_in": "all", "ffn_in": "all"},
    "mla_up_proj": {"q": "mla", "k": "mla", "v": "mla"},
    "mlp": {"ffn_gate": "dense", "ffn_up": "dense", "ffn_out_in": "dense"},
    "moe": {"dispatch": "all", "ffn_gate": "routed", "ffn_up": "routed", "ffn_out_in": "routed"},
    "moe_act": {"ffn_out_in": "routed"},
    "shared_experts": {"ffn_gate": "shared", "ffn_up": "shared", "ffn_out_in": "shared"},
}
assert set(MODULE_DROPS) == set(RECOMPUTE_MODULES)
# What an op that runs again writes again (elementwise passes: compute.elementwise_time): the norms'
# outputs and the activation's output, whichever module frees them.
ELEMENTWISE_OUTPUTS = ("attn_in", "ffn_in", "ffn_out_in")


def module_on(modules, name):
    """1 where selective recompute's ``modules`` code (RECOMPUTE_MODULES bits) holds module ``name``, else 0
    (a Python number for a concrete scalar code)."""
    bit = RECOMPUTE_MODULES[name]
    if not is_traced(modules) and np.ndim(modules) == 0:
        return float(int(round(float(modules))) & int(bit) != 0)
    return jnp.mod(jnp.floor(modules / bit + 1e-6), 2.0)


def _off(*xs) -> bool:
    """True where every x is a concrete Python 0.0 (the weight of a mode or module the plan concretely does
    not use): what only it would add need not be traced."""
    return all(isinstance(x, float) and x == 0.0 for x in xs)


def _part_share(model, part, fid):
    """The share of a tensor a MODULE_DROPS part is (1.0 for "all"); seed mode has no MLA."""
    if part == "all":
        return 1.0
    moe = model.experts > 1
    if part == "dense":
        return jnp.where(moe, 0.0, 1.0)
    if part == "mla":
        real = 0.0 if fid is None else fid.real_shapes
        return steps.where(real, jnp.where(model.kv_lora_rank > 0, 1.0, 0.0), 0.0)
    k = model.topk + model.shared_experts
    mine = model.topk if part == "routed" else model.shared_experts
    return jnp.where(moe, steps.safe_div(mine, k), 0.0)


def module_drop(model, name, modules, fid=None):
    """Share of tensor ``name`` that selective recompute's ``modules`` free (MODULE_DROPS): each part once
    (moe and moe_act both free the routed experts' FC2 input), at most the whole tensor. 0.0 where no
    module of the code touches it."""
    parts = {}
    for module, drops in MODULE_DROPS.items():
        if name not in drops:
            continue
        on = module_on(modules, module)
        if _off(on):
            continue
        part = drops[name]
        parts[part] = jnp.maximum(parts[part], on) if part in parts else on
    total = sum(on * _part_share(model, part, fid) for part, on in parts.items())
    return min(total, 1.0) if isinstance(total, (int, float)) else jnp.minimum(total, 1.0)


def _mode_weight(recompute, name):
    """1 where the plan's recompute code is mode ``name``, else 0 (elementwise; a Python number
    for a concrete scalar code, such as RECOMPUTE["none"] itself)."""
    if not is_traced(recompute) and np.ndim(recompute) == 0:
        return 1.0 if float(recompute) == RECOMPUTE[name] else 0.0
    return jnp.where(recompute == RECOMPUTE[name], 1.0, 0.0)


def _mode_weights(recompute):
    """``_mode_weight`` of every mode of RECOMPUTE_MODES: one set for all of a layer's tensors."""
    return {mode: _mode_weight(recompute, mode) for mode in RECOMPUTE_MODES}


def is_full_recompute(recompute, share=1.0):
    """Share of a stage's layers whose forward runs again under full recompute (``share``: all of
    them, or ``full_recompute_share`` with layer-level checkpointing), 0 in the other modes. The qkv
    mode reruns the layer as full does (RECOMPUTE_MODES "reruns"; its Q, K, V GEMMs are the exception
    ``recomputed_gemm_share`` takes out): the TP collectives, elementwise passes and FP8 casts of a
    rerun forward count for it too."""
    return sum(_mode_weight(recompute, m) for m, row in RECOMPUTE_MODES.items() if row.get("reruns")) * share


def recomputed_layers(layers, every, sharpness=None):
    """Layers of a stage of ``layers`` that full recompute checkpoints when one in ``every`` is
    (plan.recompute_every): floor(layers / every). torchtitan's layer-level selective AC
    (selective_ac_option = N, an integer; pytorch/torchtitan torchtitan/parallelisms/
    parallelize_llama.py at 004b314, _apply_ac_to_transformer_block: a counter over the stage's
    blocks, ptd_checkpoint_wrapper when count % N == 0) wraps blocks N, 2N, ...: floor(layers / N),
    the others keep every tensor. Megatron-LM --recompute-method block --recompute-num-layers k
    (the first k layers of a stage's chunk) is the same count with N = layers / k.
    ``every`` = 1: every layer (today's full recompute)."""
    n = jnp.maximum(every, 1.0)
    return jnp.where(n <= 1.0, layers, -steps.ceil(-layers / n, sharpness))


def every_layer_alike(every) -> bool:
    """True when ``recompute_every`` is concretely at most 1 everywhere: every layer of a stage is
    checkpointed as its recompute mode says (``full_recompute_share`` is 1 whatever the stage)."""
    return steps.never(every > 1.0)


def full_recompute_share(layers, every, sharpness=None):
    """Share of a stage's ``layers`` fully recomputed under full recompute (``recomputed_layers``
    over ``layers``): 1 with ``every`` = 1, 1/2 with every other layer of an even stage. Memory
    (``activation_bytes``) and compute, traffic and the FP8 casts (``is_full_recompute``) read it.
    ``every`` concretely at most 1 everywhere (the default, ``every_layer_alike``): 1.0, nothing traced."""
    if every_layer_alike(every):
        return 1.0
    return jnp.where(jnp.maximum(every, 1.0) <= 1.0, 1.0,
                     steps.safe_div(recomputed_layers(layers, every, sharpness), layers))


def layer_tensor_bytes(model, c, b, flash, fid=None):
    """Bytes of each tensor in LAYER_TENSORS for one layer and one microbatch, before any TP split.

    With ``fid.real_shapes`` (calibrated) the model's own structure: head widths and kv heads
    (``attention_dims``; MLA latents), gated or plain FFN of width ffn_hidden (MoE: top-k plus shared
    experts of the expert width, and the top-k dispatched copies of the FFN input), ``model.dropout``
    (1: attention dropout and the two residual dropouts, Megatron's default), fused attention
    (``flash``). Seed mode (``fid`` None or real_shapes 0) counts GPT-3's shapes (h/a heads, f = 4h,
    plain FFN, dropout), Korthikanti's exactly.
    """
    s, h, a = model.seq, model.hidden, model.heads
    tokens = s / c * b
    real = 0.0 if fid is None else fid.real_shapes
    d_qk, d_v, k_w, v_w = attention_dims(model)
    moe = model.experts > 1
    topk = jnp.where(moe, model.topk + model.shared_experts, 1.0)
    f = jnp.where(moe, expert_width(model), model.ffn_hidden) * topk
    gated = jnp.clip(model.ffn_gated, 0.0, 1.0)
    drop = jnp.clip(model.dropout, 0.0, 1.0)
    mla = model.kv_lora_rank > 0
    pick = lambda x, seed: steps.where(real, x, seed)   # noqa: E731
    q = pick(a * d_qk, h)
    k = pick(k_w, h)
    v = pick(v_w, h)
    o = pick(a * d_v, h)
    f = pick(f, 4.0 * h)
    gated = pick(gated, 0.0)
    drop = pick(drop, 1.0)
    latents = pick(jnp.where(mla, 2.0 * model.q_lora_rank + 2.0 * model.kv_lora_rank, 0.0), 0.0)
    dispatch = pick(jnp.where(moe, 2.0 * model.topk * h, 0.0), 0.0)
    # Korthikanti sec.4.1: softmax output 2as, dropout mask as, dropout output 2as; fused: logsumexp (fp32)
    scores = jnp.where(flash >= 1, pick(FP32_ACT_BYTES * a, 0.0), BYTES_PER_ELEMENT * a * s + drop * 3.0 * a * s)
    per_token = {
        "norm_in": 2.0 * BYTES_PER_ELEMENT * h, "attn_in": BYTES_PER_ELEMENT * h, "latents": latents,
        "q": BYTES_PER_ELEMENT * q, "k": BYTES_PER_ELEMENT * k, "v": BYTES_PER_ELEMENT * v, "scores": scores,
        "attn_out": BYTES_PER_ELEMENT * o, "masks": drop * 2.0 * MASK_BYTES * h,
        "ffn_in": BYTES_PER_ELEMENT * h, "dispatch": dispatch, "ffn_gate": BYTES_PER_ELEMENT * f,
        "ffn_up": gated * BYTES_PER_ELEMENT * f, "ffn_out_in": BYTES_PER_ELEMENT * f,
        "ffn_out": BYTES_PER_ELEMENT * h, "layer_in": BYTES_PER_ELEMENT * h,
    }
    return {n: tokens * x for n, x in per_token.items()}


def _keep(model, mode, name, fid=None, modules=SELECTIVE_MODULES):
    """Whether recompute mode ``mode`` keeps tensor ``name`` (RECOMPUTE_MODES): 1.0 or 0.0, or an
    array where the model decides (selective: what its ``modules`` free, ``module_drop``; torchtitan's
    FC2 output under op)."""
    keep = 1.0 if name in RECOMPUTE_MODES[mode]["keeps"] else 0.0
    if RECOMPUTE_MODES[mode].get("modules") and keep:
        keep = 1.0 - module_drop(model, name, modules, fid)
    if mode == "op" and name == "ffn_out":
        keep = steps.where(1.0 if fid is None else fid.real_shapes, jnp.clip(model.ffn_gated, 0.0, 1.0), 0.0)
    return keep


def kept_bytes(model, t, sp, sizes, names, fid=None, group=1.0, modules=SELECTIVE_MODULES):
    """Per recompute mode (RECOMPUTE_MODES), the bytes of the tensors ``names`` of ``sizes``
    (``layer_tensor_bytes``) that the mode keeps, each split over t as LAYER_TENSORS says (SP splits
    the sequence-wise ones too). Full recompute of groups of ``group`` layers keeps one layer input a
    group; selective keeps what its ``modules`` leave (``_keep``). Each tensor's split is worked out once,
    and each mode sums what it keeps."""
    seq_div = jnp.where(sp >= 1, t, 1.0)
    x = {n: sizes[n] / (t if LAYER_TENSORS[n] == "tp" else seq_div) for n in names}
    out = {}
    for mode in RECOMPUTE_MODES:
        total = 0.0
        for n in names:
            keep = _keep(model, mode, n, fid, modules)
            if _off(keep):
                continue   # a tensor the mode drops adds nothing (no equation traced for it)
            xn = x[n] if isinstance(keep, float) else x[n] * keep
            if n == "layer_in" and mode == "full":
                xn = xn / jnp.maximum(group, 1.0)
            total = total + xn
        out[mode] = total
    return out


def _of_mode(recompute, kept, share):
    """The entry of ``kept`` (per recompute mode) for the plan's recompute code, elementwise; with a
    ``share`` of the layers fully recomputed (``full_recompute_share``), the mean over the stage's
    layers, ``share`` of them as full recompute keeps, the rest every tensor (none)."""
    total = 0.0
    for mode, w in _mode_weights(recompute).items():
        if not _off(w):   # a concrete code: its own mode's entry only
            total = total + w * kept[mode]
    return steps.where(jnp.where(is_full_recompute(recompute) >= 1, share, 1.0), total, kept["none"])


def activation_bytes_per_layer(model, t, c, b, recompute, sp, fid=None, flash=0.0, group=1.0, share=1.0,
                               modules=SELECTIVE_MODULES):
    """Activation bytes one layer stores for one microbatch on one rank: the tensors the recompute
    mode keeps (RECOMPUTE_MODES) of ``layer_tensor_bytes``, split over t (SP splits the sequence-wise
    ones too), with the sequence split over c context-parallel ranks (``kept_bytes``). Full recompute
    of groups of ``group`` layers (Megatron --recompute-method uniform --recompute-num-layers) keeps
    one input a group. Full recompute of a ``share`` of the layers (``full_recompute_share``): the
    mean over the stage's layers, ``share`` of them keeping their input as full recompute does, the
    rest every tensor (none). ``modules``: selective recompute's (Plan.recompute_modules, MODULE_DROPS).

    Seed mode reproduces Korthikanti et al. 2022 Table 2 (in s b h, 5as/(ht) the scores):
      TP, no SP:          10 + 24/t + 5as/(ht)    selective: 10 + 24/t
      TP + SP:            34/t + 5as/(ht)         selective: 34/t
      full recompute:     2 (no SP), 2/t (SP)
    """
    sizes = layer_tensor_bytes(model, c, b, flash, fid)
    return _of_mode(recompute, kept_bytes(model, t, sp, sizes, tuple(LAYER_TENSORS), fid, group, modules), share)


def kept_gemm_input_bytes(model, t, c, b, recompute, sp, fid=None, flash=0.0, share=1.0, modules=SELECTIVE_MODULES):
    """The part of ``activation_bytes_per_layer`` that is GEMM inputs (GEMM_INPUTS): what an FP8 recipe
    keeps in FP8. Korthikanti Table 2's 2 + 2 + 2 + 8 = 14 s b h (QKV, projection, FC1, FC2 inputs)
    with SP, 4 of them replicated without. ``share``: as ``activation_bytes_per_layer``."""
    sizes = layer_tensor_bytes(model, c, b, flash, fid)
    return _of_mode(recompute, kept_bytes(model, t, sp, sizes, GEMM_INPUTS, fid, modules=modules), share)


def recomputed_gemm_share(model, recompute, fid, share=1.0, modules=SELECTIVE_MODULES):
    """Share of a layer's forward GEMM FLOPs the backward runs again (RECOMPUTE_MODES "gemms"): 1 under
    full recompute (``share`` of the layers with layer-level checkpointing: ``full_recompute_share``);
    under torchtitan's op policy the weights of wk, wo and (gated) w3 over the layer's
    attention and FFN weights (``layer_params``); under MaxText's qkv policy 1 less the Q, K, V
    projections' share of them; under selective its modules' GEMMs (``module_gemm_share``); 0 otherwise."""
    h = model.hidden
    attn, mlp, _, _, _ = layer_params(model, fid)
    _, d_v, k_w, _ = attention_dims(model)
    gated = jnp.clip(model.ffn_gated, 0.0, 1.0)
    seed = fid.real_shapes < 1
    k_w = jnp.where(seed, h, k_w)
    o = jnp.where(seed, h, model.heads * d_v)
    up = jnp.where(seed, 0.0, gated) * jnp.where(seed, 4.0 * h, model.ffn_hidden)
    weights = {"k": h * k_w, "o": o * h, "up": h * up}
    op = sum(weights[g] for g in RECOMPUTE_MODES["op"]["gemms"]) / (attn + mlp)
    # qkv: a rerun forward less the Q, K, V projections, the attention block's weights but its output
    # projection (an MLA block's down- and up-projections are its Q, K, V: attention_params)
    qkv = (attn - weights["o"]) / (attn + mlp)
    rerun = _mode_weight(recompute, "op") * op
    selective = _mode_weight(recompute, "selective")
    if not _off(selective):
        rerun = rerun + selective * module_gemm_share(model, modules, fid)
    return is_full_recompute(recompute, share) + rerun - _mode_weight(recompute, "qkv") * share * qkv


def module_gemm_share(model, modules, fid):
    """Share of a step's layer GEMM FLOPs (every layer's active weights: attention, dense FFN, top-k
    routed and shared experts) that selective recompute's ``modules`` run again (MODULE_DROPS):
    mla_up_proj MLA's query and key/value up-projections (DeepSeek-V2 sec.2.1.2), mlp the dense layers'
    FFN, moe the routed experts, shared_experts the shared ones. 0.0 where the code holds none of them."""
    on = {name: module_on(modules, name) for name in ("mla_up_proj", "mlp", "moe", "shared_experts")}
    if _off(*on.values()):
        return 0.0
    attn, mlp, expert, _, shared = layer_params(model, fid)
    L = model.layers
    n_moe = moe_layers(model, fid)
    topk = steps.where(fid.real_shapes, model.topk, fid.seed_topk)
    d_qk, d_v, _, _ = attention_dims(model)
    a = model.heads
    up = (jnp.where(model.q_lora_rank > 0, model.q_lora_rank * a * d_qk, 0.0)
          + model.kv_lora_rank * a * (model.qk_nope_head_dim + d_v))
    up = steps.where(fid.real_shapes, jnp.where(model.kv_lora_rank > 0, up, 0.0), 0.0)
    weights = {"mla_up_proj": L * up, "mlp": (L - n_moe) * mlp, "moe": n_moe * topk * expert,
               "shared_experts": n_moe * shared}
    total = L * attn + (L - n_moe) * mlp + n_moe * (topk * expert + shared)
    return steps.safe_div(sum(on[n] * weights[n] for n in on), total)


def rerun_elementwise_bytes(model, t, c, b, sp, recompute, modules, fid, flash=0.0):
    """Bytes one layer's selective recompute writes again for one microbatch outside its GEMMs: the
    outputs of the norms, of the activation and the dispatched copies that its ``modules`` free
    (ELEMENTWISE_OUTPUTS, MODULE_DROPS), each split as LAYER_TENSORS says. 0.0 unless selective."""
    selective = _mode_weight(recompute, "selective")
    drops = {n: module_drop(model, n, modules, fid) for n in ELEMENTWISE_OUTPUTS}
    drops = {n: x for n, x in drops.items() if not _off(x)}
    if _off(selective) or not drops:
        return 0.0                       # nothing traced where no module frees one of them
    sizes = layer_tensor_bytes(model, c, b, flash, fid)
    seq_div = jnp.where(sp >= 1, t, 1.0)
    total = sum(x * sizes[n] / (t if LAYER_TENSORS[n] == "tp" else seq_div) for n, x in drops.items())
    return selective * total


def module_rerun_blocks(model, recompute, modules, fid, folded=0.0):
    """(FFN and MoE blocks of the model whose forward selective recompute's ``modules`` run again with
    their TP collectives, the share of the MoE layers whose all-to-alls run again). Megatron checkpoints
    the module, so what is inside runs again: mlp the dense layers' FFN (its TP all-gather and
    reduce-scatter), moe the MoE layers (their all-to-alls, and their TP pair unless the experts are
    whole, ``folded`` = 1: degrees.expert_split). (0.0, 0.0) unless selective with mlp or moe."""
    selective = _mode_weight(recompute, "selective")
    mlp, moe = module_on(modules, "mlp"), module_on(modules, "moe")
    if _off(selective) or _off(mlp, moe):
        return 0.0, 0.0
    n_moe = moe_layers(model, fid)
    blocks = mlp * (model.layers - n_moe) + moe * n_moe * (1.0 - folded)
    return selective * blocks, selective * moe * jnp.where(n_moe > 0, 1.0, 0.0)


def attention_core_recomputes(recompute, fid, share=1.0, modules=SELECTIVE_MODULES):
    """Extra forwards of the attention core a step (RECOMPUTE_MODES "core"): 1 under full recompute
    (``share`` with layer-level checkpointing), ``fid.selective_attn_recompute`` under selective with
    core_attn among its ``modules`` (Korthikanti sec.5), 1 under qkv (MaxText saves no attention output),
    0 under none and op."""
    out = 0.0
    for mode, row in RECOMPUTE_MODES.items():
        n = (fid.selective_attn_recompute * module_on(modules, "core_attn") if row["core"] == "selective"
             else row["core"])
        out = out + _mode_weight(recompute, mode) * n * (share if row.get("reruns") else 1.0)
    return out


def interleave_factor(p, v):

    """Korthikanti sec.4.2.3: interleaving with v chunks holds (1 + (p-1)/(p v)) more."""
    return jnp.where(v > 1, 1.0 + (p - 1.0) / (p * v), 1.0)


def activation_bytes(model, t, c, p, b, m, v, recompute, sp, sharpness=None, schedule=0.0,
                     stage_layers=None, stage=0.0, fid=None, fp8=0.0, fp8_cache=1.0, flash=0.0, group=1.0,
                     every=1.0, layer_bytes=None, modules=SELECTIVE_MODULES, dense_bytes=None):
    """First-stage activations: min(p, m) microbatches of ceil(L/p) layers (seed 000 sec.2).

    DualPipe holds p + 1 microbatches instead of p (DeepSeek-V3 Table 2). An uneven split
    passes the stage's ``stage_layers`` and its index ``stage``: 1F1B stage i holds
    min(p - i, m) microbatches (Narayanan sec.2.2). ``fp8``: the recipe code in use; its
    GEMM inputs are stored in FP8 (``fp8_activation_saving_bytes``). ``flash``: fused attention;
    ``group``: layers a full-recompute checkpoint spans (``activation_bytes_per_layer``); ``every``:
    one layer in ``every`` of the stage fully recomputed, the others keep every tensor
    (``full_recompute_share``). ``layer_bytes``: ``activation_bytes_per_layer`` of these arguments, when
    the caller has worked it out already. ``modules``: selective recompute's (Plan.recompute_modules).
    An MoE model's dense layers on the stage (``dense_layers_on_stage``) keep a dense layer's tensors
    (``dense_layer_bytes``, or ``dense_bytes`` where the caller has it).
    """
    in_flight = steps.minimum(p - stage, m, sharpness)
    in_flight = in_flight * jnp.where(schedule >= 2, (p + 1.0) / p, 1.0)
    layers = steps.ceil(model.layers / p, sharpness) if stage_layers is None else stage_layers
    share = full_recompute_share(layers, every, sharpness)
    per_layer = (activation_bytes_per_layer(model, t, c, b, recompute, sp, fid, flash, group, share, modules)
                 if layer_bytes is None else layer_bytes)
    if fid is not None:
        per_layer = per_layer - fp8_activation_saving_bytes(model, t, c, b, recompute, sp, fp8, fid, fp8_cache, flash,
                                                             share, modules)
    stored = layers * per_layer
    if dense_bytes is None:
        dense_bytes = dense_layer_bytes(model, t, c, b, recompute, sp, fid, flash, group, share, modules)
    if dense_bytes is not None:
        dense_layer = dense_bytes - fp8_activation_saving_bytes(_without_experts(model), t, c, b, recompute, sp, fp8, fid,
                                                                fp8_cache, flash, share, modules)
        stored = stored + dense_layers_on_stage(model, layers, stage, v, fid) * (dense_layer - per_layer)
    return in_flight * stored * interleave_factor(p, v)


def _without_experts(model):
    """The model with its MoE layers as dense ones: what a dense layer of an MoE model stores."""
    return model.replace(experts=jnp.ones_like(model.experts))


def dense_layer_bytes(model, t, c, b, recompute, sp, fid=None, flash=0.0, group=1.0, share=1.0,
                      modules=SELECTIVE_MODULES):
    """``activation_bytes_per_layer`` of one dense layer of an MoE model (its FFN of ffn_hidden, no dispatched
    copies: the same count on the model without experts); None where the model concretely has no dense
    layers among MoE ones (no ``dense_layers``, ``moe_layer_freq`` 1, or no experts) or in seed mode."""
    if fid is None or steps.never((model.experts > 1) & ((model.dense_layers > 0) | (model.moe_layer_freq < 1))):
        return None
    return activation_bytes_per_layer(_without_experts(model), t, c, b, recompute, sp, fid, flash, group, share,
                                      modules)


def dense_layers_on_stage(model, layers, stage, v, fid):
    """Dense layers among a stage's ``layers`` of an MoE model: the model's first ``dense_layers``
    (DeepSeek-V3: 3) lie in the first stage's first chunk, at most its L/(p v) layers (more spill into
    the next stage's chunk, not counted there), and ``moe_layer_freq`` < 1 leaves that share of the rest
    dense. 0 for a dense model and in seed mode (every layer an MoE layer: ``moe_layers``)."""
    first = jnp.where(stage <= 0, jnp.minimum(model.dense_layers, layers / jnp.maximum(v, 1.0)), 0.0)
    n = first + (layers - first) * (1.0 - jnp.clip(model.moe_layer_freq, 0.0, 1.0))
    return steps.where(fid.real_shapes, jnp.where(model.experts > 1, n, 0.0), 0.0)


def embedding_activation_bytes(model, t, c, p, b, fid):
    """Korthikanti sec.4.3: the first stage also stores the embedding dropout's 1-byte mask for
    its p in-flight microbatches, s b h p / t; 0 without dropout (``model.dropout``) and in seed mode. The output layer's
    4 s b h / t (1 + V/h) (F09 in validation/formulas_and_checks.csv, on the first stage when
    p = 1) lives on the output-layer stage: ``output_layer_input_bytes`` + ``logits_bytes``."""
    sbh = model.seq / c * b * model.hidden
    return steps.where(fid.real_shapes, sbh * p / t * jnp.clip(model.dropout, 0.0, 1.0), 0.0)


def stage_output_bytes(model, c, p, b, m, sharpness=None):
    """Pipeline stage outputs a first stage keeps for its in-flight microbatches when they are
    not deallocated after the send: 2 s b h bytes each, min(p, m) of them (Korthikanti
    App.B: s b h p 16-bit values, 2.73 GB for 530B; validation F11)."""
    return 2.0 * model.seq / c * b * model.hidden * steps.minimum(p, m, sharpness)


def cp_buffer_bytes(model, t, c, b, ring, fid):
    """Working buffers of CP attention for the layer being computed (transient, once a rank).

    K and V of the whole sequence are G = b s (k_w + v_w) / t 16-bit values (traffic.cp's
    gathered buffer). TransformerEngine's all-gather CP holds the gathered K/V and, in
    backward, full-length dK/dV beside them (2G); its ring keeps every K/V block it
    received during the forward (G) and double-buffers K/V with dK/dV in backward
    (2 x 2G/c): max(G, 4G/c). 0 without CP and in seed mode.
    """
    _, _, k_w, v_w = attention_dims(model)
    g = b * model.seq * (k_w + v_w) / t * BYTES_PER_ELEMENT
    per = jnp.where(ring >= 1, jnp.maximum(g, 4.0 * g / jnp.maximum(c, 1.0)), 2.0 * g)
    return steps.where(fid.real_shapes, jnp.where(c > 1, per, 0.0), 0.0)


# ---------------------------------------------------------------- FP8 recipes (Transformer Engine)
#
# Recipe codes are dse.inputs.plan.FP8_RECIPES: 0 none, 1 delayed, 2 tensorwise (current
# scaling), 3 mxfp8, 4 blockwise. Every FP8 term below is 0 at code 0, and is switched on by
# ``fid.fp8_recipe_terms`` (seed: 0, the GEMM rate only; calibrated: 1).

FP8_BYTES = 1.0                  # E4M3 / E5M2 element (Micikevicius et al. 2022, FP8 Formats for Deep Learning)
FP32_BYTES = 4.0
MX_BLOCK = 32.0                  # MXFP8: one E8M0 scale byte per 32 values (OCP Microscaling Formats v1.0 sec.5)
BLOCKWISE_TILE = 128.0           # Float8BlockScaling: an fp32 scale per 1x128 tile of activations and gradients,
                                 # per 128x128 block of weights (TE transformer_engine/common/recipe Float8BlockScaling)
FP8_SLOTS_PER_GEMM = 5.0         # TE fp8_meta: forward input, weight, output; backward grad-output, grad-input


def fp8_scale_bytes(recipe, weights=False):
    """Scale bytes per FP8 element: one fp32 a tensor for delayed and tensorwise (0 a value), 1/32
    for MXFP8, 4/128 (activations, gradients) or 4/128^2 (weights) for blockwise."""
    block = BLOCKWISE_TILE * BLOCKWISE_TILE if weights else BLOCKWISE_TILE
    return jnp.where(recipe == 3, 1.0 / MX_BLOCK, jnp.where(recipe == 4, FP32_BYTES / block, 0.0))


def fp8_element_bytes(recipe, weights=False):
    """Bytes one FP8 value takes with its share of the scales (1 for per-tensor recipes)."""
    return FP8_BYTES + fp8_scale_bytes(recipe, weights)


def compute_weight_bytes(recipe, param_gather):
    """Bytes a layer weight the GEMMs read: the FP8 value with its scales when the weights are kept in
    FP8 (Megatron-LM --fp8-param-gather: 'Keep the compute param in fp8 ... and perform the param
    all-gather in fp8', arguments.py; pretrain_gpt.py builds the model under TE fp8_model_init), else 2
    (bf16; ZeRO sec.3). The fp32 master copy stays in the optimizer state (OPTIMIZER_BYTES, K = 12)
    either way. torchao's FSDP float8
    all-gather keeps the shard in high precision and casts it before the gather, so its stored bytes
    take ``param_gather`` x ``plan.fp8_cache`` and its gathered bytes ``param_gather``."""
    return jnp.where((recipe >= 1) & (param_gather >= 1), fp8_element_bytes(recipe, True), WEIGHT_BYTES)


def fp8_weight_copy_bytes(layer_params, shard, zero, recipe, param_gather, fid, cache=1.0):
    """FP8 copies of the layer weights a rank keeps beside its compute weights.

    Transformer Engine casts each weight once a step and keeps the FP8 copy across microbatches
    (is_first_microbatch) in row-wise form for the forward GEMM and column-wise (transposed) form
    for the backward data-gradient GEMM, since Hopper's FP8 GEMMs take only the TN layout
    (TE module/layernorm_linear.py: fp8_cast_transpose_fused writes weight_fp8 and weight_t_fp8;
    TE 2.x quantizers set_usage(rowwise, columnwise)): 2 x (1 + scales) bytes a parameter. With
    FP8 parameters (--fp8-param-gather) the row-wise copy is the weight itself (counted at
    ``compute_weight_bytes``) and only the transpose is added. ZeRO-3 keeps the copies of its shard.
    The embedding and output layer are not FP8 (Megatron builds them outside TE), so
    ``layer_params`` excludes them. ``cache`` = 0 (plan.fp8_cache; torchao Float8Linear casts the
    weight at each use, torchao/float8/float8_linear.py): no copy outlives its GEMM.
    """
    if steps.never(recipe >= 1):   # concretely 16-bit (evaluate.fp8_recipe): nothing to trace
        return fid.fp8_recipe_terms * 0.0
    per = fp8_element_bytes(recipe, True) * cache
    copies = jnp.where(param_gather >= 1, 1.0, 2.0)
    local = jnp.where(zero >= 3, layer_params / shard, layer_params)
    return fid.fp8_recipe_terms * jnp.where(recipe >= 1, copies * per * local, 0.0)


def fp8_amax_bytes(model, layers_stage, moe_layers_stage, e, recipe, history, fid):
    """Delayed scaling's scaling state on one rank: for each FP8 GEMM, FP8_SLOTS_PER_GEMM tensors,
    each with an amax history of ``history`` fp32 values (plan.fp8_amax_history; TE DelayedScaling
    amax_history_len, default 1024; Megatron --fp8-amax-history-len, default 1) plus its scale and
    inverse scale. GEMMs a layer: the attention projections (QKV and output; MLA: query down and
    up, key/value down and up, output) and the FFN's two, or in an MoE layer two per local expert
    (E/e; TE GroupedLinear keeps one set per GEMM) and two per shared expert. The other recipes
    compute their scales from the tensor itself: no history.
    """
    if steps.never(recipe == 1):   # no delayed scaling anywhere: no history
        return fid.fp8_recipe_terms * 0.0
    mla = model.kv_lora_rank > 0
    attn = jnp.where(mla, 4.0 + jnp.where(model.q_lora_rank > 0, 1.0, 0.0), 2.0)
    local_experts = jnp.maximum(model.experts / e, 1.0)
    moe_gemms = 2.0 * local_experts + 2.0 * model.shared_experts
    gemms = layers_stage * attn + (layers_stage - moe_layers_stage) * 2.0 + moe_layers_stage * moe_gemms
    per_gemm = FP8_SLOTS_PER_GEMM * (history + 2.0) * FP32_BYTES
    return fid.fp8_recipe_terms * jnp.where(recipe == 1, gemms * per_gemm, 0.0)


def fp8_activation_saving_bytes(model, t, c, b, recompute, sp, recipe, fid, cache=1.0, flash=0.0, share=1.0,
                                modules=SELECTIVE_MODULES):
    """Bytes one layer's stored activations shrink by for one microbatch when the GEMM inputs are
    kept in FP8.

    Transformer Engine saves the quantized input of each FP8 GEMM for its weight-gradient GEMM
    (module/layernorm_linear.py and layernorm_mlp.py save the FP8 ln_out and FC2 input,
    linear.py the FP8 inputmat): the QKV, attention-output projection, FC1 and FC2 inputs the
    recompute mode keeps (``kept_gemm_input_bytes``; Korthikanti Table 2's 2 + 2 + 2 + 8 = 14 sbh of
    34 for GPT-3). Each is 1 + scales bytes instead of 2. The norm inputs, Q, K, V, the scores, the
    activation's input and the dropout masks stay 16-bit (attention in FP8,
    --fp8-dot-product-attention, is not modelled). Full recompute stores only each layer's 16-bit
    input: no change (with a ``share`` of the layers recomputed, the others save as none does). Every TE recipe saves FP8 inputs alike. ``cache`` = 0 (plan.fp8_cache):
    torchao's Float8Linear saves the 16-bit input and weight and casts them again in the backward
    (torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args: ctx.save_for_backward(input_hp,
    weight_hp_t)): nothing saved.
    """
    if steps.never(recipe >= 1):
        return fid.fp8_recipe_terms * 0.0
    inputs = kept_gemm_input_bytes(model, t, c, b, recompute, sp, fid, flash, share, modules)
    saved = inputs * (1.0 - fp8_element_bytes(recipe) / BYTES_PER_ELEMENT)
    return fid.fp8_recipe_terms * cache * jnp.where(recipe >= 1, saved, 0.0)


# ---------------------------------------------------------------- buffers beside the model states
#
# What a rank holds besides weights, gradients, optimizer state and stored activations, term by
# term (calibrated mode; seed mode keeps none of them: ``fid.memory_buffers`` = 0). Each is a
# named function so other terms (FP8 copies, offload staging) sit beside them, not inside.

LOGIT_STORED_BYTES = 4.0     # fp32 logits kept for the backward (Korthikanti sec.4.3: the output layer's 4 s b v / t)
# The loss's peak bytes a logit, beside the stored fp32 ones, is the stack's (Plan.loss_logit_bytes):
# Megatron's vocab-parallel cross-entropy casts the 16-bit logits to fp32 and works in place on them
# (megatron/core/tensor_parallel/cross_entropy.py): 4 + 2 (the 16-bit GEMM output, or in the backward
# the 16-bit logit gradient) = 6. PyTorch's F.cross_entropy on fp32-cast logits (torchtitan, Hugging Face
# ForCausalLMLoss) keeps the log_softmax output (4) and at its backward adds the incoming gradient (4)
# and the input gradient (4): 12.
# NCCL: every communicator keeps a receive buffer of NCCL_BUFFSIZE per channel (NCCL docs, Environment
# Variables: NCCL_BUFFSIZE default 4194304 = 4 MiB, the Simple protocol's buffer) and opens up to
# MAXCHANNELS = 32 channels (NCCL src/include/device.h).
NCCL_BUFFSIZE = 4.0 * 2 ** 20
NCCL_CHANNELS = 32.0
# The CUDA context with PyTorch's kernels loaded: 723 MiB after the first CUDA call (PyTorch forum,
# discuss.pytorch.org/t/73021, answered "the first CUDA call creates the CUDA context").
CUDA_CONTEXT_BYTES = 723.0 * 2 ** 20


def output_layer_stage(p, stage):
    """1 on the stage that holds the output layer and the loss: the last (stage p - 1; p = 1: the only)."""
    return jnp.where(stage >= p - 1.0, 1.0, 0.0)


def logits_bytes(model, t, c, b, fid, loss_logit_bytes=6.0):
    """Logits of one microbatch on the output-layer stage, vocab-parallel over t (Megatron
    vocab-parallel cross-entropy, Shoeybi et al. 2019 sec.3; megatron/core/tensor_parallel/
    cross_entropy.py): s/c x b x V/t values kept in fp32 for the softmax backward (the 4 s b v / t
    of Korthikanti sec.4.3) plus the loss's temporaries at its peak, ``loss_logit_bytes`` - 4 a logit
    (6 - 4: the 16-bit GEMM output, freed after the cast; in the backward the 16-bit logit gradient).
    0 in seed mode (no logits)."""
    sbv = model.seq / c * b * model.vocab / t
    stored = steps.where(fid.real_shapes, LOGIT_STORED_BYTES * sbv, 0.0)
    return stored + fid.memory_buffers * jnp.maximum(loss_logit_bytes - LOGIT_STORED_BYTES, 0.0) * sbv


def output_layer_input_bytes(model, t, c, b, fid):
    """Korthikanti sec.4.3 (validation F09): the final layer norm and the output layer store
    4 s b h / t besides the logits (the p = 1 term's 4 s b h / t; the 4 s b v / t is ``logits_bytes``)."""
    return steps.where(fid.real_shapes, 4.0 * model.seq / c * b * model.hidden / t, 0.0)


def sp_gather_bytes(model, t, c, b, sp, fid):
    """Sequence parallelism all-gathers the sequence-sharded s/c x b x h input of each column-parallel
    GEMM into one 16-bit buffer of the full sequence (Korthikanti sec.4.2.2; Megatron-Core reuses one
    global buffer: tensor_parallel/layers.py, get_global_memory_buffer). Without SP the TP all-reduce
    runs in place: no buffer."""
    on = (sp >= 1) & (t > 1)
    return fid.memory_buffers * jnp.where(on, BYTES_PER_ELEMENT * model.seq / c * b * model.hidden, 0.0)


def zero3_gather_bytes(unit_params, zero, weight_bytes=WEIGHT_BYTES, fid=None, live_params=0.0):
    """ZeRO-3 / FSDP: the gathered (unsharded) 16-bit weights of the unit in use and of the one being
    prefetched, and the unit's unsharded gradient before its reduce-scatter (FSDP, Zhao et al. 2023
    sec.3.3-3.4: one unit computes while the next unit's all-gather is in flight; ZeRO sec.5.3:
    parameters are gathered per layer and freed after use). ``unit_params``: one unit on this rank.
    DeepSpeed gathers parameter by parameter up to ``live_params`` resident at once (its
    stage3_max_live_parameters) and reduces gradients through its reduce bucket (``dp_bucket_bytes``)."""
    fsdp = (2.0 * weight_bytes + GRAD_BYTES) * unit_params
    deepspeed = weight_bytes * jnp.minimum(2.0 * unit_params, live_params)
    return fid.memory_buffers * jnp.where(zero >= 3, jnp.where(live_params > 0, deepspeed, fsdp), 0.0)


def dp_bucket_bytes(grad_params, zero, bucket_params, bucket_copy, fid):
    """DP gradient buckets beyond the gradients themselves, as the stack sets them (Plan fields):
    ``bucket_params`` 16-bit elements of communication buckets (DeepSpeed ZeRO-1/2 reduce_bucket_size
    and allgather_bucket_size), and ``bucket_copy`` = 1 where the buckets hold a second copy of every
    gradient (PyTorch DDP with gradient_as_bucket_view=False, its default: "the saved memory size will
    be equal to the total gradients size" when it is True; DDP runs without ZeRO only)."""
    copy = jnp.where((bucket_copy >= 1) & (zero < 1), GRAD_BYTES * grad_params, 0.0)
    return fid.memory_buffers * (BYTES_PER_ELEMENT * bucket_params + copy)


def nccl_bytes(groups, fid):
    """NCCL's own buffers: NCCL_BUFFSIZE x channels for each communicator this rank is in (``groups``:
    the parallel groups of size > 1). Allocated by NCCL, outside PyTorch's caching allocator."""
    return fid.memory_buffers * groups * NCCL_CHANNELS * NCCL_BUFFSIZE


def context_bytes(fid):
    """The CUDA context (driver state and loaded kernels), outside the caching allocator."""
    return fid.memory_buffers * CUDA_CONTEXT_BYTES


def fragmentation_bytes(transient, fid):
    """The caching allocator's reserved-but-unusable memory: a share ``fid.memory_fragmentation`` of the
    memory it hands out and takes back within a step (``transient``: stored activations, logits, the SP,
    ZeRO-3 and DP buffers), so that part reserves transient / (1 - share). GMLake (Guo et al. ASPLOS
    2024) traces fragmentation to "frequent and irregular memory (de)allocation requests" (recompute,
    offload, ZeRO, LoRA) and measures 15% on average over eight LLMs on A100 80GB. Weights, gradients
    and optimizer state are allocated once and never freed (Megatron-Core's contiguous
    param_and_grad_buffer; FSDP2's sharded parameters): no free blocks sit between them."""
    share = jnp.clip(fid.memory_fragmentation, 0.0, 0.9)
    return transient * share / (1.0 - share)
