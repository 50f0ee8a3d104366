"""Parameters and memory per rank: model states (ZeRO) and activations (Korthikanti).

Every function is elementwise in its array arguments.
"""

from __future__ import annotations

from dse.backend import jnp
from dse.equations import steps

BYTES_PER_ELEMENT = 2.0          # bf16 weights, gradients and activations (seed 000)
WEIGHT_BYTES = 2.0               # ZeRO sec.3: fp16 parameters
GRAD_BYTES = 2.0                 # ZeRO sec.3: fp16 gradients
OPTIMIZER_BYTES = 12.0           # ZeRO sec.3: K = 12 (fp32 master weights, momentum, variance)


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


def params_per_rank(model, fid, t, p, e, layer_share=1.0, embed_on=1.0):
    """(dense, expert) parameters on one first-stage rank (seed 000 sec.1: Psi/(t p), experts / e).

    The layers split evenly over p stages; the input embedding lives on the first stage
    and the output layer on the last (both on the one stage when p = 1), split over t
    (Megatron: vocab-parallel embedding, Narayanan sec.5). An uneven split gives a stage
    ``layer_share`` = its layers / (L/p) of the layer weights; ``embed_on`` = 0 for a
    stage without the embedding.
    """
    _, _, dense, experts = param_counts(model, fid)
    embed = embedding_params(model, fid)
    first = jnp.where(p > 1, 0.5, 1.0) * embed
    return ((dense - embed) / (t * p) * layer_share + embed_on * first / t,
            experts / (t * p * e) * layer_share)


def dualpipe_weight_factor(schedule):
    """DualPipe keeps two copies of the parameters (DeepSeek-V3 Table 2: 'Parameter 2x')."""
    return jnp.where(schedule >= 2, 2.0, 1.0)


# ---------------------------------------------------------------- model states


def model_state_bytes(params, shard, zero, weight_bytes=WEIGHT_BYTES):
    """Weights, gradients and Adam state of ``params`` sharded over ``shard`` ranks.

    ZeRO (Rajbhandari et al. 2020) sec.5 / Fig.1: stage k shards the first k of
    {optimizer, gradients, weights}: 16 Psi, (4 + 12/d) Psi, (2 + 14/d) Psi, 16 Psi/d.
    ``weight_bytes``: 1 for FP8 compute weights (Megatron-LM --fp8-param-gather: the fp32
    master stays in the optimizer state), else 2.
    """
    w = weight_bytes * params
    g = GRAD_BYTES * params
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


KORTHIKANTI_ATTENTION = 11.0   # Korthikanti sec.4.1: QKV input 2, Q and K 4, V 2, projection input 2, dropout mask 1 (x sbh)
KORTHIKANTI_LAYER = 34.0       # the whole layer without the 5as/h scores (x sbh)


def mla_attention_coefficient(model, recompute):
    """Stored attention activations of an MLA layer in units of s b h (16-bit, 1-byte mask).

    Korthikanti sec.4.1's 11 sbh term, counted tensor by tensor for MLA (DeepSeek-V2 sec.2.1.2):
    the block input 2h, the query latent 2 r_q and key/value latent 2 r_kv (inputs of the
    up-projections), Q and K 2 a d_qk each, V 2 a d_v, the output projection's input
    2 a d_v, the dropout mask h. Selective recompute re-runs the up-projections (DeepSeek-V3
    sec.3.2.3: "recompute ... MLA up-projections"), so Q, K and V are not stored.
    """
    h, a = model.hidden, model.heads
    d_qk, d_v, _, _ = attention_dims(model)
    kept = 2.0 * h + 2.0 * model.q_lora_rank + 2.0 * model.kv_lora_rank + 2.0 * a * d_v + h
    qkv = 4.0 * a * d_qk + 2.0 * a * d_v
    return (kept + jnp.where(recompute >= 1, 0.0, qkv)) / h


def activation_bytes_per_layer(model, t, c, b, recompute, sp, fid=None):
    """Activation bytes of one layer for one microbatch on one rank.

    Korthikanti et al. 2022, Table 2 (16-bit activations, 1-byte dropout masks), with
    the sequence split over c context-parallel ranks (each rank holds s/c tokens and
    an (s/c) x s slice of the attention scores):
      TP, no SP:          sbh (10 + 24/t + 5as/(ht))    selective: sbh (10 + 24/t)
      TP + SP:            sbh (34/t + 5as/(ht))        selective: 34 sbh / t
      full recompute:     2 sbh (no SP), 2 sbh / t (SP: the stored input is sharded)
    With ``fid.real_shapes`` an MLA model's attention part is ``mla_attention_coefficient``
    instead of 11 (the non-score terms scale by (34 - 11 + mla) / 34); other models keep
    Korthikanti's terms.
    """
    s = model.seq
    h = model.hidden
    a = model.heads
    sbh = (s / c) * b * h
    attn = 5.0 * a * s / (h * t)                       # Korthikanti Table 2: 5as/(ht)
    scale = 1.0
    if fid is not None:
        mla = (KORTHIKANTI_LAYER - KORTHIKANTI_ATTENTION + mla_attention_coefficient(model, recompute)) / KORTHIKANTI_LAYER
        scale = steps.where(fid.real_shapes, jnp.where(model.kv_lora_rank > 0, mla, 1.0), 1.0)
    no_sp = jnp.where(recompute >= 1, (10.0 + 24.0 / t) * scale, (10.0 + 24.0 / t) * scale + attn)  # eq.(2)
    with_sp = jnp.where(recompute >= 1, 34.0 / t * scale, 34.0 / t * scale + attn)                  # eq.(4), eq.(6)
    per = jnp.where(sp >= 1, with_sp, no_sp)
    full = jnp.where(sp >= 1, 2.0 / t, 2.0)            # Korthikanti sec.5
    per = jnp.where(recompute >= 2, full, per)
    return sbh * per


