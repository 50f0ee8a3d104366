"""Compute: FLOPs a step and the time at the sustained rate.

Seed mode: 6 Psi_active B s + 12 L B s^2 h FLOPs at one sustained rate. Calibrated mode
splits the work into GEMMs (layer matmuls and the logits) and the attention core (the
s^2 terms), runs GEMMs at a rate that falls with the per-rank GEMM shape (and at the FP8
peak when the plan trains in FP8), the attention core at its own rate, and puts the
logits on the last pipeline stage.
"""

from __future__ import annotations

from dse.backend import jnp
from dse.equations import memory, steps

FULL_RECOMPUTE_FLOPS = 4.0 / 3.0  # one extra forward: (1 + 1 + 2) / (1 + 2) (seed 000 sec.6)
FWD_SHARE = 1.0 / 3.0             # forward = 1/3 of forward + backward (Narayanan sec.5.1, eq.3)
FLOPS_PER_MAC = 2.0


def step_flops(params_active, embedding_params, model, gbs, fid):
    """Model FLOPs a step by part: (layer matmuls, attention core, logits).

    Layer matmuls are 6 Psi B s over the active weights that multiply (the input
    embedding is a lookup; the logits are their own V x h matmul), the attention core
    12 L B s^2 h (``attention_flops``: the model's head widths with real shapes), the logits 6 B s h V (seed 000 sec.6: 6 Psi_active B s + 12 L B s^2 h;
    PaLM App.B; Korthikanti eq.7). Their sum is the model FLOPs MFU counts.
    """
    layer = 6.0 * (params_active - embedding_params) * gbs * model.seq     # seed 000 sec.6: 6 Psi B s
    return layer, attention_flops(model, gbs, fid), logits_flops(model, gbs, fid)


def attention_flops(model, gbs, fid=None):
    """Attention core (QK^T and AV), forward + backward: 12 L B s^2 h (PaLM App.B; Korthikanti eq.7).

    With ``fid.real_shapes`` the head widths are the model's: 6 L B s^2 a (d_qk + d_v)
    (forward 2 s^2 a d_qk for QK^T and 2 s^2 a d_v for AV, backward twice that), which is
    12 L B s^2 h at d_qk = d_v = h/a (Gemma 2: a d = 4096 with h = 3584; MLA: d_qk = 192,
    d_v = 128, DeepSeek-V2 sec.2.1.3).
    """
    s = model.seq
    seed = 12.0 * model.layers * gbs * s * s * model.hidden
    if fid is None:
        return seed
    d_qk, d_v, _, _ = memory.attention_dims(model)
    real = 6.0 * model.layers * gbs * s * s * model.heads * (d_qk + d_v) * window_share(model)
    return steps.where(fid.real_shapes, real, seed)


def window_share(model):
    """The attention core's work with sliding-window layers, as a share of full causal attention.

    A causal window of w < s keys: query i attends min(i + 1, w) keys, s w - w^2 / 2 of the s^2 / 2
    causal blocks, a share 2 w/s - (w/s)^2 (Beltagy et al. 2020, Longformer sec.3.1: O(n w); Mistral 7B
    sec.2); a window at least s long is full attention. ``window_layers`` of the L layers take it (0:
    every layer; Gemma 2 and gpt-oss alternate window and full layers)."""
    if steps.never(model.window > 0):
        return 1.0
    s, w = model.seq, model.window
    r = jnp.minimum(steps.safe_div(w, s), 1.0)
    n = jnp.where(model.window_layers > 0, model.window_layers, model.layers)
    share = 1.0 - steps.safe_div(n, model.layers) * (1.0 - (2.0 * r - r * r))
    return jnp.where(w > 0, share, 1.0)


def logits_flops(model, gbs, fid):
    """Output layer, forward + backward: 6 B s h V (Narayanan eq.3, Korthikanti eq.7); 0 in seed mode."""
    return steps.where(fid.real_shapes, 6.0 * gbs * model.seq * model.hidden * model.vocab, 0.0)


