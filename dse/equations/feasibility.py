"""Feasibility as one table: each rule once, with its reason bit, its margin and its message.

A rule says when a plan cannot run (``violated``, exact, elementwise), how far a relaxed
plan is from the rule's bound (``margin``: a signed log-ratio, > 0 outside, smooth, what
co-design penalizes; ``None`` where the rule has no continuous bound and only the exact
check after snapping applies), and what to tell a user (``message``, ``short`` for a
heatmap cell, ``field`` the input that fixes it, ``detail`` the numbers of one plan).
``evaluate`` reports ``reason_bits``; co-design penalizes ``margins``; the CLI refuses a
structurally impossible plan with ``structural_error``. Adding a rule touches this table.
Bit k of ``Report.reasons`` is rule k: names and order are stable (sweep counts, files).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import numpy as np

from dse.backend import host_when_concrete, jnp
from dse.equations import schedule, topology
from dse.equations.degrees import expert_split
from dse.inputs.cluster import FP8_SCALING_NEEDED, FP8_SCALINGS

__all__ = ["Quantities", "Rule", "RULES", "REASONS", "REASON_BIT", "quantities", "reason_bits", "margins",
           "margin_names", "structural_error", "divides"]


def divides(n, k):
    """1 where k divides n exactly: floor(q) == q (cheaper than fmod on XLA:CPU)."""
    q = n / k
    return jnp.floor(q) == q


class Quantities(NamedTuple):
    """What the rules read: the plan's degrees, the model's sizes, memory and the torus check."""

    N: jax.Array      # accelerators
    t: jax.Array
    c: jax.Array
    e: jax.Array
    p: jax.Array
    v: jax.Array
    b: jax.Array
    B: jax.Array
    d: jax.Array      # N / (t c p), evaluate.derived
    m: jax.Array      # B / (d b)
    L: jax.Array
    a: jax.Array
    E: jax.Array
    s: jax.Array
    memory: jax.Array   # bytes per accelerator (Report.memory_bytes)
    hbm: jax.Array      # bytes of HBM per accelerator
    torus_invalid: jax.Array   # topology.network's check of the torus mapping
    split_invalid: jax.Array = False   # an uneven pipeline split that is not whole (schedule.split_valid)
    uneven: jax.Array = 0.0            # 1 where the plan sets an uneven split (schedule.stage_layers)
    host: jax.Array = 0.0              # bytes of host memory the plan's offload keeps on one node
    host_capacity: jax.Array = 0.0     # bytes of host memory per node (Cluster.node_host_bytes)
    fp8: jax.Array = 0.0               # the plan's FP8 recipe code (Plan.fp8)
    fp8_peak: jax.Array = 1.0          # FLOP/s of the accelerator's FP8 path (0: none)
    fp8_scaling: jax.Array = 3.0       # FP8 scalings its tensor cores run (Cluster.fp8_scaling)
    h: jax.Array = 0.0                 # hybrid sharding's shard group, DP ranks (Plan.dp_shard; 0: off)
    zero: jax.Array = 1.0              # ZeRO stage (Plan.zero)
    split_units: jax.Array = 0.0       # the embedding and loss where the pipeline split counts them as layers
    etp: jax.Array = 0.0               # 1: EP folded over TP x CP x DP, whole experts (Plan.etp)
    e_dp: jax.Array = 1.0              # the EP share carved from DP: e, folded e / (t c) (degrees.expert_split)
    fold_order: jax.Array = True       # TP, CP, EP the innermost dimensions of the rank order (topology.folds_inside)
    kv: jax.Array = 1.0                # key/value heads (query groups; = heads without GQA)


def quantities(model, cluster, plan, d, m, memory_bytes, torus_invalid, host=0.0, host_capacity=0.0) -> Quantities:
    f, mid, last, uneven = schedule.stage_layers(model.layers, plan.pp, plan.first_stage_layers,
                                                 plan.last_stage_layers, plan.embedding_in_split, plan.loss_in_split)
    bad_split = ~schedule.split_valid(model.layers, plan.pp, plan.vpp, f, mid, last)
    return Quantities(N=cluster.gpus, t=plan.tp, c=plan.cp, e=plan.ep, p=plan.pp, v=plan.vpp, b=plan.mbs,
                      B=plan.gbs, d=d, m=m, L=model.layers, a=model.heads, E=model.experts, s=model.seq,
                      memory=memory_bytes, hbm=cluster.hbm_bytes, torus_invalid=torus_invalid,
                      split_invalid=(uneven > 0) & bad_split, uneven=uneven, host=host, host_capacity=host_capacity,
                      fp8=plan.fp8, fp8_peak=cluster.peak_fp8_flops_per_s, fp8_scaling=cluster.fp8_scaling,
                      h=plan.dp_shard, zero=plan.zero, split_units=schedule.split_units(0.0, plan.embedding_in_split, plan.loss_in_split),
                      etp=plan.etp, e_dp=expert_split(plan)[0], fold_order=topology.folds_inside(plan.rank_order),
                      kv=model.kv_heads)


def fp8_scaling_needed(fp8):
    """The Cluster.fp8_scaling level a Plan.fp8 recipe needs (dse/inputs/cluster.py FP8_SCALING_NEEDED)."""
    out = jnp.zeros_like(fp8)
    for code, level in FP8_SCALING_NEEDED.items():
        out = jnp.where(fp8 == code, level, out)
    return out


def _fp8_unsupported(q):
    need = fp8_scaling_needed(q.fp8)
    return (need > 0) & ((q.fp8_peak <= 0) | (q.fp8_scaling < need))


def _fp8_detail(q) -> str:
    from dse.inputs.plan import FP8_NAMES

    have = 0.0 if _f(q.fp8_peak) <= 0 else _f(q.fp8_scaling)
    allowed = [n for code, n in FP8_NAMES.items() if FP8_SCALING_NEEDED[code] <= have]
    level = {v: k for k, v in FP8_SCALINGS.items()}.get(have, have)
    why = "no FP8 path (peak_fp8 = 0)" if _f(q.fp8_peak) <= 0 else f"its tensor cores run FP8 scalings up to {level} (fp8_scaling)"
    return f"{FP8_NAMES.get(_f(q.fp8), _f(q.fp8))!r} needs hardware this cluster lacks: {why}; allowed: {', '.join(allowed)}"


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    message: str
    short: str
    field: str
    violated: Callable[[Quantities], jax.Array]
    margin: Callable[[Quantities], jax.Array] | None
    detail: Callable[[Quantities], str] | None = None
    needs_model: bool = True     # reads the model's sizes (checked only where a model is given)


def _f(x) -> float:
    return float(np.asarray(x))


RULES: tuple[Rule, ...] = (
    # seed 000, notation: d = N/(t c p) must be whole
    Rule("gpus_not_divisible", "gpus is not a multiple of tp*cp*pp", "N % tcp", "gpus",
         lambda q: ~divides(q.N, q.t * q.c * q.p), lambda q: jnp.log(q.t * q.c * q.p / q.N),
         lambda q: f"{_f(q.N):g} is not a multiple of tp*cp*pp = {_f(q.t * q.c * q.p):g}; "
                   f"allowed: multiples of {_f(q.t * q.c * q.p):g}", needs_model=False),
    # EP is carved from DP: d' = d/e (seed 000, notation); folded (Plan.etp = 1), e / (t c) of it
    Rule("dp_not_divisible_by_ep", "dp is not a multiple of ep", "d % e", "ep",
         lambda q: ~divides(q.d, q.e_dp), lambda q: jnp.log(q.e_dp / q.d),
         lambda q: (f"dp = {_f(q.d):g} is not a multiple of ep / (tp*cp) = {_f(q.e_dp):g} (etp 1); allowed: ep with "
                    f"ep / (tp*cp) dividing dp" if _f(q.etp) >= 1 else
                    f"dp = {_f(q.d):g} is not a multiple of ep = {_f(q.e):g}; allowed: divisors of dp"), needs_model=False),
    # m = B/(d b) microbatches per pipeline must be whole (seed 000, notation)
    Rule("batch_not_divisible", "global batch is not a multiple of dp*mbs", "B % db", "gbs",
         lambda q: ~divides(q.B, q.d * q.b), lambda q: jnp.log(q.d * q.b / q.B),
         lambda q: f"{_f(q.B):g} is not a multiple of dp*mbs = {_f(q.d * q.b):g}; "
                   f"allowed: multiples of {_f(q.d * q.b):g}", needs_model=False),
    # Megatron splits attention by heads (Shoeybi et al. 2019, sec.3)
    Rule("heads_not_divisible_by_tp", "heads is not a multiple of tp", "a % t", "tp",
         lambda q: ~divides(q.a, q.t), lambda q: jnp.log(q.t / q.a),
         lambda q: f"{_f(q.t):g} does not divide heads = {_f(q.a):g}; allowed: divisors of heads"),
    Rule("experts_not_divisible_by_ep", "experts is not a multiple of ep (or ep > 1 on a dense model)", "E % e", "ep",
         lambda q: ~divides(q.E, q.e) | ((q.e > 1) & (q.E <= 1)), lambda q: jnp.log(q.e / jnp.maximum(q.E, 1.0)),
         lambda q: f"{_f(q.e):g} does not divide experts = {_f(q.E):g}; allowed: divisors of experts"),
    # the units a pipeline splits: the layers, and the embedding and the loss where the split counts them
    # (--account-for-embedding/loss-in-pipeline-split: Megatron-Core lets such a unit fill a chunk alone)
    Rule("layers_lt_stages", "fewer layers than pipeline stages (times interleave chunks)", "L < pv", "pp",
         lambda q: q.L + q.split_units < q.p * q.v, lambda q: jnp.log(q.p * q.v / (q.L + q.split_units)),
         lambda q: f"pp*vpp = {_f(q.p * q.v):g} is more than layers = {_f(q.L):g}"
                   + (f" + {_f(q.split_units):g} (embedding, loss)" if _f(q.split_units) else "")
                   + "; allowed: pp*vpp <= layers" + (" + those" if _f(q.split_units) else "")),
    # interleaving assigns L/(p v) layers to each model chunk (Narayanan et al. 2021, sec.2.2); an
    # uneven split (Megatron-Core first/last-stage layers, embedding/loss in the split) must be
    # whole stages whose middle stages split into v chunks (schedule.split_valid)
    Rule("layers_not_divisible_by_vpp", "layers is not a multiple of pp*vpp with interleaving (or an uneven "
         "pipeline split is not whole)", "L % pv", "vpp",
         lambda q: jnp.where(q.uneven > 0, q.split_invalid, (q.v > 1) & ~divides(q.L, q.p * q.v)), None,
         lambda q: f"pp*vpp = {_f(q.p * q.v):g} does not divide layers = {_f(q.L):g}; allowed: divisors of layers"),
    # CP splits the sequence into 2c chunks for causal load balance (seed 000, "Sequence and context parallelism")
    Rule("seq_not_divisible_by_cp", "sequence is not a multiple of 2*cp (causal load balance)", "s % 2c", "cp",
         lambda q: (q.c > 1) & ~divides(q.s, 2.0 * q.c), lambda q: jnp.log(2.0 * q.c / q.s),
         lambda q: f"2*cp = {_f(2 * q.c):g} does not divide the sequence {_f(q.s):g}; allowed: cp with 2*cp | seq"),
    Rule("out_of_memory", "memory per accelerator exceeds HBM", "OOM", "",
         lambda q: ~(q.memory <= q.hbm), lambda q: jnp.log(q.memory / q.hbm)),
    Rule("torus_mapping_invalid", "the torus does not hold gpus, or a group does not split onto whole axes/sub-axes",
         "torus map", "torus_order", lambda q: q.torus_invalid, None),
    # offload keeps state in host memory (ZeRO-Offload, ZeRO-Infinity): the node's ranks share its DRAM
    Rule("host_out_of_memory", "offloaded state exceeds the host memory of a node", "host OOM", "",
         lambda q: q.host > q.host_capacity,
         lambda q: jnp.log(jnp.maximum(q.host, 1.0) / jnp.maximum(q.host_capacity, 1.0))),
    # FP8 recipes need tensor cores that run their scaling (Transformer Engine support matrix;
    # dse/inputs/cluster.py FP8_SCALINGS): no FP8 on A100, no MXFP8 before Blackwell
    Rule("fp8_unsupported", "the FP8 recipe needs tensor-core support the accelerator lacks", "FP8 hw", "fp8",
         _fp8_unsupported, None, _fp8_detail, needs_model=False),
    # hybrid sharding (HSDP) splits the DP group into whole shard groups of sharded state (PyTorch FSDP
    # HYBRID_SHARD); with expert parallelism a shard group holds whole EP groups (torchtitan borrows EP
    # from the shard degree: its experts shard over s / ep ranks, dp_shard_mod_ep)
    Rule("dp_shard_invalid", "dp_shard does not divide dp, is not a multiple of ep, or runs without ZeRO >= 1",
         "HSDP", "dp_shard",
         lambda q: (q.h > 0) & (~divides(q.d, jnp.maximum(q.h, 1.0)) | (q.zero < 1)
                                | ~divides(jnp.maximum(q.h, 1.0), q.e)), None,
         lambda q: f"dp_shard = {_f(q.h):g} with dp = {_f(q.d):g}, zero = {_f(q.zero):g}, ep = {_f(q.e):g}; "
                   f"allowed: 0 (off), or a divisor of dp and a multiple of ep with zero >= 1", needs_model=False),
    # MoE parallel folding (Megatron-Core --expert-tensor-parallel-size 1; Liu et al. 2025, arXiv
    # 2504.14960): an EP group of e ranks spans whole TP x CP blocks, or lies inside one (e divides t c:
    # the Megatron-MoE-ModelZoo's EP 8 inside TP 4 x CP 4), one contiguous block of ranks (TP, CP and EP
    # the innermost dimensions of the rank order); not modelled with hybrid sharding
    Rule("etp_layout", "etp 1 needs ep a multiple or a divisor of tp*cp, tp/cp/ep innermost in the rank order and no dp_shard",
         "ETP", "etp",
         lambda q: (q.etp >= 1) & (q.e > 1) & (~(divides(q.e, q.t * q.c) | divides(q.t * q.c, q.e))
                                              | ~jnp.asarray(q.fold_order, bool) | (q.h > 0)),
         None,
         lambda q: f"etp 1 with ep = {_f(q.e):g}, tp*cp = {_f(q.t * q.c):g}, dp_shard = {_f(q.h):g}; allowed: ep a "
                   f"multiple or a divisor of tp*cp, tp, cp and ep the innermost dimensions of the rank order, dp_shard 0",
         needs_model=False),
    # GQA splits the key/value heads over TP as it splits the query heads: each rank holds whole query
    # groups (Megatron-Core's Attention: num_query_groups_per_partition = divide(num_query_groups, tp),
    # which asserts divisibility; Transformer Engine likewise), so TP beyond the KV heads cannot launch
    Rule("kv_heads_not_divisible_by_tp", "key/value heads (GQA query groups) is not a multiple of tp", "kv % t", "tp",
         lambda q: ~divides(q.kv, q.t), lambda q: jnp.log(q.t / q.kv),
         lambda q: f"{_f(q.t):g} does not divide the key/value heads = {_f(q.kv):g} (GQA query groups); "
                   f"allowed: divisors of the key/value heads"),
)
REASONS = tuple((r.name, r.message) for r in RULES)
REASON_BIT = {r.name: 1 << k for k, r in enumerate(RULES)}
_STRUCTURAL = tuple(r for r in RULES if r.detail is not None)


def reason_bits(q: Quantities) -> jax.Array:
    """Bit k set where rule k is violated (int32, the broadcast shape of the quantities)."""
    out = jnp.zeros(jnp.broadcast_shapes(*[jnp.shape(x) for x in q]), jnp.int32)
    for k, rule in enumerate(RULES):
        out = out | jnp.where(rule.violated(q), jnp.int32(1 << k), jnp.int32(0))
    return out


def margin_names() -> tuple[str, ...]:
    return tuple(r.name for r in RULES if r.margin is not None)


def margins(q: Quantities) -> jax.Array:
    """The rules' signed margins (> 0 infeasible), stacked on a last axis in ``margin_names`` order."""
    return jnp.stack(jnp.broadcast_arrays(*[r.margin(q) for r in RULES if r.margin is not None]), axis=-1)


@host_when_concrete   # one concrete plan: numpy, no eager XLA op where jax is imported
def structural_error(q: Quantities, model_known: bool = True) -> tuple[str, str] | None:
    """For one concrete plan: (field, one-line message) of the first violated structural rule
    (every rule but memory and the torus mapping), or None. The CLI refuses such a plan.
    ``model_known`` False skips the rules that read the model's sizes."""
    for rule in _STRUCTURAL:
        if (model_known or not rule.needs_model) and bool(np.asarray(rule.violated(q))):
            return rule.field, rule.detail(q)
    return None
