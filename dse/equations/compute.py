"""Compute: FLOPs a step and the time at the sustained rate.

Seed mode: 6 Psi_active B s + 12 L B s^2 h FLOPs at one sustained rate. Calibrated mode
splits the work into GEMMs (layer matmuls and the logits) and the attention core (the
s^2 terms), runs GEMMs at a rate that falls with the per-rank GEMM shape (and at the FP8
peak when the plan trains in FP8), the attention core at its own rate, and puts the
logits on the last pipeline stage.
"""

from __future__ import annotations

import jax.numpy as jnp

from dse.equations import steps

FULL_RECOMPUTE_FLOPS = 4.0 / 3.0  # one extra forward: (1 + 1 + 2) / (1 + 2) (seed 000 sec.6)
FWD_SHARE = 1.0 / 3.0             # forward = 1/3 of forward + backward (Narayanan sec.5.1, eq.3)
FLOPS_PER_MAC = 2.0


def step_flops(params_active, embedding_params, model, gbs, fid):
    """Model FLOPs a step by part: (layer matmuls, attention core, logits).

    Layer matmuls are 6 Psi B s over the active weights that multiply (the input
    embedding is a lookup; the logits are their own V x h matmul), the attention core
    12 L B s^2 h, the logits 6 B s h V (seed 000 sec.6: 6 Psi_active B s + 12 L B s^2 h;
    PaLM App.B; Korthikanti eq.7). Their sum is the model FLOPs MFU counts.
    """
    layer = 6.0 * (params_active - embedding_params) * gbs * model.seq     # seed 000 sec.6: 6 Psi B s
    return layer, attention_flops(model, gbs), logits_flops(model, gbs, fid)


def attention_flops(model, gbs):
    """Attention core (QK^T and AV), forward + backward: 12 L B s^2 h (PaLM App.B; Korthikanti eq.7)."""
    s = model.seq
    return 12.0 * model.layers * gbs * s * s * model.hidden


def logits_flops(model, gbs, fid):
    """Output layer, forward + backward: 6 B s h V (Narayanan eq.3, Korthikanti eq.7); 0 in seed mode."""
    return steps.where(fid.real_shapes, 6.0 * gbs * model.seq * model.hidden * model.vocab, 0.0)


def recompute_flops(layer_matmul_flops, attn_flops, recompute, fid):
    """Extra forward work of recomputation as (GEMM, attention core) FLOPs (Korthikanti sec.5).

    Full: one more forward of every layer (1/3 of its forward + backward; the logits are
    not recomputed). Selective: ``fid.selective_attn_recompute`` more forwards of the
    attention core only (1 in calibrated mode; Korthikanti's hardware-FLOP formula eq.8
    counts s/(6h) more, i.e. 3; seed mode: 0).
    """
    full = recompute >= 2
    gemm = jnp.where(full, FWD_SHARE * layer_matmul_flops, 0.0)
    attn = jnp.where(full, 1.0, jnp.where(recompute >= 1, fid.selective_attn_recompute, 0.0)) * FWD_SHARE * attn_flops
    return gemm, attn


def routed_expert_flops(moe_layers, topk, expert_params, model, gbs):
    """Matmul FLOPs a step of the routed experts: 6 x (MoE layers x top-k x one expert's weights) B s
    (the experts' share of 6 Psi_active B s, seed 000 sec.6)."""
    return 6.0 * moe_layers * topk * expert_params * gbs * model.seq


def moe_padding_flops(expert_flops, load, recompute):
    """Extra expert GEMM work when the busiest expert rank handles ``load`` x its mean share
    (capacity padding or dropless imbalance, ``moe_load_factor``), x4/3 under full recompute."""
    return (load - 1.0) * expert_flops * jnp.where(recompute >= 2, FULL_RECOMPUTE_FLOPS, 1.0)


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
    x = steps.safe_div(fid.gemm_knee * balance, intensity)
    eff = 1.0 / (1.0 + jnp.power(x, fid.gemm_exponent) + steps.safe_div(fid.gemm_overhead_s * rate, flops))
    return steps.where(fid.gemm_shape, eff, 1.0)