def recompute_flops(layer_matmul_flops, attn_flops, recompute, fid, model=None, share=1.0,
                    modules=memory.SELECTIVE_MODULES):
    """Extra forward work of recomputation as (GEMM, attention core) FLOPs, from the one table of
    what each mode recomputes (memory.RECOMPUTE_MODES; Korthikanti sec.5).

    Full: one more forward of every layer (1/3 of its forward + backward; the logits are
    not recomputed). Selective: ``fid.selective_attn_recompute`` more forwards of the
    attention core only (1 in calibrated mode; Korthikanti's hardware-FLOP formula eq.8
    counts s/(6h) more, i.e. 3; seed mode: 0). Op (torchtitan): the forward of wk, wo and (gated)
    w3, their share of the layer's weights (``memory.recomputed_gemm_share``; ``model`` needed).
    Layer-level checkpointing: full's extra forward on ``share`` of the layers only
    (memory.full_recompute_share). ``modules``: selective recompute's (Plan.recompute_modules; the default
    is Megatron's, core_attn): the GEMMs they rerun (memory.module_gemm_share).
    """
    gemms = (memory.is_full_recompute(recompute, share) if model is None
             else memory.recomputed_gemm_share(model, recompute, fid, share, modules))
    gemm = FWD_SHARE * layer_matmul_flops * gemms
    attn = attention_recomputes(recompute, fid, share, modules) * FWD_SHARE * attn_flops
    return gemm, attn


def attention_recomputes(recompute, fid, share=1.0, modules=memory.SELECTIVE_MODULES):
    """Extra forwards of the attention core a step (memory.attention_core_recomputes): 1 under full
    recompute (``share`` of the layers), ``fid.selective_attn_recompute`` under selective with core_attn
    among its ``modules`` (Korthikanti sec.5), else 0."""
    return memory.attention_core_recomputes(recompute, fid, share, modules)


def routed_expert_flops(moe_layers, topk, expert_params, model, gbs):
    """Matmul FLOPs a step of the routed experts: 6 x (MoE layers x top-k x one expert's weights) B s
    (the experts' share of 6 Psi_active B s, seed 000 sec.6)."""
    return 6.0 * moe_layers * topk * expert_params * gbs * model.seq


def moe_padding_flops(expert_flops, load, recompute, share=1.0):
    """Extra expert GEMM work when the busiest expert rank handles ``load`` x its mean share
    (capacity padding or dropless imbalance, ``moe_load_factor``), x4/3 under full recompute."""
    return (load - 1.0) * expert_flops * steps.where(memory.is_full_recompute(recompute, share), FULL_RECOMPUTE_FLOPS, 1.0)


# ---------------------------------------------------------------- achievable GEMM rate


def gemm_intensity(m, n, k, bytes_per_element):
    """FLOPs per HBM byte of an m x n x k GEMM that reads A and B and writes C once."""
    return FLOPS_PER_MAC * m * n * k / (bytes_per_element * (m * n + n * k + m * k))


def gemm_efficiency(intensity, balance, flops, rate, fid):
    """Share of the top GEMM rate reached: 1 / (1 + (knee balance / I)^exponent + t0 rate / flops).

    The second term is the roofline ridge (Williams et al. 2009): ``balance`` = peak
    FLOP/s / HBM bytes/s, I the GEMM's FLOPs per byte. The third is a fixed time t0 a
    GEMM (launch and the last partial wave) at the top ``rate``. knee, exponent and t0
    are fitted on kernel_microbenchmarks.csv (cuBLASLt sweeps). Balance 0 (HBM bandwidth
    unknown) drops the second term; ``fid.gemm_shape`` = 0 gives 1.
    """
    if steps.never(fid.gemm_shape):      # concretely off (seed mode): 1, and the roofline is not traced
        return 1.0
    x = steps.safe_div(fid.gemm_knee * balance, intensity)
    eff = 1.0 / (1.0 + jnp.power(x, fid.gemm_exponent) + steps.safe_div(fid.gemm_overhead_s * rate, flops))
    return steps.where(fid.gemm_shape, eff, 1.0)


