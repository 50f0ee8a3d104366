"""Traffic per dimension: bytes each rank sends a step, calls a step, message size.

Volumes follow seed 000 sec.4 and DESIGN.md "Restored equations" 5-8 (Narayanan et
al. 2021 sec.3; Korthikanti et al. 2022; ZeRO sec.7; Megatron-Core/TransformerEngine CP). Tokens on a
rank are b*s/c: context parallelism splits the sequence, so every activation-sized
exchange shrinks by c.
"""

from __future__ import annotations

from dse.backend import jnp
from dse.equations import collectives as col
from dse.equations import steps as step_fns
from dse.equations.memory import BYTES_PER_ELEMENT, FP8_BYTES, attention_dims, fp8_element_bytes, is_full_recompute

TP_ALLREDUCES_PER_LAYER = 4.0   # Megatron: g, g forward; f, f backward (Shoeybi'19 sec.3)
EP_ALLTOALLS_PER_LAYER = 4.0    # dispatch + combine forward, mirrored pair backward (seed 000)
FULL_RECOMPUTE_COMM = 1.5       # the extra forward repeats its collectives (seed 000 sec.4)
# DeepEP's FP8 dispatch: FP8 values with an fp32 scale per 128 channels (DeepEP README: "supports
# low-precision operations, including FP8"; vLLM's DeepEP adapter: "DeepEP kernels quantize dispatch
# inputs in 128 element chunks", DEEPEP_QUANT_BLOCK_SIZE = 128). The combine stays 16-bit.
FP8_DISPATCH_BYTES = FP8_BYTES + 4.0 / 128.0


def recompute_comm_factor(recompute, share=1.0):
    """x1.5 on forward-path collectives with full recomputation (seed 000 sec.4); on ``share`` of
    the layers with layer-level checkpointing (memory.full_recompute_share)."""
    return step_fns.where(is_full_recompute(recompute, share), FULL_RECOMPUTE_COMM, 1.0)


def tp(model, t, c, b, layers_per_stage, m, recompute, sp, gather_bytes_per_element=BYTES_PER_ELEMENT, share=1.0,
       whole_expert_layers=0.0, rerun_blocks=0.0):
    """TP: 8 b s h (t-1)/t elements per layer per microbatch (seed 000 sec.4; Narayanan sec.3.2).

    SP swaps each all-reduce for a reduce-scatter plus an all-gather, same volume
    (Korthikanti sec.4.2.2). ``gather_bytes_per_element``: what the all-gather half moves a value
    (``fp8_gather_bytes``: FP8 GEMM inputs), the reduce-scatters stay 16-bit. ``share``: the
    layers fully recomputed (``recompute_comm_factor``). ``whole_expert_layers``: MoE layers whose
    experts are not split over TP (folded EP, degrees.expert_split): their block's two collectives
    are gone, the all-to-all moves the rank's own sequence-parallel tokens instead (``ep``).
    ``rerun_blocks``: FFN or MoE blocks of the stage whose forward selective recompute runs again
    (memory.module_rerun_blocks): one all-reduce equivalent each a microbatch.
    """
    tokens = b * model.seq / c
    message = tokens * model.hidden * BYTES_PER_ELEMENT                   # one b x s x h tensor
    rf = recompute_comm_factor(recompute, share)
    calls_ar = ((TP_ALLREDUCES_PER_LAYER * layers_per_stage - 2.0 * whole_expert_layers) * rf
                + rerun_blocks) * m                                        # all-reduce equivalents
    gathers = jnp.where(sp >= 1, (BYTES_PER_ELEMENT + gather_bytes_per_element) / (2.0 * BYTES_PER_ELEMENT), 1.0)
    sent = calls_ar * message * col.ring_fraction(col.ALL_REDUCE, t) * gathers
    calls = calls_ar * jnp.where(sp >= 1, 2.0, 1.0)
    steps = calls_ar * col.ring_steps(col.ALL_REDUCE, t)
    return dict(bytes=jnp.where(t > 1, sent, 0.0), calls=jnp.where(t > 1, calls, 0.0),
                message=message, steps=steps)