def layer_gemm_efficiency(model, t, c, e, b, balance, bytes_per_element, rate, fid):
    """FLOP-weighted harmonic efficiency of one rank's GEMMs (Megatron layout, Narayanan sec.2.3).

    Per microbatch a rank multiplies T = b s / c tokens by: QKV h x (h + 2 kv)/t, the
    output projection h/t x h, the FFN h x f/t (x2 when gated) and f/t x h, routed
    experts (T k e / E tokens each, width f_e / t), and the logits h x V/t.
    """
    h = model.hidden
    T = b * model.seq / c
    kv = h * model.kv_heads / model.heads
    f = model.ffn_hidden
    fe = jnp.where(model.expert_ffn_hidden > 0, model.expert_ffn_hidden, f)
    up = 1.0 + model.ffn_gated
    moe = model.experts > 1
    tok_e = jnp.where(moe, T * model.topk * e / model.experts, T)
    gemms = (  # (weight in FLOPs per token, m, n, k)
        (model.layers * h * (h + 2.0 * kv), T, (h + 2.0 * kv) / t, h),
        (model.layers * h * h, T, h, h / t),
        (jnp.where(moe, 0.0, 1.0) * model.layers * (up + 1.0) * h * f, T, up * f / t, h),
        (jnp.where(moe, 1.0, 0.0) * model.layers * model.topk * (up + 1.0) * h * fe, tok_e, up * fe / t, h),
        (h * model.vocab, T, model.vocab / t, h),
    )
    total = sum(w for w, *_ in gemms)
    slow = sum(w / gemm_efficiency(gemm_intensity(mm, nn, kk, bytes_per_element), balance,
                                   FLOPS_PER_MAC * mm * nn * kk, rate, fid)
               for w, mm, nn, kk in gemms)
    return total / slow


def step_compute_time(gemm_flops, attn_flops, logits_flops, p, gpus, cluster, fp8, gemm_eff, fid):
    """(compute time of the slowest pipeline stage a step, its attention-core part).

    GEMMs run at the 16-bit (or FP8) peak x flops_efficiency x shape efficiency, the
    attention core at the 16-bit peak x flops_efficiency x attn_efficiency (seed 000
    sec.6 when all are 1). The logits sit on the last stage, so that stage works
    (p-1) x logits/N longer than the mean (Narayanan sec.5: embedding and output layers
    on the first and last stages).
    """
    peak16 = cluster.peak_flops_per_s
    has_fp8 = (fp8 >= 1) & (cluster.peak_fp8_flops_per_s > 0)
    peak_gemm = jnp.where(has_fp8, cluster.peak_fp8_flops_per_s * fid.fp8_efficiency, peak16)
    rate_gemm = peak_gemm * fid.flops_efficiency * gemm_eff
    rate_attn = peak16 * fid.flops_efficiency * fid.attn_efficiency
    attn_s = attn_flops / (gpus * rate_attn)
    return gemm_flops / (gpus * rate_gemm) + attn_s + (p - 1.0) * logits_flops / (gpus * rate_gemm), attn_s


# ---------------------------------------------------------------- memory-bound work

# Bytes an fp32-gradient Adam step moves per parameter (Megatron-LM optimizer, ZeRO sec.3
# state sizes): gradient norm reads the fp32 grad (4), clipping reads and writes it (8), Adam
# reads the grad (4) and reads and writes master weight, m and v (24), the bf16 copy reads
# the master and writes 2 bytes (6), zeroing the grad buffer writes 4.
OPTIMIZER_STEP_BYTES = 4.0 + 8.0 + 4.0 + 24.0 + 6.0 + 4.0


def elementwise_time(layer_bytes, layers_stage, m, recompute, hbm_bw, fid):
    """Memory-bound ops of a step: ``elementwise_passes`` HBM passes over the bytes a layer's
    non-GEMM ops write (Korthikanti Table 2 activations: norms, GeLU, dropout, softmax),
    per layer, per microbatch; full recompute runs the forward's share again (x4/3).
    Unknown HBM bandwidth or ``elementwise_passes`` = 0 (seed) gives 0."""
    per_step = layer_bytes * layers_stage * m * jnp.where(recompute >= 2, FULL_RECOMPUTE_FLOPS, 1.0)
    return fid.elementwise_passes * steps.safe_div(per_step, hbm_bw * fid.hbm_efficiency)


def optimizer_time(params_rank, shard, zero, hbm_bw, fid):
    """Adam update on this rank's shard (stage >= 1: 1/d of the parameters), memory-bound."""
    local = params_rank / jnp.where(zero >= 1, shard, 1.0)
    return fid.optimizer_step * steps.safe_div(OPTIMIZER_STEP_BYTES * local, hbm_bw * fid.hbm_efficiency)


def moe_load_factor(capacity_factor, fid):
    """Tokens the busiest expert rank handles per routed token slot: the capacity factor when
    experts pad to capacity (GShard sec.2.2, Switch Transformer sec.2.2), else the dropless
    imbalance max/mean (``fid.moe_imbalance``; seed 1)."""
    return jnp.where(capacity_factor > 0, capacity_factor, fid.moe_imbalance)