def _attention_gemms(model, T, t):
    """(weights in MACs a token, m, n, k) of one layer's attention projections on one TP rank.

    MHA/GQA (Megatron layout, Narayanan sec.2.3): QKV h x (a d + kv(d_k + d_v))/t, output
    a d_v/t x h. MLA (DeepSeek-V2 sec.2.1.2): query down h x r_q and up r_q x a d_qk/t,
    key/value down h x (r_kv + d_rope) and up r_kv x a(d_nope + d_v)/t, output a d_v/t x h.
    """
    h, a = model.hidden, model.heads
    d_qk, d_v, k_w, v_w = memory.attention_dims(model)
    mla = jnp.where(model.kv_lora_rank > 0, 1.0, 0.0)
    gqa = 1.0 - mla
    rq = model.q_lora_rank
    has_rq = jnp.where(rq > 0, 1.0, 0.0)
    rkv = model.kv_lora_rank + model.qk_rope_head_dim
    kv_up = a * (model.qk_nope_head_dim + d_v)
    return (
        (gqa * h * (a * d_qk + k_w + v_w), T, (a * d_qk + k_w + v_w) / t, h),
        (mla * has_rq * h * rq, T, rq, h),
        (mla * (has_rq * rq + (1.0 - has_rq) * h) * a * d_qk, T, a * d_qk / t, jnp.where(rq > 0, rq, h)),
        (mla * h * rkv, T, rkv, h),
        (mla * model.kv_lora_rank * kv_up, T, kv_up / t, model.kv_lora_rank),
        (a * d_v * h, T, h, a * d_v / t),
    )


def tokens_per_expert(tokens, topk, e, experts):
    """Rows of one routed expert's grouped GEMM: a rank's E/e experts receive the k routed
    copies of the T tokens of each of the e ranks of its EP group, T k e / E each on average
    (T without experts)."""
    return jnp.where(experts > 1, tokens * topk * e / experts, tokens)


def layer_gemm_efficiency(model, t, c, e, b, balance, bytes_per_element, rate, fid, t_e=None):
    """FLOP-weighted harmonic efficiency of one rank's GEMMs (Megatron layout, Narayanan sec.2.3).

    Per microbatch a rank multiplies T = b s / c tokens by: the attention projections
    (``_attention_gemms``: GQA or MLA), the FFN h x f/t (x2 when gated) and f/t x h of
    the dense layers, shared experts (T tokens, width f_e / t), routed experts (grouped
    GEMMs of T k e / E tokens each, width f_e / t: fine-grained experts get few tokens an
    expert, DeepSeekMoE sec.3), and the logits h x V/t. Folded EP (``t_e`` = 1 < t,
    degrees.expert_split): the MoE block takes the rank's T / t sequence-parallel tokens, so an expert
    gets T k e / (t E) rows at its whole width f_e.
    """
    if steps.never(fid.gemm_shape):      # every GEMM at 1 (gemm_efficiency): total / total, untraced
        return 1.0
    h = model.hidden
    T = b * model.seq / c
    f = model.ffn_hidden
    fe = memory.expert_width(model)
    up = 1.0 + model.ffn_gated
    n_moe = memory.moe_layers(model, fid)
    n_dense = model.layers - n_moe
    t_e = t if t_e is None else t_e
    tok_e = tokens_per_expert(T * t_e / t, model.topk, e, model.experts)
    L = model.layers
    gemms = tuple((L * w, mm, nn, kk) for w, mm, nn, kk in _attention_gemms(model, T, t)) + (
        # (weight in FLOPs per token, m, n, k)
        # an FFN's up (and gate) and down GEMMs at the up GEMM's shape, as fitted
        (n_dense * (up + 1.0) * h * f, T, up * f / t, h),
        (n_moe * model.shared_experts * (up + 1.0) * h * fe, T, up * fe / t, h),
        (n_moe * model.topk * (up + 1.0) * h * fe, tok_e, up * fe / t_e, h),
        (h * model.vocab, T, model.vocab / t, h),
    )
    total = sum(w for w, *_ in gemms)
    slow = sum(w / gemm_efficiency(gemm_intensity(mm, nn, kk, bytes_per_element), balance,
                                   FLOPS_PER_MAC * mm * nn * kk, rate, fid)
               for w, mm, nn, kk in gemms)
    return total / slow