def fp8_gather_bytes(recipe, fp8_tp_comm, fid):
    """Bytes a value of the TP all-gathers under SP: FP8 (1 + scales) when the stack gathers the
    quantized GEMM inputs, else 2.

    Transformer Engine with sequence parallelism quantizes before it gathers: the forward
    LayerNorm writes FP8 and ``gather_along_first_dim`` moves the FP8 ln_out (module/
    layernorm_linear.py), and the backward casts the row-parallel grad output to FP8 and then
    all-gathers it (module/base.py grad_output_preprocess: "FP8 case with gather: unfused bgrad,
    cast, transpose for efficient gather"). So all four all-gathers of a layer (seed 000's 4
    all-reduce equivalents each = RS + AG) move FP8 and the four reduce-scatters of 16-bit GEMM
    outputs do not. Which stacks do it is data (``fp8_tp_comm`` in dse/data/stacks).
    """
    on = (recipe >= 1) & (fp8_tp_comm >= 1)
    fp8 = jnp.where(on, fp8_element_bytes(recipe), BYTES_PER_ELEMENT)
    return fid.fp8_recipe_terms * fp8 + (1.0 - fid.fp8_recipe_terms) * BYTES_PER_ELEMENT


def cp(model, t, c, b, layers_per_stage, m, recompute, ring=0.0, real=0.0, extra_forwards=0.0, share=1.0):
    """CP (seed 000 sec.4; Megatron-Core/TransformerEngine context parallelism): K and V gathered per layer forward, dK and dV reduce-scattered backward.

    K and V are b (s/c) h (kv/a) each per rank, split over the t TP ranks by heads; their
    widths are the model's (kv heads x head_dim; MLA: a heads of d_qk and d_v after the
    up-projection, memory.attention_dims), h kv/a each for h/a heads. In units of the
    full gathered buffer x (c-1)/c (one rank's share of K and V sent c-1 times):

    * seed (``real`` = 0): x1.5 forward all-gathers under full recompute (seed 000 sec.4)
      plus one reduce-scatter backward.
    * ``real`` = 1: one all-gather a forward pass of the attention core (1 + recompute's
      extra forwards, ``compute.attention_recomputes``: selective recompute re-runs core
      attention and its exchange), and backward gathers K and V again and reduce-scatters
      dK, dV (TransformerEngine AttnFuncWithCPAndKVAllGather keeps only the local K/V
      shard for backward; its ring, AttnFuncWithCPAndKVP2P, likewise passes K/V and dK/dV
      each backward step), 2 units. The ring (``ring`` = 1) sends each K/V block c-1 hops
      a pass and the accumulated dK/dV one hop more, home to its owner.

    ``steps`` counts hops (c-1 a ring collective, one a ring-attention block).
    """
    _, _, k_w, v_w = attention_dims(model)
    gathered = b * model.seq * (k_w + v_w) / t * BYTES_PER_ELEMENT       # full K and V buffers
    is_real = real >= 1
    fwd = jnp.where(is_real, 1.0 + extra_forwards, recompute_comm_factor(recompute, share))
    bwd = jnp.where(is_real, 2.0, 1.0)
    calls = (fwd + bwd) * layers_per_stage * m                            # AG forward(s), (AG +) RS backward
    home = jnp.where(is_real & (ring >= 1), 1.0, 0.0)                     # the ring's last dK/dV hop
    hops = ((fwd + bwd) * (c - 1.0) + home) * layers_per_stage * m
    sent = hops * gathered / jnp.maximum(c, 1.0)
    return dict(bytes=jnp.where(c > 1, sent, 0.0), calls=jnp.where(c > 1, calls, 0.0),
                message=gathered, steps=jnp.where(c > 1, hops, 0.0), fwd=fwd, bwd=bwd, home=home,
                blocks=layers_per_stage * m)


def ep(model, c, e, b, moe_layers_per_stage, m, recompute, topk, share=1.0, fp8_dispatch=0.0, token_share=1.0,
       rerun=0.0):
    """EP: four all-to-alls per MoE layer, k b s h (e-1)/e elements each (seed 000, EP).

    With ``fp8_dispatch`` (Plan.ep_fp8_dispatch) every forward pass's dispatch (1, or 1 + the
    recomputed share under full recompute) sends FP8 values with their scales,
    FP8_DISPATCH_BYTES a value instead of 2; its combine and the backward pair stay 16-bit: a
    layer moves (3 + 1.03/2)/4 = 0.879 of the 16-bit volume, 0.839 under full recompute.
    ``token_share``: the share of the b s / c tokens a rank dispatches, 1 (its TP group's whole
    sequence), or 1 / t with folded EP (its sequence-parallel part: degrees.expert_split). ``rerun``:
    the share of the MoE layers whose forward selective recompute's moe module runs again, its dispatch
    and combine with it (x1.5 as full recompute; memory.module_rerun_blocks).
    """
    message = topk * b * model.seq / c * token_share * model.hidden * BYTES_PER_ELEMENT
    rf = recompute_comm_factor(recompute, share) + (FULL_RECOMPUTE_COMM - 1.0) * rerun
    calls = EP_ALLTOALLS_PER_LAYER * moe_layers_per_stage * m * rf
    forwards = 2.0 * rf - 1.0                                             # 4 rf = 2 forwards + 2 backward calls
    saved = jnp.where(fp8_dispatch >= 1, 1.0 - FP8_DISPATCH_BYTES / BYTES_PER_ELEMENT, 0.0)
    units = calls - forwards * saved * moe_layers_per_stage * m          # 16-bit message units sent
    sent = units * message * col.ring_fraction(col.ALL_TO_ALL, e)
    steps = calls * col.ring_steps(col.ALL_TO_ALL, e)
    return dict(bytes=jnp.where(e > 1, sent, 0.0), calls=jnp.where(e > 1, calls, 0.0),
                message=message, steps=steps)


