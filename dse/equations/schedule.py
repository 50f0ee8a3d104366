"""Pipeline schedule and overlap: the bubble, and what communication stays exposed."""

from __future__ import annotations

from dse.backend import jnp
from dse.equations import compute, steps


# Zero Bubble (Qi et al. 2024, sec.2): forward F, input-gradient backward and weight-gradient
# backward W take equal time, so W is 1/3 and the full backward B is 2/3 of F + B.
W_SHARE = 1.0 / 3.0
B_SHARE = 2.0 / 3.0


# The formula bubble_fraction evaluates for each schedule code (inputs.SCHEDULES), as a reader writes it.
BUBBLE_FORMULAS = {0: "(p-1)/(v m)", 1: "ZB1P (p-1)(1-2W)/m", 2: "DualPipe (p/2-1)(1+B-3W)/m"}


def bubble_fraction(p, m, v, schedule=0.0):
    """Pipeline bubble as a share of ideal compute m (F + B), per schedule.

    1F1B: (p-1)/m, interleaved (p-1)/(v m) (Narayanan sec.2.2). DeepSeek-V3 Table 2:
    ZB1P (p-1)(F+B-2W), DualPipe (p/2-1)(F&B + B - 3W) with F&B = F + B (the pair's
    communication, not its compute, is overlapped).
    """
    one_f_one_b = (p - 1.0) / (v * m)
    zb1p = (p - 1.0) * (1.0 - 2.0 * W_SHARE) / m
    dualpipe = steps.relu(p / 2.0 - 1.0) * (1.0 + B_SHARE - 3.0 * W_SHARE) / m
    return jnp.where(schedule >= 2, dualpipe, jnp.where(schedule >= 1, zb1p, one_f_one_b))


# ---------------------------------------------------------------- uneven pipeline splits

def split_units(layers, embedding=0.0, loss=0.0):
    """The units a pipeline split shares out: the layers, and one each for the embedding and the loss
    where the split counts them (Megatron-Core --account-for-embedding/loss-in-pipeline-split;
    arguments.py adds them before it checks pp and the layers per virtual stage)."""
    return layers + embedding + loss


def stage_layers(layers, p, first=0.0, last=0.0, embedding=0.0, loss=0.0):
    """(first, middle, last) stage transformer-layer counts of a pipeline split, and whether the
    split is uneven (1) or the even L/p (0).

    Megatron-Core: ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
    set the end stages (0: unset) and the other stages share the rest evenly;
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``
    count the embedding and the loss as one layer each, so (L + 1 + 1)/p units a stage
    with one layer fewer on the first and last stage (e.g. 126 layers on 16 stages:
    7 + 14 x 8 + 7).
    """
    f_set = jnp.where(first > 0, 1.0, 0.0)
    l_set = jnp.where(last > 0, 1.0, 0.0)
    explicit = (f_set + l_set) > 0
    rest = p - f_set - l_set
    mid_x = steps.safe_div(layers - f_set * first - l_set * last, rest)
    per = split_units(layers, embedding, loss) / p
    accounted = (embedding + loss) > 0
    even = layers / p
    mid = jnp.where(explicit, mid_x, jnp.where(accounted, per, even))
    f = jnp.where(explicit, jnp.where(f_set > 0, first, mid_x), jnp.where(accounted, per - embedding, even))
    lst = jnp.where(explicit, jnp.where(l_set > 0, last, mid_x), jnp.where(accounted, per - loss, even))
    single = p <= 1
    f, mid, lst = (jnp.where(single, layers, x) for x in (f, mid, lst))
    uneven = jnp.where((explicit | accounted) & (p > 1), 1.0, 0.0)
    return f, mid, lst, uneven


def concretely_even(first=0.0, last=0.0, embedding=0.0, loss=0.0) -> bool:
    """True when ``stage_layers``'s split is known, as the program is built, to be the even L/p (no
    end-stage layer counts, neither the embedding nor the loss counted in it): what only an uneven
    split selects (the middle stages' memory, the slowest stage's time) need not be traced."""
    return all(steps.never(x > 0) for x in (first, last, embedding, loss))