# A fused (FlashAttention) kernel's work on the attention core, as a share of 12 L B s^2 h:
# its backward recomputes the scores, 5 s^2 matmuls where the count has 4, so forward plus
# backward is 3.5 forwards instead of 3; and under the causal mask of a decoder it skips the
# key blocks above the diagonal, half the s^2 work (Dao 2023, FlashAttention-2, sec.3.1-3.2;
# Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py counts fwd + bwd as
# 3.5 x 4 b s^2 a d, halved when causal: the FLOPs its TFLOP/s are measured on).
FUSED_ATTN_WORK = 3.5 / 3.0 * 0.5


def gemm_top_rates(cluster, fid):
    """(16-bit, FP8) GEMM rates that ``flops_efficiency`` and the shape efficiency scale.

    Accelerators reach different shares of their datasheet peak on their best-shaped
    matmul (stas00/ml-engineering's MAMF table: BF16 A100 SXM 86.9%, H100 SXM 80.3%, B200
    77.6%; FP8 H100 70.9%, B200 76.3%). A cluster's measured
    ``matmul_ceiling`` counts relative to ``fid.matmul_ceiling``, the reference the fitted
    ``flops_efficiency`` is relative to (dse calibrate: the geometric mean over the fitted
    runs' accelerators), so an accelerator without a measurement runs at the reference
    and one with it at peak x its ceiling / the reference. FP8 without its own ceiling:
    the 16-bit factor x ``fp8_efficiency``. Reference 0 (seed): the peaks (x fp8_efficiency).
    """
    peak16, peak8 = cluster.peak_flops_per_s, cluster.peak_fp8_flops_per_s
    if steps.never(fid.matmul_ceiling):      # concretely off (seed): the peaks, no ceiling traced
        return peak16, peak8 * fid.fp8_efficiency
    ref = fid.matmul_ceiling
    per_ref = steps.safe_div(1.0, ref)
    k16 = jnp.where((ref > 0) & (cluster.matmul_ceiling > 0), cluster.matmul_ceiling * per_ref, 1.0)
    k8 = jnp.where((ref > 0) & (cluster.matmul_ceiling_fp8 > 0), cluster.matmul_ceiling_fp8 * per_ref,
                   fid.fp8_efficiency * k16)
    return peak16 * k16, peak8 * k8


def fp8_recipe(fp8, cluster):
    """The FP8 recipe a plan runs (plan.FP8_RECIPES code): its ``fp8``, or 0 (16-bit) on a cluster
    without an FP8 path (peak_fp8_flops_per_s = 0: A100, the seed cluster). A plan concretely in
    16 bits gives its own zeros (so the FP8 terms, ``steps.never`` of a recipe, are not traced)."""
    if steps.never(fp8 >= 1):
        return fp8
    return jnp.where(cluster.peak_fp8_flops_per_s > 0, fp8, 0.0)


def gemm_rates(cluster, fp8, fid):
    """(the layer GEMMs' top rate, the 16-bit top rate): FP8's where the plan runs an FP8 recipe
    (``fp8_recipe``), else 16-bit's (``gemm_top_rates``). A plan concretely without FP8 traces no
    FP8 rate."""
    top16, top8 = gemm_top_rates(cluster, fid)
    has_fp8 = fp8_recipe(fp8, cluster) >= 1
    if steps.never(has_fp8):
        return top16, top16
    return jnp.where(has_fp8, top8, top16), top16


