"""The plan: parallel degrees, batch, ZeRO, recompute, schedule and the switches a stack sets."""

from __future__ import annotations

import dataclasses

from dse.backend import register_dataclass
from dse.inputs.base import Inputs

__all__ = ["Plan", "RECOMPUTE", "RECOMPUTE_NAMES", "recompute_name", "RECOMPUTE_MODULES", "SELECTIVE_MODULES",
           "module_names", "SETS", "SCHEDULES", "FP8_RECIPES", "FP8_NAMES", "CHOICES", "SWITCHES",
           "WHOLE", "ZERO_STAGES"]

# Recompute modes, as numbers so they broadcast (Korthikanti et al. 2022, Sec. 5; "op": torchtitan's
# selective op-level checkpointing; "qkv": MaxText's remat_policy save_qkv_proj). What each keeps and
# recomputes: memory.RECOMPUTE_MODES.
RECOMPUTE = {"none": 0.0, "selective": 1.0, "full": 2.0, "op": 3.0, "qkv": 4.0}
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE.items()}   # 0.0 -> "none" (0 looks up the same)


# Selective recompute's modules, as bits of Plan.recompute_modules: Megatron-Core's --recompute-modules
# (TransformerConfig.recompute_modules: "core_attn" the attention core, "layernorm" the two norms,
# "moe_act" the routed experts' activation function, "mla_up_proj" MLA's up-projections, "mlp" the dense
# MLP, "moe" the MoE layer, "shared_experts" its shared experts). What each drops and reruns:
# memory.MODULE_DROPS. The default is Megatron's, ["core_attn"]: Korthikanti sec.5's selective recompute.
RECOMPUTE_MODULES = {"core_attn": 1.0, "layernorm": 2.0, "moe_act": 4.0, "mla_up_proj": 8.0, "mlp": 16.0, "moe": 32.0,
                     "shared_experts": 64.0}
SELECTIVE_MODULES = RECOMPUTE_MODULES["core_attn"]   # Plan's default (Megatron-Core's)


def module_names(code) -> list:
    """The module names of a recompute_modules code (RECOMPUTE_MODULES bits), in the table's order."""
    n = int(round(float(code)))
    return [name for name, bit in RECOMPUTE_MODULES.items() if n & int(bit)]


def recompute_name(code, every=1.0, modules=SELECTIVE_MODULES) -> str:
    """A plan's recompute as text: its mode (RECOMPUTE_NAMES), "full every N" when full recompute
    checkpoints one layer in N (Plan.recompute_every; torchtitan's selective_ac_option N), and
    selective's modules where they are not dse's default ("selective (layernorm, moe_act)")."""
    name = RECOMPUTE_NAMES[float(code)]
    if name == "selective" and float(modules) != SELECTIVE_MODULES:
        return f"selective ({', '.join(module_names(modules)) or 'no module'})"
    return f"{name} every {float(every):g}" if name == "full" and float(every) > 1 else name


# Pipeline schedules, as numbers (DeepSeek-V3 report, Table 2).
SCHEDULES = {"1f1b": 0.0, "zb1p": 1.0, "dualpipe": 2.0}
# FP8 training recipes, as numbers (0: none, 16-bit GEMMs). Names as Megatron-LM's --fp8-recipe
# (megatron/training/arguments.py: choices tensorwise, delayed, mxfp8, blockwise; default delayed)
# and Transformer Engine's recipes (transformer_engine/common/recipe: DelayedScaling,
# Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling). 1 is delayed scaling, so a plan
# written with fp8 = 1 before recipes existed means Megatron's default recipe.
FP8_RECIPES = {"none": 0.0, "delayed": 1.0, "tensorwise": 2.0, "mxfp8": 3.0, "blockwise": 4.0}
FP8_NAMES = {v: k for k, v in FP8_RECIPES.items()}