def pp(model, t, c, p, b, m, v):
    """PP: b s h / t elements per microbatch per direction per boundary, x v interleaved.

    Narayanan sec.4.1 (scatter/gather): 2 m b s h / t elements a step.
    """
    message = b * model.seq / c * model.hidden / t * BYTES_PER_ELEMENT
    calls = 2.0 * m * v
    sent = calls * message
    on = p > 1                                                           # p = 1: no boundary, no latency
    return dict(bytes=jnp.where(on, sent, 0.0), calls=jnp.where(on, calls, 0.0),
                message=message, steps=jnp.where(on, calls, 0.0))


def dp(params_rank, shard, zero, layers_per_stage, m=1.0, gather_per_microbatch=0.0, grad_accum=0.0,
       gather_bytes_per_element=BYTES_PER_ELEMENT, gather_calls=1.0, reduce_calls=1.0, rank_copies=0.0,
       grad_bytes_per_element=BYTES_PER_ELEMENT):
    """DP gradient sync of ``params_rank`` parameters over ``shard`` ranks (ZeRO sec.7).

    2 Psi (d-1)/d elements for stages 0-2 (a reduce-scatter plus an all-gather), 3 Psi
    (d-1)/d for stage 3 (the extra weight all-gather before forward and backward).
    FSDP (Zhao et al. 2023, sec.3.3-3.4) gathers the weights again for every microbatch
    (``gather_per_microbatch`` = 1), and with ``grad_accum`` = 1 reduce-scatters the
    gradients every microbatch instead of accumulating them unsharded (seed 000 sec.1).

    Stage 3 moves a layer at a time: its weight gather in ``gather_calls`` collectives and its
    gradient reduce-scatter in ``reduce_calls`` (1: one flat unit, FSDP; DeepSpeed 2021 issues one
    a module or one a parameter tensor: Plan.zero3_gather_calls, stack data), each a ring of
    d - 1 steps, so the alpha term counts every collective's steps (the bytes are the same).
    ``rank_copies`` = 1: each of those collectives takes a list of d tensors, one a rank
    (DeepSpeed 2021's torch.distributed.all_gather and reduce_scatter calls), which PyTorch's NCCL
    process group copies one by one out of (all-gather) or into (reduce-scatter) its flat buffer
    on the collective's stream (ProcessGroupNCCL.cpp allgather, reduce_scatter): ``copies``, d a call.
    """
    no_copies = step_fns.never(rank_copies)       # concretely none (every stack but DeepSpeed 2021's)
    # Gradients reduce at grad_bytes_per_element (traffic.grad_reduce_width: their buffer's width, fp32
    # under Megatron-LM's bf16, or the 16 bits XLA reduces MaxText's fp32 gradients in);
    # parameter all-gathers in FP8 (Megatron-LM --fp8-param-gather) move 1 byte a parameter.
    buffer = params_rank * grad_bytes_per_element
    g_buffer = params_rank * gather_bytes_per_element
    frac = col.ring_fraction(col.REDUCE_SCATTER, shard)                 # (d-1)/d
    reduces = 1.0 + grad_accum * (m - 1.0)                              # RS (or AR) per step
    gathers = jnp.where(zero >= 3, 2.0 * (1.0 + gather_per_microbatch * (m - 1.0)), 1.0)
    sharded = (gathers * g_buffer + reduces * buffer) * frac            # stages 1-3: AG + RS
    sent = jnp.where(zero >= 1, sharded, reduces * buffer * col.ring_fraction(col.ALL_REDUCE, shard))
    # Calls: bucketed all-reduces (stage 0), RS + AG (1, 2), per-layer AG, AG, RS (3), each a
    # layer's in its gather_calls or reduce_calls collectives.
    collectives = jnp.where(zero >= 3, gathers * gather_calls + reduces * reduce_calls, gathers + reduces)
    calls = jnp.where(zero >= 3, collectives * jnp.ceil(layers_per_stage), jnp.where(zero >= 1, collectives, reduces))
    steps = jnp.where(zero >= 1, collectives, 2.0 * reduces) * col.ring_steps(col.REDUCE_SCATTER, shard)
    steps = steps * jnp.where(zero >= 3, layers_per_stage, 1.0)
    total = jnp.where(zero >= 1, 0.5 * (gathers * g_buffer + reduces * buffer), reduces * buffer)   # seed: 1.5 buffer (stage 3)
    # A group with nothing to sync (the expert-DP group of a dense model) makes no calls and
    # pays no alpha: latency is alpha per step of a call that happens (alpha-beta model).
    on = (shard > 1) & (params_rank > 0)
    # the ZeRO-3 weight all-gathers within ``sent`` (schedule.unprefetched_gather: what prefetch cannot start early)
    gathered = jnp.where(zero >= 3, gathers * g_buffer * frac, 0.0)
    return dict(bytes=jnp.where(on, sent, 0.0), calls=jnp.where(on, calls, 0.0),
                message=steps_message(total, calls), steps=jnp.where(on, steps, 0.0),
                gather_bytes=jnp.where(on, gathered, 0.0),
                copies=0.0 if no_copies else jnp.where(on & (zero >= 3), rank_copies * calls * shard, 0.0))