def split_valid(layers, p, v, f, mid, last):
    """1 where every stage holds a whole, non-negative number of layers summing to L, the
    middle stages splitting into v equal chunks when interleaved.

    The end stages may hold a count v does not divide: Megatron-Core's flexible layout
    (``--pipeline-model-parallel-layout``, MR 2795: "DeepSeek-v3 ... 61 layers", uneven
    virtual chunks) allows it, where the older --decoder-first/last-pipeline-num-layers
    with VPP required every stage's count divisible by v.
    """
    whole = lambda x: jnp.floor(x) == x   # noqa: E731
    middle = jnp.maximum(p - 2.0, 0.0)
    total = jnp.where(p <= 1, f, f + middle * mid + last)
    chunks = (v <= 1) | (p <= 2) | whole(mid / v)
    return whole(f) & whole(mid) & whole(last) & (f >= 0) & (mid >= 0) & (last >= 0) & (jnp.abs(total - layers) < 1e-9) & chunks


def slowest_stage_time(layers, p, f, mid, last, layers_s, logits_stage_s):
    """Compute time of the slowest stage: layers at ``layers_s`` / (L/p) each (``layers_s``: the
    even stage's L/p layers), the last stage also running the output layer and loss
    (``logits_stage_s``, Narayanan sec.5): max(f, mid, last) tau, last tau + logits."""
    tau = steps.safe_div(layers_s * p, layers)
    mid_s = jnp.where(p > 2, mid * tau, 0.0)
    return jnp.maximum(jnp.maximum(f * tau, mid_s), last * tau + logits_stage_s)


def exposed(wire_s, overlap):
    """Wire time not hidden: (1 - overlap) * wire (seed: TP, PP, EP, CP fully exposed)."""
    return (1.0 - overlap) * wire_s


def exposed_behind(wire_s, window_s, on, fallback_s, sharpness=None):
    """Where ``on``: communication that runs beside another microbatch's compute stays exposed
    only past that compute, max(0, wire - window); elsewhere ``fallback_s``.

    DualPipe (DeepSeek-V3 sec.3.2.1, Fig.4-5) pairs a forward chunk with a backward chunk
    and runs one's EP dispatch/combine and PP send/recv while the other computes, so both
    hide while the step's compute is longer; Megatron-Core's EP all-to-all overlap
    (``--overlap-moe-expert-parallel-comm``, merged forward-backward of two microbatches in
    1F1B) hides the all-to-all the same way.
    """
    return jnp.where(on, steps.relu(wire_s - window_s, sharpness), fallback_s)


def ring_attention_exposed(wire_s, hops, fwd, bwd, home, c, attn_fwd_s, blocks, sharpness=None):
    """Exposed time of ring attention's K/V exchange, step by step (TransformerEngine
    AttnFuncWithCPAndKVP2P: the send of step i+1's block overlaps step i's compute).

    ``blocks`` = layers x microbatches of a rank; each runs c steps a pass. Each forward
    pass (``fwd`` of them with recompute): step 0 works on the local block, so the c-1 hops
    each hide behind one step of a = ``attn_fwd_s`` / (blocks c) and leave max(0, x - a)
    exposed. Backward: ``bwd`` hop units a step (K/V and dK/dV: 2) behind a step of 2a (the
    core's backward is twice its forward), bwd max(0, x - 2a/bwd); the ``home`` hop of the
    accumulated dK/dV follows the last step and stays exposed. x = ``wire_s`` / ``hops``,
    one hop's time with its latency (traffic.cp). Ring attention (Liu et al. 2023, sec.3)
    hides the exchange only while a block's compute outlasts its transfer: the per-step
    compute shrinks as 1/c^2 and the transfer as 1/c.
    """
    x = steps.safe_div(wire_s, hops)
    a = steps.safe_div(attn_fwd_s, blocks * c)
    n = blocks * (c - 1.0)               # hops a pass; relu of step-level seconds (smooth mode)
    exposed_s = (steps.relu(n * fwd * (x - a), sharpness)
                 + steps.relu(n * bwd * (x - steps.safe_div(2.0 * a, bwd)), sharpness) + blocks * home * x)
    return jnp.where(c > 1, exposed_s, 0.0)