def flash_attn_scale(cluster, fa2, fid):
    """The fused-attention rate of a FlashAttention-2-generation kernel (``fa2`` = 1, stack data)
    on this accelerator relative to the pooled rate: its measured FlashAttention-2 share
    (``cluster.flash_attn_share``, forward + backward TFLOP/s / peak: A100 0.575, H100 0.332,
    kernel_microbenchmarks.csv) over ``fid.flash_attn_share``, the share of the fitted runs that
    use such a kernel (dse calibrate). An Ampere-generation kernel (mma.sync tiles, no Hopper
    wgmma) reaches a smaller share of a Hopper peak. 1 for other kernels, unmeasured
    accelerators, or reference 0 (seed)."""
    if steps.never(fid.flash_attn_share) or steps.never(fa2):      # concretely off: nothing traced
        return 1.0
    ref = fid.flash_attn_share
    on = (fa2 >= 1) & (ref > 0) & (cluster.flash_attn_share > 0)
    return jnp.where(on, cluster.flash_attn_share * steps.safe_div(1.0, ref), 1.0)


def attention_rate(flash, peak16, fid, gemm16=None, scale=1.0):
    """FLOP/s at which the attention core's 12 L B s^2 h count is worked off.

    Unfused (Megatron-LM 2021-22: scores written to HBM, softmax a separate kernel): the
    16-bit GEMM rate (``gemm16``, ``gemm_top_rates``; the peak when not given) x
    flops_efficiency x attn_efficiency, fitted on runs. Fused (``flash`` = 1): the measured
    kernel rate, peak x fused_attn_efficiency (FlashAttention rows of kernel_microbenchmarks.csv)
    x ``scale`` (``flash_attn_scale``: the kernel's own share on this GPU), on the
    FUSED_ATTN_WORK share the kernel computes.
    fused_attn_efficiency = 0 (seed mode) runs fused attention at the unfused rate. A relaxed
    switch (0 < flash < 1, co-design) mixes the two times in proportion.
    """
    unfused = (peak16 if gemm16 is None else gemm16) * fid.flops_efficiency * fid.attn_efficiency
    known = fid.fused_attn_efficiency > 0
    w = jnp.where(known, jnp.clip(flash, 0.0, 1.0), 0.0)
    per_flop_fused = jnp.where(known, FUSED_ATTN_WORK / (peak16 * scale * jnp.where(known, fid.fused_attn_efficiency, 1.0)),
                               0.0)
    return 1.0 / (w * per_flop_fused + (1.0 - w) / unfused)


def attention_call_flops(model, t, c, b, ring, fid=None):
    """Forward attention-core FLOPs of one kernel call: one rank, one layer, one microbatch.

    Without CP one call covers the rank's a/t heads over the whole sequence (F = the
    layer's forward core / t). Causal CP splits the sequence into 2c chunks and gives rank
    i chunks i and 2c-1-i (Megatron-Core/TransformerEngine, transformer_engine/pytorch/attention: get_seq_chunk_ids_for_reordering), so every
    rank holds (2i+1) + (2(2c-1-i)+1) = 4c causal half-blocks: the same F/c work, which is
    the per-rank share ``step_compute_time`` already charges. The all-gather variant runs
    that F/c as one call (TE runs its two chunks on two streams); the ring runs c steps of
    F/c^2 (a step: the local s/c queries against one s/c block of keys, half of it masked or
    skipped), so a fixed cost a call weighs c^2 times more than without CP.
    """
    per_call = FWD_SHARE * attention_flops(model, b, fid) / (model.layers * t)
    return per_call / (c * jnp.where(ring >= 1, c, 1.0))


