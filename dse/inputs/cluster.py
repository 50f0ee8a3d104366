"""The cluster: accelerators, the scale-up domain, the scale-out tiers or a torus."""

from __future__ import annotations

import dataclasses

from dse.backend import register_dataclass
from dse.inputs.base import Inputs

__all__ = ["Cluster", "TOPOLOGIES", "FP8_SCALINGS", "FP8_SCALING_NEEDED"]

# Network topologies, as numbers so they broadcast (dse/equations/topology.py). A fat tree has two
# tiers (seed 000), or three when island_gpus > 0 (islands joined by an oversubscribed core).
TOPOLOGIES = {"fat-tree": 0.0, "rail-only": 1.0, "torus": 2.0}

# FP8 scalings an accelerator's tensor cores run, each level holding the ones before it, as
# Transformer Engine's "Datatype and hardware support matrix" (nvidia.github.io/TransformerEngine/
# support_matrix.html) lists them by compute capability: Ampere (8.0) none; Ada (8.9) per-tensor
# (the DelayedScaling and Float8CurrentScaling recipes); Hopper (9.0) also Float8BlockScaling;
# Blackwell data center (10.0) also MXFP8BlockScaling (hardware E8M0 block scales). The default
# (3) refuses nothing; a preset says what its hardware runs.
FP8_SCALINGS = {"none": 0.0, "per-tensor": 1.0, "blockwise": 2.0, "mxfp8": 3.0}
# the level each Plan.fp8 recipe (dse/inputs/plan.py FP8_RECIPES) needs: none, delayed, tensorwise, mxfp8, blockwise
FP8_SCALING_NEEDED = {0.0: 0.0, 1.0: 1.0, 2.0: 1.0, 3.0: 3.0, 4.0: 2.0}


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Cluster(Inputs):
    """Accelerators and the network that joins them.

    The scale-up domain holds ``domain`` accelerators joined at ``bw_up_bytes_per_s``
    each; everything beyond it runs at ``bw_out_bytes_per_s`` per accelerator.
    Bandwidths are per accelerator, per direction.
    """

    gpus: jax.Array                 # N, accelerators in the job
    peak_flops_per_s: jax.Array     # FLOP/s, dense 16-bit peak per accelerator
    hbm_bytes: jax.Array            # bytes of memory (HBM) per accelerator
    domain: jax.Array               # U, scale-up domain size (accelerators)
    bw_up_bytes_per_s: jax.Array    # bytes/s a direction, scale-up link per accelerator
    bw_out_bytes_per_s: jax.Array   # bytes/s a direction, scale-out per accelerator
    gpus_per_node: jax.Array = 8.0  # accelerators per server (rank map, "TP inside a node")
    alpha_up_s: jax.Array = 0.0     # seconds of latency per ring step inside the domain
    alpha_out_s: jax.Array = 0.0    # seconds of latency per ring step across domains
    island_gpus: jax.Array = 0.0    # accelerators in a non-blocking island (0: the whole cluster)
    oversubscription: jax.Array = 1.0  # core (between islands) oversubscription ratio
    topology: jax.Array = 0.0       # TOPOLOGIES: 0 fat tree (seed), 1 rail-only, 2 torus
    torus_x: jax.Array = 1.0        # torus axis sizes; x*y*z = gpus on a torus (1 = axis unused)
    torus_y: jax.Array = 1.0        # torus y axis size (1 = unused)
    torus_z: jax.Array = 1.0        # torus z axis size (1 = unused)
    torus_bw_x_bytes_per_s: jax.Array = 0.0  # bytes/s of one link along x, per direction
    torus_bw_y_bytes_per_s: jax.Array = 0.0  # bytes/s of one link along y, per direction
    torus_bw_z_bytes_per_s: jax.Array = 0.0  # bytes/s of one link along z, per direction
    torus_wrap: jax.Array = 1.0     # 1: wraparound links close each axis (used by groups that span it)
    peak_fp8_flops_per_s: jax.Array = 0.0  # FLOP/s, dense FP8 peak per accelerator (0: no FP8 path, use the 16-bit peak)
    hbm_bw_bytes_per_s: jax.Array = 0.0    # bytes/s of HBM bandwidth per accelerator (0: unknown; GEMM shape effect off)
    host_link_bytes_per_s: jax.Array = 0.0   # bytes/s a direction between one accelerator and host memory (PCIe, NVLink-C2C; 0: no host link)
    node_host_bytes: jax.Array = 0.0         # bytes of host (CPU) memory per node (0: unknown, nothing may be offloaded)
    node_host_bw_bytes_per_s: jax.Array = 0.0   # bytes/s of host DRAM bandwidth per node (sets the host-side Adam rate; 0: unknown)
    # measured best-shape matmul rate / the peak above (a benchmark such as stas00/ml-engineering's
    # mamf-finder.py; 0: not measured, the calibration's reference ceiling: compute.gemm_top_rates)
    matmul_ceiling: jax.Array = 0.0       # 16-bit
    matmul_ceiling_fp8: jax.Array = 0.0   # FP8 (0: not measured; the 16-bit ceiling x fp8_efficiency)
    # measured FlashAttention-2 forward + backward rate / the 16-bit peak (0: not measured; compute.flash_attn_scale)
    flash_attn_share: jax.Array = 0.0
    fp8_scaling: jax.Array = 3.0  # FP8 scalings the tensor cores run (FP8_SCALINGS): 0 none, 1 per tensor, 2 also blockwise, 3 also MXFP8