def hide_window(compute_s, overlap, enabled=1.0):
    """Compute a collective can hide behind: 2/3 of it for DP, the backward pass (seed 000 sec.6);
    none when the overlap is switched off (``enabled`` = 0, Megatron's --overlap-grad-reduce)."""
    return enabled * overlap * compute_s


def exposed_dp(wire_s, compute_s, dp_overlap, sharpness=None, enabled=1.0):
    """max(0, t_DP - 2/3 compute): DP hides behind the backward pass (seed 000 sec.6)."""
    return steps.relu(wire_s - hide_window(compute_s, dp_overlap, enabled), sharpness)


def exposed_zero3(wire_fwd_s, wire_s, compute_fwd_s, compute_s, dp_overlap, sharpness=None, enabled=1.0):
    """ZeRO-3 with forward prefetch: the forward's weight gathers (``wire_fwd_s`` of ``wire_s``) hide
    behind the forward pass, the rest (backward gathers, gradient reduce-scatters) behind the backward.

    FSDP prefetches the next unit's all-gather in forward as in backward (Zhao et al. 2023 sec.3.4,
    forward and backward prefetching; DeepSpeed ZeRO-3 likewise, within its prefetch buffer), so
    a third of a ZeRO-3 step's DP traffic runs while the forward computes, which ``exposed_dp``'s
    one window (seed 000 sec.6: DP hides behind the backward, 2/3 of compute) leaves to compete
    with the backward's traffic. The backward window is ``exposed_dp``'s, ``dp_overlap`` x compute;
    the forward's is the same share of its own pass: dp_overlap / (1 - FWD_SHARE) x ``compute_fwd_s``.
    Less exposed than ``exposed_dp`` of the same traffic, except where the forward's gathers outgrow
    the forward pass while the backward has room: they cannot wait for it.
    """
    share = steps.safe_div(dp_overlap, 1.0 - compute.FWD_SHARE)
    fwd = steps.relu(wire_fwd_s - enabled * share * compute_fwd_s, sharpness)
    return fwd + exposed_dp(wire_s - wire_fwd_s, compute_s, dp_overlap, sharpness, enabled)



def unprefetched(wire_s, calls, first_calls):
    """ZeRO-3/FSDP: the first unit's weight gather of each microbatch has nothing to hide
    behind (FSDP, Zhao et al. 2023 sec.3.4: prefetching overlaps the *next* unit's gather):
    ``first_calls`` calls of the average call time stay exposed."""
    return steps.safe_div(wire_s, calls) * first_calls


def unprefetched_gather(wire_s, gather_share, unit_params, prefetch_params):
    """ZeRO-3 weight all-gathers a fixed prefetch buffer cannot start ahead of use: exposed.

    DeepSpeed ZeRO-3 gathers a unit's weights ahead of its compute only into a fixed
    prefetch buffer of ``prefetch_params`` elements (config docs, zero_optimization
    .stage3_prefetch_bucket_size: "the size of the fixed buffer for prefetching parameters.
    Smaller values use less memory, but can increase stalls due to communication"); the rest
    of a ``unit_params`` unit is gathered when the unit runs and the compute waits for it.
    FSDP prefetches the whole next unit (``prefetch_params`` = 0; Zhao et al. 2023 sec.3.4,
    forward and backward prefetch). ``gather_share``: the gathers' share of the DP wire time
    ``wire_s``. Returns (exposed seconds, the wire time left to hide behind compute, the gathers'
    share of that left part: what ``exposed_zero3`` splits between forward and backward).
    """
    ahead = jnp.where(prefetch_params > 0, jnp.clip(steps.safe_div(prefetch_params, unit_params), 0.0, 1.0), 1.0)
    gathers = wire_s * gather_share
    waited = gathers * (1.0 - ahead)
    return waited, wire_s - waited, gathers * ahead