def attention_call_slowdown(call_flops, whole_flops, rate, fid):
    """Attention-core time at CP's per-call work relative to the unsplit sequence's call.

    The GEMM efficiency curve's fixed time a call (``gemm_efficiency``'s t0 term; the
    roofline term is left out, balance 0: a fused attention kernel's HBM traffic per FLOP
    does not depend on the sequence length, FlashAttention sec.3.2 IO complexity
    Theta(N^2 d^2 / M)) at the attention rate: eff(whole) / eff(call), 1 without CP, so the
    fitted attention rate (attn_efficiency, measured at whole sequences) is scaled, not
    redefined.
    """
    eff = lambda f: gemm_efficiency(1.0, 0.0, f, rate, fid)   # noqa: E731
    return eff(whole_flops) / eff(call_flops)


def step_compute_time(gemm_flops, attn_flops, logits_flops, p, gpus, cluster, fp8, gemm_eff, fid, flash=0.0,
                      attn_calls=None, attn_scale=1.0, rates=None):
    """(compute time of the slowest pipeline stage a step, its attention-core part).

    GEMMs run at the 16-bit (or FP8) top rate (``gemm_top_rates``) x flops_efficiency x shape
    efficiency (the output layer at the 16-bit rate: it is not an FP8 layer), the attention core
    at ``attention_rate`` (the unfused rate is the 16-bit peak x flops_efficiency x
    attn_efficiency: seed 000 sec.6 when all are 1; a fused kernel's x ``attn_scale``,
    ``flash_attn_scale``), slowed by ``attention_call_slowdown``
    when ``attn_calls`` = (FLOPs of one call under CP, of the unsplit call) is given. ``rates``:
    ``gemm_rates(cluster, fp8, fid)`` when the caller has them already. The
    logits sit on the last stage, so that stage works (p-1) x logits/N longer than the mean
    (Narayanan sec.5: embedding and output layers on the first and last stages).

    Which GEMMs an FP8 recipe runs in FP8 (Megatron-LM with Transformer Engine): the layer
    projections and FFN (TE Linear, LayerNormLinear, LayerNormMLP, GroupedLinear) in all three
    passes (forward, data and weight gradients); the output layer (logits) stays 16-bit, because
    Megatron builds it as tensor_parallel.ColumnParallelLinear outside TE (megatron/core/models/
    gpt/gpt_model.py), and so does the attention core (TE DotProductAttention runs BF16 unless
    --fp8-dot-product-attention) and the MoE router.
    """
    peak16 = cluster.peak_flops_per_s
    top_gemm, top16 = gemm_rates(cluster, fp8, fid) if rates is None else rates
    rate_gemm = top_gemm * fid.flops_efficiency * gemm_eff
    # The output layer stays in 16 bits under FP8 training: Transformer Engine's FP8 autocast covers
    # its own linear layers inside the transformer blocks, while Megatron-Core's output layer is a
    # plain tensor_parallel.ColumnParallelLinear (megatron/core/models/gpt/gpt_model.py) and LLM
    # Foundry's is the tied input embedding (F.linear on wte).
    rate_logits = top16 * fid.flops_efficiency * gemm_eff
    rate_attn = attention_rate(flash, peak16, fid, top16, attn_scale)
    attn_s = attn_flops / (gpus * rate_attn)
    if attn_calls is not None:
        attn_s = attn_s * attention_call_slowdown(*attn_calls, rate_attn, fid)
    gemm_s = (gemm_flops - logits_flops) / (gpus * rate_gemm) + p * logits_flops / (gpus * rate_logits)
    return gemm_s + attn_s, attn_s


# ---------------------------------------------------------------- memory-bound work

