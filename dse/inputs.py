"""Inputs of the planner's model: the model shape, the cluster and the plan.

Each is a frozen dataclass registered as a JAX pytree whose every field is a float
array, integer degrees included, so one type holds one plan, a batch of plans (a
leading axis), or a grid of plans (arrays that broadcast against each other), and a
relaxed plan for co-design (non-integer degrees). Build them with ``make``, which
converts Python numbers to arrays; the plain constructor leaves its arguments as
given, as JAX's pytree machinery requires.

New fields go at the end with a default, so ``evaluate``'s signature never changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["ModelShape", "Cluster", "Plan", "RECOMPUTE", "SCHEDULES", "TOPOLOGIES", "broadcast_all", "stack"]

# Recompute modes, as numbers so they broadcast (Korthikanti et al. 2022, Sec. 5).
RECOMPUTE = {"none": 0.0, "selective": 1.0, "full": 2.0}
# Network topologies, as numbers so they broadcast (dse/topology.py). A fat tree has two
# tiers (seed 000), or three when island_gpus > 0 (islands joined by an oversubscribed core).
TOPOLOGIES = {"fat-tree": 0.0, "rail-only": 1.0, "torus": 2.0}
# Pipeline schedules, as numbers (DeepSeek-V3 report, Table 2).
SCHEDULES = {"1f1b": 0.0, "zb1p": 1.0, "dualpipe": 2.0}


def _as_array(x: Any) -> jax.Array:
    return jnp.asarray(x, dtype=jnp.result_type(float))


class _Inputs:
    """Shared helpers: ``make`` converts to float arrays; ``replace`` copies."""

    @classmethod
    def make(cls, **kwargs):
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = set(kwargs) - set(names)
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}; allowed: {names}")
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in kwargs:
                values[f.name] = _as_array(kwargs[f.name])
            elif f.default is not dataclasses.MISSING:
                values[f.name] = _as_array(f.default)
            else:
                raise TypeError(f"{cls.__name__}: missing field {f.name!r}")
        return cls(**values)

    def replace(self, **kwargs):
        return dataclasses.replace(self, **{k: _as_array(v) for k, v in kwargs.items()})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ModelShape(_Inputs):
    """A decoder-only transformer, dense or mixture-of-experts."""

    layers: jax.Array        # L
    hidden: jax.Array        # h
    heads: jax.Array         # a
    kv_heads: jax.Array      # GQA key/value heads (= heads for multi-head attention)
    ffn_hidden: jax.Array    # dense FFN width (4h for GPT)
    vocab: jax.Array         # V
    seq: jax.Array           # s, tokens per sequence
    experts: jax.Array = 1.0          # E routed experts (1 = dense)
    topk: jax.Array = 1.0             # experts per token
    ffn_gated: jax.Array = 0.0        # 1 for SwiGLU/GeGLU (three FFN matrices)
    expert_ffn_hidden: jax.Array = 0.0  # routed expert width (0: ffn_hidden)
    shared_experts: jax.Array = 0.0   # always-on experts per MoE layer (DeepSeek)
    moe_layer_freq: jax.Array = 1.0   # fraction of layers that are MoE layers
    dense_layers: jax.Array = 0.0     # leading dense layers in an MoE model (DeepSeek-V3: 3)
    route_node_limit: jax.Array = 0.0  # max nodes a token is routed to (0: unlimited)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cluster(_Inputs):
    """Accelerators and the network that joins them.

    The scale-up domain holds ``domain`` accelerators joined at ``bw_up_bytes_per_s``
    each; everything beyond it runs at ``bw_out_bytes_per_s`` per accelerator.
    Bandwidths are per accelerator, per direction.
    """

    gpus: jax.Array                 # N
    peak_flops_per_s: jax.Array     # dense 16-bit peak per accelerator
    hbm_bytes: jax.Array            # memory per accelerator
    domain: jax.Array               # U, scale-up domain size (accelerators)
    bw_up_bytes_per_s: jax.Array    # scale-up link bandwidth per accelerator
    bw_out_bytes_per_s: jax.Array   # scale-out bandwidth per accelerator
    gpus_per_node: jax.Array = 8.0  # accelerators per server (rank map, "TP inside a node")
    alpha_up_s: jax.Array = 0.0     # latency per ring step inside the domain
    alpha_out_s: jax.Array = 0.0    # latency per ring step across domains
    island_gpus: jax.Array = 0.0    # accelerators in a non-blocking island (0: the whole cluster)
    oversubscription: jax.Array = 1.0  # core (between islands) oversubscription ratio
    topology: jax.Array = 0.0       # TOPOLOGIES: 0 fat tree (seed), 1 rail-only, 2 torus
    torus_x: jax.Array = 1.0        # torus axis sizes; x*y*z = gpus on a torus (1 = axis unused)
    torus_y: jax.Array = 1.0
    torus_z: jax.Array = 1.0
    torus_bw_x_bytes_per_s: jax.Array = 0.0  # one link along x, per direction
    torus_bw_y_bytes_per_s: jax.Array = 0.0
    torus_bw_z_bytes_per_s: jax.Array = 0.0
    torus_wrap: jax.Array = 1.0     # 1: wraparound links close each axis (used by groups that span it)
    peak_fp8_flops_per_s: jax.Array = 0.0  # dense FP8 peak per accelerator (0: no FP8 path, use the 16-bit peak)
    hbm_bw_bytes_per_s: jax.Array = 0.0    # HBM bandwidth per accelerator (0: unknown; GEMM shape effect off)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Plan(_Inputs):
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


def broadcast_all(*trees):
    """Broadcast every leaf of every tree to one common shape (for ``vmap``)."""
    leaves = [leaf for t in trees for leaf in jax.tree_util.tree_leaves(t)]
    shape = jnp.broadcast_shapes(*[jnp.shape(x) for x in leaves])
    out = tuple(jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, shape), t) for t in trees)
    return out if len(out) > 1 else out[0]


def stack(items):
    """Stack a list of same-type inputs into one batched input (leading axis)."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *items)