@register_dataclass
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
    recompute: jax.Array = 1.0  # 0 none, 1 selective, 2 full, 3 op (torchtitan op-level), 4 qkv (MaxText save_qkv_proj; memory.RECOMPUTE_MODES)
    recompute_layers: jax.Array = 1.0     # full recompute: layers a checkpoint spans, one input kept a group (Megatron --recompute-num-layers, uniform)
    recompute_modules: jax.Array = SELECTIVE_MODULES  # selective recompute's modules, a sum of RECOMPUTE_MODULES bits or their names (Megatron-Core --recompute-modules); default core_attn
    recompute_every: jax.Array = 1.0      # full recompute of one layer in N, the others keep everything (torchtitan selective_ac_option N; memory.recomputed_layers); 1: every layer
    vpp: jax.Array = 1.0        # v, interleaved model chunks per stage
    sp: jax.Array = 1.0         # sequence parallelism on (1) or off (0)
    rank_order: jax.Array = 0.0       # index into topology.RANK_ORDERS (0: [TP, CP, EP, PP, DP])
    torus_order: jax.Array = 0.0      # index into topology.TORUS_ORDERS (0: ranks fill x, then y, z)
    dp_hierarchical: jax.Array = 0.0  # 1: DP all-reduce = RS in domain, AR on rails, AG in domain
    schedule: jax.Array = 0.0   # 0 1F1B (interleaved when vpp > 1), 1 zero-bubble ZB1P, 2 DualPipe (SCHEDULES)
    grad_accum: jax.Array = 0.0  # 0 keep unsharded gradients locally, reduce once a step; 1 reduce-scatter every microbatch
    fp8: jax.Array = 0.0        # FP8 recipe (FP8_RECIPES): 0 none (16-bit), 1 delayed, 2 tensorwise (current), 3 mxfp8, 4 blockwise
    cp_ring: jax.Array = 0.0    # 0: CP by K/V all-gather (Llama 3); 1: ring attention (hidden while compute is longer)
    overlap_grad_reduce: jax.Array = 1.0  # 1: DP sync hides behind backward (seed); 0: after it (Megatron-LM 2021-22)
    tp_comm_overlap: jax.Array = 0.0      # 1: TP collectives pipelined with GEMMs (TE userbuffers); hidden share fid.tp_comm_overlap
    flash_attention: jax.Array = 0.0      # 1: fused attention (FlashAttention): no s^2 scores stored or moved
    capacity_factor: jax.Array = 0.0      # MoE expert capacity / mean load (0: dropless, no padding)
    keep_stage_outputs: jax.Array = 0.0   # 1: no output-tensor deallocation (Korthikanti App.B): +2 s b h p bytes
    first_stage_layers: jax.Array = 0.0   # layers on the first pipeline stage (0: even split; Megatron --decoder-first-pipeline-num-layers)
    last_stage_layers: jax.Array = 0.0    # layers on the last stage (0: even split; --decoder-last-pipeline-num-layers)
    embedding_in_split: jax.Array = 0.0   # 1: the embedding counts as a layer in the split (--account-for-embedding-in-pipeline-split)
    loss_in_split: jax.Array = 0.0        # 1: the output layer and loss count as a layer (--account-for-loss-in-pipeline-split)
    ep_comm_overlap: jax.Array = 0.0      # 1: EP all-to-all beside another microbatch's compute (Megatron-Core a2a overlap; DualPipe always)
    fp8_param_gather: jax.Array = 0.0     # 1 (with fp8): weights kept and all-gathered in FP8 (Megatron-LM --fp8-param-gather)
    fp8_tp_comm: jax.Array = 1.0          # 1 (with fp8 and SP): TP all-gathers move FP8 GEMM inputs (Transformer Engine, torchao); 0: 16-bit (stack data)
    fp8_cache: jax.Array = 1.0            # 1: FP8 GEMM inputs kept for backward and FP8 weights cached a step (TE); 0: 16-bit kept, re-cast per use (torchao)
    fp8_amax_history: jax.Array = 1.0     # delayed scaling: amax values kept per FP8 tensor (Megatron --fp8-amax-history-len, default 1; TE's own 1024)
    dp_bucket_params: jax.Array = 0.0     # 16-bit elements of DP buckets beyond the gradients (DeepSpeed reduce + allgather bucket sizes; stack data)
    dp_bucket_copy: jax.Array = 0.0       # 1: DP buckets copy every gradient (PyTorch DDP, gradient_as_bucket_view=False; ZeRO-0 only)
    offload_optimizer: jax.Array = 0.0    # share 0..1 of the optimizer state (fp32 master, Adam moments) kept and stepped on the host (ZeRO-Offload; Megatron --optimizer-cpu-offload)
    offload_gradients: jax.Array = 0.0    # 1: the rank's gradient partition lives in host memory (ZeRO-Offload / ZeRO-Infinity)
    offload_weights: jax.Array = 0.0      # 1 (ZeRO-3 only): the 16-bit weight partition lives on the host, fetched for every gather (ZeRO-Infinity)
    offload_activations: jax.Array = 0.0  # share 0..1 of stored activations sent to host in the forward, fetched for the backward (Megatron-Core activation offloading)
    offload_overlap: jax.Array = 1.0      # 1: host-side Adam pipelined with the parameter copy back (ZeRO-Offload sec.4.1; Megatron --overlap-cpu-optimizer-d2h-h2d); 0: one after the other
    loss_logit_bytes: jax.Array = 6.0     # peak bytes a logit takes in the loss: 6 Megatron vocab-parallel CE (fp32 softmax + 16-bit), 12 PyTorch cross_entropy on fp32 logits
    zero3_live_params: jax.Array = 0.0    # ZeRO-3 gathered parameters a rank may hold (DeepSpeed stage3_max_live_parameters); 0: FSDP units, two layers gathered
    zero3_prefetch_params: jax.Array = 0.0  # ZeRO-3 parameters gathered ahead of use (DeepSpeed stage3_prefetch_bucket_size); 0: the whole next unit (FSDP prefetch)
    zero3_gather_calls: jax.Array = 0.0   # collectives one layer's ZeRO-3 weight gather takes (DeepSpeed 2021: one a module; stack data); 0: one (FSDP's flat unit)
    zero3_reduce_calls: jax.Array = 0.0   # collectives one layer's ZeRO-3 gradient reduce-scatter takes (DeepSpeed 2021: one a parameter tensor); 0: one
    zero3_rank_copies: jax.Array = 0.0    # 1: each ZeRO-3 collective takes a list of one tensor a rank, d copies on its stream (DeepSpeed 2021; stack data)
    ep_fp8_dispatch: jax.Array = 0.0      # 1: the EP dispatch sends FP8 with 128-channel scales, the combine 16-bit (DeepEP; traffic.ep)
    attn_kernel_fa2: jax.Array = 0.0      # 1: the fused attention is FlashAttention-2 or of its generation (stack data): its rate follows FA2's share on each GPU
    dp_shard: jax.Array = 0.0             # hybrid sharding (HSDP): ZeRO shards over groups of this many DP ranks, replicated across d / dp_shard groups (torchtitan data_parallel_shard_degree, FSDP HYBRID_SHARD, MaxText fsdp x data; with EP a multiple of ep, experts sharded over dp_shard / ep); 0: over the whole DP group
    grad_bytes: jax.Array = 2.0           # bytes a gradient takes in its buffer and in the DP reduce: 2 (16-bit, ZeRO sec.3), 4 (fp32: Megatron-LM under --bf16; stack data)
    grad_reduce_bytes: jax.Array = 0.0    # bytes a gradient takes on the DP wire: 0 its buffer's width (grad_bytes); 2 a 16-bit reduce of fp32 gradients (XLA's SPMD partitioner reduces the weight-gradient dot's bf16 output and converts the shard to fp32: MaxText; stack data)
    ep_node_dedup: jax.Array = 0.0        # 1: the EP dispatch sends a token once to each destination node and NVLink fans it out there, whatever the routing (DeepEP's internode kernels: num_tokens_per_rdma_rank; DeepSeek-V3 sec.3.2.2); 0: one copy a routed expert (NCCL all-to-all)
    etp: jax.Array = 0.0                  # expert tensor parallelism: 0 the experts split over the attention's TP ranks (ETP = TP; EP carved from DP); 1 ETP = 1, whole experts, EP folded over the TP x CP x DP ranks of a stage (Megatron-Core --expert-tensor-parallel-size 1: MoE parallel folding, Liu et al. 2025, arXiv 2504.14960)
    caching_allocator: jax.Array = 1.0    # 1: PyTorch's CUDA caching allocator (its freed blocks fragment: memory.fragmentation_bytes); 0: XLA's buffer assignment, laid out at compile time (stack data)