# Bytes an fp32-gradient Adam step moves per parameter (Megatron-LM optimizer, ZeRO sec.3
# state sizes): gradient norm reads the fp32 grad (4), clipping reads and writes it (8), Adam
# reads the grad (4) and reads and writes master weight, m and v (24), the bf16 copy reads
# the master and writes 2 bytes (6), zeroing the grad buffer writes 4.
OPTIMIZER_STEP_BYTES = 4.0 + 8.0 + 4.0 + 24.0 + 6.0 + 4.0


def elementwise_time(layer_bytes, layers_stage, m, recompute, hbm_bw, fid, share=1.0):
    """Memory-bound ops of a step: ``elementwise_passes`` HBM passes over the bytes a layer's
    non-GEMM ops write (Korthikanti Table 2 activations: norms, GeLU, dropout, softmax),
    per layer, per microbatch; full recompute runs the forward's share again (x4/3; on ``share``
    of the layers with layer-level checkpointing).
    Unknown HBM bandwidth or ``elementwise_passes`` = 0 (seed) gives 0."""
    per_step = layer_bytes * layers_stage * m * steps.where(memory.is_full_recompute(recompute, share),
                                                            FULL_RECOMPUTE_FLOPS, 1.0)
    return _hbm_passes(per_step, hbm_bw, fid)


def loss_time(logit_bytes, m, hbm_bw, fid):
    """The loss's memory-bound ops on the output-layer stage, a microbatch at a time and never
    recomputed: ``elementwise_passes`` HBM passes over the bytes they write, the fp32 logits and
    the loss's temporaries at their peak (``memory.logits_bytes``: the upcast, max, exp-sum and
    softmax of the vocab-parallel cross-entropy and its gradient). A 256K vocabulary on a
    4,096-wide model writes as many bytes here as a fifth of its layers' activations."""
    return _hbm_passes(logit_bytes * m, hbm_bw, fid)


def _hbm_passes(bytes_written, hbm_bw, fid):
    """``elementwise_passes`` HBM passes over ``bytes_written`` at the achieved HBM bandwidth."""
    return fid.elementwise_passes * steps.safe_div(bytes_written, hbm_bw * fid.hbm_efficiency)


def optimizer_time(params_rank, shard, zero, hbm_bw, fid):
    """Adam update on this rank's shard (stage >= 1: 1/d of the parameters), memory-bound."""
    local = params_rank / jnp.where(zero >= 1, shard, 1.0)
    return fid.optimizer_step * steps.safe_div(OPTIMIZER_STEP_BYTES * local, hbm_bw * fid.hbm_efficiency)


def moe_load_factor(capacity_factor, fid):
    """Tokens the busiest expert rank handles per routed token slot: the capacity factor when
    experts pad to capacity (GShard sec.2.2, Switch Transformer sec.2.2), else the dropless
    imbalance max/mean (``fid.moe_imbalance``; seed 1)."""
    return jnp.where(capacity_factor > 0, capacity_factor, fid.moe_imbalance)


# ---------------------------------------------------------------- FP8 casts

CAST_READ_BYTES = 2.0      # a cast reads the 16-bit tensor once
AMAX_READ_BYTES = 2.0      # current (tensorwise) scaling reads it once more first, for the amax
MASTER_READ_BYTES = 4.0    # FP8 parameters are cast from the fp32 master (Megatron --fp8-param-gather)