def interleave_factor(p, v):
    """Korthikanti sec.4.2.3: interleaving with v chunks holds (1 + (p-1)/(p v)) more."""
    return jnp.where(v > 1, 1.0 + (p - 1.0) / (p * v), 1.0)


def activation_bytes(model, t, c, p, b, m, v, recompute, sp, sharpness=None, schedule=0.0,
                     stage_layers=None, stage=0.0, fid=None, fp8=0.0, fp8_cache=1.0):
    """First-stage activations: min(p, m) microbatches of ceil(L/p) layers (seed 000 sec.2).

    DualPipe holds p + 1 microbatches instead of p (DeepSeek-V3 Table 2). An uneven split
    passes the stage's ``stage_layers`` and its index ``stage``: 1F1B stage i holds
    min(p - i, m) microbatches (Narayanan sec.2.2). ``fp8``: the recipe code in use; its
    GEMM inputs are stored in FP8 (``fp8_activation_saving_bytes``).
    """
    in_flight = steps.minimum(p - stage, m, sharpness)
    in_flight = in_flight * jnp.where(schedule >= 2, (p + 1.0) / p, 1.0)
    layers = steps.ceil(model.layers / p, sharpness) if stage_layers is None else stage_layers
    per_layer = activation_bytes_per_layer(model, t, c, b, recompute, sp, fid)
    if fid is not None:
        per_layer = per_layer - fp8_activation_saving_bytes(model, t, c, b, recompute, sp, fp8, fid, fp8_cache)
    return in_flight * layers * per_layer * interleave_factor(p, v)


def embedding_activation_bytes(model, t, c, p, b, fid):
    """Korthikanti sec.4.3: the first stage also stores the embedding dropout output for
    its p in-flight microbatches, s b h p / t; 0 in seed mode. The output layer's
    4 s b h / t (1 + V/h) (F09 in validation/formulas_and_checks.csv, on the first stage when
    p = 1) lives on the output-layer stage: ``output_layer_input_bytes`` + ``logits_bytes``."""
    sbh = model.seq / c * b * model.hidden
    return steps.where(fid.real_shapes, sbh * p / t, 0.0)


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
LAYER_GEMM_INPUTS_SP = 14.0      # Korthikanti Table 2 terms that are GEMM inputs (x sbh): QKV 2, projection 2, FC1 2, FC2 8
LAYER_GEMM_INPUTS_REPLICATED = 4.0   # without SP, the QKV and FC1 inputs (4) sit in the replicated 10 sbh


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
    mla = model.kv_lora_rank > 0
    attn = jnp.where(mla, 4.0 + jnp.where(model.q_lora_rank > 0, 1.0, 0.0), 2.0)
    local_experts = jnp.maximum(model.experts / e, 1.0)
    moe_gemms = 2.0 * local_experts + 2.0 * model.shared_experts
    gemms = layers_stage * attn + (layers_stage - moe_layers_stage) * 2.0 + moe_layers_stage * moe_gemms
    per_gemm = FP8_SLOTS_PER_GEMM * (history + 2.0) * FP32_BYTES
    return fid.fp8_recipe_terms * jnp.where(recipe == 1, gemms * per_gemm, 0.0)


def fp8_activation_saving_bytes(model, t, c, b, recompute, sp, recipe, fid, cache=1.0):
    """Bytes one layer's stored activations shrink by for one microbatch when the GEMM inputs are
    kept in FP8.

    Transformer Engine saves the quantized input of each FP8 GEMM for its weight-gradient GEMM
    (module/layernorm_linear.py and layernorm_mlp.py save the FP8 ln_out and FC2 input,
    linear.py the FP8 inputmat): the QKV, attention-output projection, FC1 and FC2 inputs,
    Korthikanti Table 2's 2 + 2 + 2 + 8 = 14 sbh of 34 (with SP, all /t; without SP the QKV and
    FC1 inputs, 4 sbh, are replicated). Each is 1 + scales bytes instead of 2. The LayerNorm
    inputs, Q, K, V, the softmax output, the GeLU input and the dropout masks stay 16-bit
    (attention in FP8, --fp8-dot-product-attention, is not modelled). Full recompute stores only
    each layer's 16-bit input: no change. Every TE recipe saves FP8 inputs alike. ``cache`` = 0
    (plan.fp8_cache): torchao's Float8Linear saves the 16-bit input and weight and casts them again
    in the backward (torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args:
    ctx.save_for_backward(input_hp, weight_hp_t)): nothing saved.
    """
    sbh = (model.seq / c) * b * model.hidden
    inputs = jnp.where(sp >= 1, LAYER_GEMM_INPUTS_SP / t,
                       LAYER_GEMM_INPUTS_REPLICATED + (LAYER_GEMM_INPUTS_SP - LAYER_GEMM_INPUTS_REPLICATED) / t)
    saved = sbh * inputs * (1.0 - fp8_element_bytes(recipe) / BYTES_PER_ELEMENT)
    return fid.fp8_recipe_terms * cache * jnp.where((recipe >= 1) & (recompute < 2), saved, 0.0)


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


def fragmentation_bytes(allocated, fid):
    """The caching allocator's reserved-but-unusable memory: a share ``fid.memory_fragmentation`` of
    what it reserves, so reserved = allocated / (1 - share) (GMLake, Guo et al. ASPLOS 2024: PyTorch's
    allocator leaves 15% of reserved memory fragmented on average over eight LLMs on A100 80GB)."""
    share = jnp.clip(fid.memory_fragmentation, 0.0, 0.9)
    return allocated * share / (1.0 - share)
