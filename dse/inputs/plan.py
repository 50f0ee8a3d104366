"""The plan: parallel degrees, batch, ZeRO, recompute, schedule and the switches a stack sets."""

from __future__ import annotations

import dataclasses

import jax

from dse.inputs.base import Inputs

__all__ = ["Plan", "RECOMPUTE", "RECOMPUTE_NAMES", "SCHEDULES"]

# Recompute modes, as numbers so they broadcast (Korthikanti et al. 2022, Sec. 5).
RECOMPUTE = {"none": 0.0, "selective": 1.0, "full": 2.0}
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE.items()}   # 0.0 -> "none" (0 looks up the same)
# Pipeline schedules, as numbers (DeepSeek-V3 report, Table 2).
SCHEDULES = {"1f1b": 0.0, "zb1p": 1.0, "dualpipe": 2.0}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Plan(Inputs):
    """How one training step is laid out. d and m are derived, never given."""

    tp: jax.Array               # t, tensor-parallel degree
    pp: jax.Array               # p, pipeline stages
    mbs: jax.Array              # b, sequences per microbatch
    gbs: jax.Array              # B, global batch in sequences
    cp: jax.Array = 1.0         # c, context-parallel degree
    ep: jax.Array = 1.0         # e, expert-parallel degree (carved from DP)
    zero: jax.Array = 1.0       # ZeRO stage 0..3
    recompute: jax.Array = 1.0  # 0 none, 1 selective, 2 full
    vpp: jax.Array = 1.0        # v, interleaved model chunks per stage
    sp: jax.Array = 1.0         # sequence parallelism on (1) or off (0)
    rank_order: jax.Array = 0.0       # index into topology.RANK_ORDERS (0: [TP, CP, EP, PP, DP])
    torus_order: jax.Array = 0.0      # index into topology.TORUS_ORDERS (0: ranks fill x, then y, z)
    dp_hierarchical: jax.Array = 0.0  # 1: DP all-reduce = RS in domain, AR on rails, AG in domain
    schedule: jax.Array = 0.0   # 0 1F1B (interleaved when vpp > 1), 1 zero-bubble ZB1P, 2 DualPipe (SCHEDULES)
    grad_accum: jax.Array = 0.0  # 0 keep unsharded gradients locally, reduce once a step; 1 reduce-scatter every microbatch
    fp8: jax.Array = 0.0        # 1: GEMMs in FP8 at the cluster's FP8 peak (Transformer Engine); 0: 16-bit
    cp_ring: jax.Array = 0.0    # 0: CP by K/V all-gather (Llama 3); 1: ring attention (hidden while compute is longer)
    overlap_grad_reduce: jax.Array = 1.0  # 1: DP sync hides behind backward (seed); 0: after it (Megatron-LM 2021-22)
    tp_comm_overlap: jax.Array = 0.0      # 1: TP collectives pipelined with GEMMs (TE userbuffers); hidden share fid.tp_comm_overlap
    flash_attention: jax.Array = 0.0      # 1: fused attention (FlashAttention): no s^2 scores stored or moved
    capacity_factor: jax.Array = 0.0      # MoE expert capacity / mean load (0: dropless, no padding)
    keep_stage_outputs: jax.Array = 0.0   # 1: no output-tensor deallocation (Korthikanti App.B): +2 s b h p bytes