def fp8_cast_elements(model, t, c, b, sp, layers_stage, moe_layers_stage, fid):
    """(GEMM-input values, grad-output values) one rank quantizes for one microbatch of a stage.

    Each FP8 GEMM quantizes its activation input X (forward) and its output gradient dY
    (backward); per token on one TP rank: attention projections from ``_attention_gemms``
    (input k and output n per GEMM), FFN X = h + f/t and dY = (1 + gated) f/t + h, MoE layers
    top-k routed and the shared experts of width f_e. With SP, the h-wide block inputs and the
    row-parallel grad outputs are quantized on the rank's s/t shard before the all-gather
    (TE module/layernorm_linear.py, base.py grad_output_preprocess), so they count /t.
    """
    h = model.hidden
    T = b * model.seq / c
    ts = jnp.where(sp >= 1, t, 1.0)
    gemms = _attention_gemms(model, T, t)
    on = [jnp.where(w > 0, 1.0, 0.0) for w, *_ in gemms]
    wide_in = (True, True, False, True, False, False)     # QKV, query down, key/value down read the block input
    attn_x = sum(o * (k / ts if wide else k) for o, (_, _, _, k), wide in zip(on, gemms, wide_in))
    attn_dy = sum(o * n for o, (_, _, n, _) in zip(on[:-1], gemms[:-1])) + on[-1] * h / ts   # output proj: row-parallel
    up = 1.0 + model.ffn_gated
    f, fe = model.ffn_hidden, memory.expert_width(model)
    ffn_x, ffn_dy = h / ts + f / t, up * f / t + h / ts
    k = jnp.where(model.experts > 1, model.topk, 0.0) + model.shared_experts
    moe_x, moe_dy = k * (h / ts + fe / t), k * (up * fe / t + h / ts)
    dense_stage = layers_stage - moe_layers_stage
    x = T * (layers_stage * attn_x + dense_stage * ffn_x + moe_layers_stage * moe_x)
    dy = T * (layers_stage * attn_dy + dense_stage * ffn_dy + moe_layers_stage * moe_dy)
    return x, dy


def fp8_cast_time(x_values, dy_values, m, recompute, layer_params, recipe, param_gather, hbm_bw, fid, cache=1.0,
                  share=1.0):
    """Memory-bound FP8 quantization a step, at the HBM bandwidth (x hbm_efficiency).

    Each quantized tensor is needed row-wise and column-wise (transposed) in FP8 with its scales.
    Transformer Engine (``cache`` = 1, plan.fp8_cache) reads it once in 16 bits and writes both
    (TE fp8_cast_transpose_fused; TE 2.x quantizers with rowwise and columnwise usage):
    2 + 2 (1 + scales) bytes a value; its weights are cast once a step (TE keeps the FP8
    weights across microbatches), from the fp32 master with FP8 parameters. torchao's
    Float8Linear (``cache`` = 0) casts at each use, the forward and again the backward (it
    saves the 16-bit tensors, torchao/float8/float8_linear.py): two reads each writing one copy,
    2 (2 + 1 + scales), its weights twice a microbatch. Delayed scaling takes the amax in the same
    pass (the scale comes from the history); current (tensorwise) scaling needs the amax before
    it casts, so every read pass reads the tensor once more (Float8CurrentScaling; torchao dynamic
    scaling); block recipes take each block's amax in the pass and write 1/32 (MXFP8) or 4/128
    (blockwise) scale bytes a value. The forward inputs are cast again under full recompute (of
    ``share`` of the layers).
    Unknown HBM bandwidth gives 0.
    """
    reads = 2.0 - cache                                          # read passes a tensor: 1 (TE) or 2 (torchao)
    amax = jnp.where(recipe == 2, AMAX_READ_BYTES, 0.0)
    act = reads * (CAST_READ_BYTES + amax) + 2.0 * memory.fp8_element_bytes(recipe)
    read_bytes = jnp.where(param_gather * cache >= 1, MASTER_READ_BYTES, CAST_READ_BYTES)
    wgt = reads * (read_bytes + jnp.where(recipe == 2, read_bytes, 0.0)) + 2.0 * memory.fp8_element_bytes(recipe, True)
    casts_w = jnp.where(cache >= 1, 1.0, m)                      # weight casts a step
    again = steps.where(memory.is_full_recompute(recompute, share), 2.0, 1.0)
    per_step = m * (again * x_values + dy_values) * act + casts_w * layer_params * wgt
    t = steps.safe_div(per_step, hbm_bw * fid.hbm_efficiency)
    return fid.fp8_recipe_terms * jnp.where(recipe >= 1, t, 0.0)