# What each field accepts (dse.inputs.checks.plan_value; every entry point checks through it).
# Fields in none of these tables (capacity_factor) take any number >= 0.
GRAD_WIDTHS = {"16-bit": 2.0, "fp32": 4.0}     # Plan.grad_bytes: bytes a gradient, by name or number
CHOICES = {"recompute": RECOMPUTE, "schedule": SCHEDULES, "fp8": FP8_RECIPES, "grad_bytes": GRAD_WIDTHS,
           "grad_reduce_bytes": {"as-buffer": 0.0, **GRAD_WIDTHS}}   # a name or its code
SWITCHES = ("sp", "dp_hierarchical", "grad_accum", "cp_ring", "overlap_grad_reduce", "tp_comm_overlap",
            "flash_attention", "keep_stage_outputs", "embedding_in_split", "loss_in_split", "ep_comm_overlap",
            "fp8_param_gather", "fp8_tp_comm", "fp8_cache",
            "dp_bucket_copy", "offload_gradients", "offload_weights", "offload_overlap", "ep_fp8_dispatch",
            "zero3_rank_copies", "attn_kernel_fa2", "caching_allocator", "etp", "ep_node_dedup")   # 0 or 1
SETS = {"recompute_modules": RECOMPUTE_MODULES}   # any set of the names, or the sum of their codes
SHARES = ("offload_optimizer", "offload_activations")                                        # 0..1
WHOLE = {"tp": 1, "pp": 1, "mbs": 1, "gbs": 1, "cp": 1, "ep": 1, "vpp": 1, "fp8_amax_history": 1, "recompute_layers": 1, "recompute_every": 1,
         "rank_order": 0, "torus_order": 0, "first_stage_layers": 0, "last_stage_layers": 0, "dp_shard": 0}   # whole numbers >= the minimum
ZERO_STAGES = (0.0, 1.0, 2.0, 3.0)