def replica(params_rank, shard, replicas, zero, layers_per_stage, m=1.0, grad_accum=0.0,
            grad_bytes_per_element=BYTES_PER_ELEMENT, expert_rank=0.0, shard_e=1.0):
    """Hybrid sharding's second step: each shard group's reduce-scattered gradient, ``params_rank`` /
    ``shard`` parameters, all-reduced across the ``replicas`` groups holding the same shard (PyTorch
    FSDP HYBRID_SHARD: reduce-scatter within the group, then all-reduce across groups; ring, 2(r-1)/r
    of the buffer). With expert parallelism the rank's experts (``expert_rank``) shard over the
    ``shard_e`` = s / e ranks of the group that hold the same experts (torchtitan's dp_shard_mod_ep),
    and their shard is all-reduced across the same replicas. As often as the shard group reduces
    (``grad_accum``: every microbatch), a unit (layer) a call under ZeRO-3. Nothing where ``replicas`` = 1."""
    buffer = (params_rank / shard + expert_rank / shard_e) * grad_bytes_per_element
    reduces = 1.0 + grad_accum * (m - 1.0)
    per = jnp.where(zero >= 3, layers_per_stage, 1.0)
    calls = reduces * jnp.where(zero >= 3, jnp.ceil(layers_per_stage), 1.0)
    on = (replicas > 1) & (params_rank + expert_rank > 0)
    return dict(bytes=jnp.where(on, reduces * buffer * col.ring_fraction(col.ALL_REDUCE, replicas), 0.0),
                calls=jnp.where(on, calls, 0.0), message=steps_message(reduces * buffer, calls),
                steps=jnp.where(on, reduces * per * col.ring_steps(col.ALL_REDUCE, replicas), 0.0))


def grad_reduce_width(grad_bytes, grad_reduce_bytes):
    """Bytes a gradient element takes in the DP reduce: ``grad_reduce_bytes`` where a plan sets it
    (Plan.grad_reduce_bytes: XLA reduces the weight-gradient dot's 16-bit output, then converts the
    shard to the fp32 gradient MaxText keeps), else the gradient buffer's own width (``grad_bytes``:
    Megatron-LM reduces its fp32 buffer, FSDP and ZeRO their 16-bit gradients)."""
    return jnp.where(grad_reduce_bytes > 0, grad_reduce_bytes, grad_bytes)


def zero3_collectives(plan):
    """(gather, reduce-scatter) collectives a layer's ZeRO-3 sync takes: the plan's counts
    (``zero3_gather_calls``, ``zero3_reduce_calls``; stack data), 0 meaning one (the unit)."""
    return jnp.maximum(plan.zero3_gather_calls, 1.0), jnp.maximum(plan.zero3_reduce_calls, 1.0)


def steps_message(total, calls):
    return total / jnp.maximum(calls, 1.0)


def collective_names(sp: bool, zero: int) -> dict[str, str]:
    """The collective each dimension uses, for display (Python values, one plan)."""
    return {
        "tp": f"{col.REDUCE_SCATTER}+{col.ALL_GATHER}" if sp else col.ALL_REDUCE,
        "cp": f"{col.ALL_GATHER}+{col.REDUCE_SCATTER}",
        "ep": col.ALL_TO_ALL,
        "pp": col.SEND_RECV,
        "dp": col.ALL_REDUCE if zero == 0 else f"{col.REDUCE_SCATTER}+{col.ALL_GATHER}",
    }
