"""Fidelity: the numeric knobs that separate seed mode from richer modes.

Seed mode (``Fidelity.seed()``) reproduces the simulator of seed 000 exactly:
Psi = 12 L h^2, top-2 routing over half-width experts, no embeddings, no latency,
sustained FLOP/s equal to the cluster's rate, TP/EP/CP/PP fully exposed and DP
hidden behind up to 2/3 of compute. Every knob is a float array, so a calibrated
mode can fit them by gradient through the same ``evaluate``; each richer effect sits
behind a knob whose seed value switches it off.
"""

from __future__ import annotations

import dataclasses

import jax

from dse.inputs import _Inputs

__all__ = ["Fidelity", "resolve"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Fidelity(_Inputs):
    """Knobs of the model. Defaults are seed mode."""

    flops_efficiency: jax.Array = 1.0   # sustained / peak FLOP/s (seed: the cluster's rate is sustained)
    dp_overlap: jax.Array = 2.0 / 3.0   # share of compute DP traffic hides behind (seed 000 sec.6)
    tp_overlap: jax.Array = 0.0         # share of TP wire time hidden (seed: exposed)
    cp_overlap: jax.Array = 0.0         # share of CP wire time hidden
    ep_overlap: jax.Array = 0.0         # share of EP wire time hidden (DualPipe: ~1)
    pp_overlap: jax.Array = 0.0         # share of PP wire time hidden
    latency: jax.Array = 0.0            # 1 adds alpha per ring step; 0 ignores latency (seed)
    real_shapes: jax.Array = 0.0        # 1: GQA, gated FFN, real experts, embeddings; 0: 12 L h^2
    seed_topk: jax.Array = 2.0          # seed's routing when real_shapes = 0
    seed_expert_width: jax.Array = 0.5  # seed's expert width relative to the 4h FFN
    memory_overhead: jax.Array = 0.0    # temporary buffers and fragmentation, share of the total
    # ---- calibrated-mode knobs (seed values switch each effect off)
    gemm_shape: jax.Array = 0.0         # 1: GEMM efficiency falls with per-rank shape (compute.gemm_efficiency)
    gemm_knee: jax.Array = 1.0          # intensity / machine balance where GEMMs reach half their top rate
    gemm_exponent: jax.Array = 2.0      # sharpness of that knee (fitted on kernel_microbenchmarks.csv)
    gemm_overhead_s: jax.Array = 0.0    # fixed time per GEMM (launch, last partial wave)
    fp8_efficiency: jax.Array = 1.0     # sustained FP8 GEMM rate / FP8 peak, relative to the 16-bit one
    attn_efficiency: jax.Array = 1.0    # attention-core (s^2) rate relative to the GEMM rate
    selective_attn_recompute: jax.Array = 0.0  # attention-core forwards re-run by selective recompute
    zero3_microbatch: jax.Array = 0.0   # 1: ZeRO-3 gathers weights every microbatch (FSDP); 0: once a step (seed)
    bw_up_efficiency: jax.Array = 1.0   # achieved / nominal scale-up bandwidth (bus bandwidth)
    bw_out_efficiency: jax.Array = 1.0  # achieved / nominal scale-out bandwidth
    tp_comm_overlap: jax.Array = 0.0    # share of TP wire time hidden when the plan turns TP overlap on
    elementwise_passes: jax.Array = 0.0  # HBM passes over a layer's activations by memory-bound ops (norms, GeLU, dropout, softmax)
    optimizer_step: jax.Array = 0.0     # 1: the Adam update's HBM traffic is added to the step
    hbm_efficiency: jax.Array = 1.0     # achieved / datasheet HBM bandwidth (STREAM)
    moe_imbalance: jax.Array = 1.0      # dropless MoE: busiest expert rank's tokens / mean

    @classmethod
    def seed(cls) -> "Fidelity":
        return cls.make()


def resolve(fidelity) -> Fidelity:
    """Accept a Fidelity or a mode name."""
    if isinstance(fidelity, Fidelity):
        return fidelity
    if fidelity == "seed":
        return Fidelity.seed()
    if fidelity == "calibrated":
        from dse import calibrated  # the calibrated mode registers its parameters there

        return calibrated.fidelity()
    raise ValueError(f"fidelity: unknown mode {fidelity!r}; allowed: seed, calibrated")
